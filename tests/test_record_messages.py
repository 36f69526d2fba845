"""One engine reads every record from a file (toolkit/model/reading.py), so every kind of record says every kind
of mistake in the same words: an unknown key (with "did you mean"), a wrong type, a missing key, a word outside
its vocabulary, a broken rule, each naming the file, the table the user named and the key, with the fix in the
hint. One row per kind of record per kind of mistake, read through each record's own public reader."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.profiles import MINIMAL_PROFILE
from toolkit.devices.inventory import load_inventory
from toolkit.errors import UsageError
from toolkit.model.manifest import read_manifest
from toolkit.model.profile_files import ENV_VAR
from toolkit.model.reading import read_file
from toolkit.model.runconfig import read_run_config
from toolkit.model.schemas.dataset import DOCS as DATASET_DOCS
from toolkit.model.schemas.dataset import Dataset
from toolkit.model.targets import load_profiles

# the minimal profile on ONNX Runtime, with its ONNX-only keys
PROFILE = (MINIMAL_PROFILE.replace('name = "litert"', 'name = "onnxruntime"')
           .replace('format = "tflite"', 'format = "onnx"')
           .replace("threads = 2", 'threads = 2\nmax_onnx_opset = 17\nexecution_providers = ["CPUExecutionProvider"]'))
INVENTORY = '[devices.pi-1]\nhost = "10.0.0.2"\nport = 22\n'


def profile(tmp: Path, text: str) -> None:
    (tmp / "board.toml").write_text(text)
    load_profiles(targets_dirs=[tmp])


def inventory(tmp: Path, text: str) -> None:
    (tmp / "inv.toml").write_text(text)
    load_inventory(tmp / "inv.toml")


def run_config(tmp: Path, text: str) -> None:
    (tmp / "run.toml").write_text(text)
    read_run_config(tmp / "run.toml")


def dataset(tmp: Path, text: str) -> None:
    read_file(Dataset, tomllib.loads(text), file=tmp / "dataset.toml", docs=DATASET_DOCS)


def manifest(tmp: Path, text: str) -> None:
    read_manifest(json.loads(text), where=str(tmp / "manifest.json"))


Reader = Callable[[Path, str], None]

# (record, mistake, reader, the file's text, what the message must say in order, what the hint must say)
ROWS: list[tuple[str, str, Reader, str, list[str], list[str]]] = [
    ("profile", "unknown key", profile, PROFILE.replace("threads", "thread"),
     ["board.toml: ", "unknown top-level key 'thread' (did you mean 'threads'?)."], ["Rename or remove it", "threads"]),
    ("profile", "unknown key in a table", profile, PROFILE.replace('model = "Cortex', 'modle = "Cortex'),
     ["board.toml: ", "unknown key 'cpu.modle' (did you mean 'model'?)."], ["the keys this table takes are"]),
    ("profile", "wrong type", profile, PROFILE.replace("memory_mb = 1024", 'memory_mb = "1024"'),
     ["board.toml: ", "the key 'memory_mb' must be an integer, got a string ('1024')."], ["Write memory_mb as"]),
    ("profile", "missing key", profile, PROFILE.replace('os = "Debian 12"\n', ""),
     ["board.toml: ", "the key 'os' is missing."], ["Add os = ..."]),
    ("profile", "word", profile, PROFILE.replace('arch = "aarch64"', 'arch = "aarch46"'),
     ["board.toml: ", "key 'arch': unknown arch 'aarch46' (did you mean 'aarch64'?)."], ["Use one of: "]),
    ("profile", "rule", profile, PROFILE.replace("cores = 2", "cores = 0"),
     ["board.toml: ", "key 'cpu.cores': must be at least 1 (got 0)."], ["Use the number of CPU cores."]),
    ("profile", "named table", profile,
     PROFILE + "\n[provider_options.CPUExecutionProvider]\narena = {a = 1}\n",
     ["board.toml: [provider_options.CPUExecutionProvider]: ", "key 'arena': must be a string, number or boolean."],
     ["scalars"]),
    ("inventory", "unknown key", inventory, INVENTORY.replace("host", "hots"),
     ["inv.toml: [devices.pi-1]: ", "unknown key 'hots' (did you mean 'host'?)."], ["Rename or remove it"]),
    ("inventory", "wrong type", inventory, INVENTORY + 'groups = "lab"\n',
     ["inv.toml: [devices.pi-1]: ", "the key 'groups' must be a list of strings, got a string ('lab')."],
     ["Write groups as"]),
    ("inventory", "missing key", inventory, INVENTORY.replace('host = "10.0.0.2"\n', ""),
     ["inv.toml: [devices.pi-1]: ", "the key 'host' is missing."], ["Add host = ..."]),
    ("inventory", "rule", inventory, INVENTORY.replace("port = 22", "port = 70000"),
     ["inv.toml: [devices.pi-1]: ", "key 'port': the port must be between 1 and 65535, got 70000."], []),
    ("run config", "rule", run_config, 'target = "x"\n[budget]\nms = 3\n',
     ["run.toml: ", "key 'budget': a table is not a run option."], ["flag-name = value"]),
    ("dataset", "unknown key", dataset, 'layuot = "NCHW"\n',
     ["dataset.toml: ", "unknown top-level key 'layuot' (did you mean 'layout'?)."], ["Rename or remove it"]),
    ("dataset", "wrong type", dataset, 'scale = "1/255"\n',
     ["dataset.toml: ", "the key 'scale' must be a number, got a string ('1/255')."], ["Write scale as"]),
    ("dataset", "missing key", dataset, '[outputs.logits]\nblank = 0\n',
     ["dataset.toml: [outputs.logits]: ", "the key 'task' is missing."], ["Add task = ..."]),
    ("dataset", "word", dataset, '[outputs.logits]\ntask = "clasification"\n',
     ["dataset.toml: [outputs.logits]: ", "key 'task': unknown task 'clasification' (did you mean"], ["Use one of: "]),
    ("dataset", "rule", dataset, "size = [224, 0]\n",
     ["dataset.toml: ", "key 'size': a size must be positive (got 0)."], ["size = [height, width]"]),
    ("manifest", "unknown key", manifest, '{"labls": []}',
     ["manifest.json: ", "unknown top-level key 'labls' (did you mean 'labels'?)."], ["Rename or remove it"]),
    ("manifest", "wrong type", manifest, '{"name": 3}',
     ["manifest.json: ", "the key 'name' must be a string, got an integer (3)."], ["Write name as"]),
    ("manifest", "missing key", manifest, '{}',
     ["manifest.json: ", "the key 'name' is missing."], ["edgetk convert"]),
    ("manifest", "word", manifest, '{"check_policy": {"latency_budget_ms": 5, "placement": [{"format": "tflit", '
     '"on": "xnnpack"}]}}',
     ["manifest.json: ", "key 'check_policy.placement[0].format': unknown format 'tflit' (did you mean 'tflite'?)."],
     ["Use one of: "]),
    ("manifest", "rule", manifest, '{"check_policy": {"latency_budget_ms": -1}}',
     ["manifest.json: ", "key 'check_policy.latency_budget_ms': must be above 0 (got -1.0)."], ["milliseconds"]),
]


@pytest.mark.parametrize("record, mistake, reader, text, message, hint", ROWS,
                         ids=[f"{r[0]}-{r[1]}".replace(" ", "-") for r in ROWS])
def test_every_record_says_every_mistake_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: str,
                                               mistake: str, reader: Reader, text: str, message: list[str],
                                               hint: list[str]) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(UsageError) as caught:
        reader(tmp_path, text)
    said = caught.value.message
    assert said.startswith(str(tmp_path / "")), said  # the file first
    at = 0
    for part in message:  # in this order: the file, the table the user named, then the key and the mistake
        found = said.find(part, at)
        assert found >= 0, (part, said)
        at = found + len(part)
    for part in hint:
        assert part in (caught.value.hint or ""), (part, caught.value.hint)


def test_the_table_covers_every_mistake_of_the_engine() -> None:
    """Each kind of mistake the engine words has a row, and each kind of record too."""
    assert {r[1] for r in ROWS} >= {"unknown key", "wrong type", "missing key", "word", "rule", "named table"}
    assert {r[0] for r in ROWS} == {"profile", "inventory", "run config", "dataset", "manifest"}

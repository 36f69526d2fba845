"""The manifest's schema (its records in toolkit/model/, read by toolkit/model/reading.py): one malformed ``manifest.json`` per kind of mistake
(an unknown key, a wrong type, a missing key, a word outside a vocabulary), each refused with one message that
names the file and the key, and says what to do; a valid one reads back equal to what was written."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cli import assert_clean_error, run_edgetk_inproc
from tests.fixtures.deploy import build_bundle
from toolkit.delivery.bundle import read_bundle
from toolkit.errors import UsageError
from toolkit.model.manifest import read_manifest
from toolkit.model.manifest import MANIFEST_SCHEMA_VERSION


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("schema") / "b", name="schema", target="generic-x86_64",
                        target_arch="x86_64")


@pytest.fixture(scope="module")
def manifest(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "manifest.json").read_text())


def _set(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for part in path[:-1]:
            data = data[part]
        data[path[-1]] = value
    return edit


def _drop(*path: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for part in path[:-1]:
            data = data[part]
        del data[path[-1]]
    return edit


# (what is wrong, the edit, what the message must say, what the hint must say)
MISTAKES = [
    ("unknown-key", _set("artifacts", 0, "byts", value=3), ["'artifacts[0].byts'", "did you mean 'bytes'"],
     ["rename or remove it", "edgetk convert"]),
    ("unknown-top-level-key", _set("labls", value=["a"]), ["'labls'", "did you mean 'labels'"], ["rename"]),
    ("wrong-type", _set("artifacts", 0, "bytes", value="3"),
     ["'artifacts[0].bytes'", "must be an integer", "string"], ["write bytes as an integer"]),
    ("wrong-type-nested", _set("artifacts", 0, "inputs", 0, "shape", value=[1, "x"]),
     ["'artifacts[0].inputs[0].shape'", "list of integers"], ["edgetk convert"]),
    ("missing-key", _drop("artifacts", 0, "sha256"), ["'artifacts[0].sha256'", "is missing"],
     ["edgetk convert", "docs/schemas/convert.md"]),
    ("unknown-word", _set("artifacts", 0, "precision", value="int9"),
     ["'artifacts[0].precision'", "'int9'", "did you mean 'int8'"], ["fp32, fp16"]),
]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_malformed_manifest_names_the_file_the_key_and_the_fix(manifest: dict[str, Any],
                                                                 mistake: Any) -> None:
    _, edit, in_message, in_hint = mistake
    data = copy.deepcopy(manifest)
    edit(data)
    with pytest.raises(UsageError) as caught:
        read_manifest(data, where="b/manifest.json")
    message, hint = caught.value.message, (caught.value.hint or "")
    assert message.startswith("b/manifest.json: "), message
    for needle in in_message:
        assert needle.lower() in message.lower(), (needle, message)
    for needle in in_hint:
        assert needle.lower() in hint.lower(), (needle, hint)


def test_a_newer_schema_version_is_refused_before_its_keys(manifest: dict[str, Any]) -> None:
    newer = MANIFEST_SCHEMA_VERSION + 1
    data = {**copy.deepcopy(manifest), "schema_version": newer, "a_key_from_the_future": 1}
    with pytest.raises(UsageError) as caught:
        read_manifest(data)
    assert f"schema_version {newer} is newer" in caught.value.message
    assert "Upgrade edge-toolkit" in (caught.value.hint or "")


def test_a_version_1_manifest_still_reads(manifest: dict[str, Any]) -> None:
    """Version 2 only added optional keys (attempts[].workaround, artifacts[].float_io, artifacts[].batching):
    a bundle written before them reads as it was."""
    data = copy.deepcopy(manifest)
    data["schema_version"] = 1
    for attempt in data.get("attempts") or []:
        attempt.pop("workaround", None)
    for artifact in data["artifacts"]:
        artifact.pop("float_io", None)
        artifact.pop("batching", None)
    read = read_manifest(data)
    assert read.schema_version == 1 and len(read.artifacts) == len(data["artifacts"])


def test_a_valid_manifest_reads_back_as_written(bundle: Path) -> None:
    manifest = read_bundle(bundle).manifest
    assert read_manifest(json.loads(json.dumps(manifest.to_dict()))) == manifest


def test_the_cli_refuses_an_unknown_key_in_one_plain_message(bundle: Path, tmp_path: Path) -> None:
    import shutil

    copy_of = tmp_path / "b"
    shutil.copytree(bundle, copy_of)
    data = json.loads((copy_of / "manifest.json").read_text())
    data["artifacts"][0]["preffered"] = True
    (copy_of / "manifest.json").write_text(json.dumps(data))
    result = run_edgetk_inproc("inspect", copy_of)
    assert_clean_error(result, 2, "manifest.json", "'artifacts[0].preffered'", "did you mean 'preferred'")

"""Bad input, everywhere, through the real CLI: every case gets its exit code, one or two plain lines that name
the problem (and the fix), no traceback, and leaves nothing behind (the workspace is snapshotted before and
compared after: no new, changed or half-written file anywhere).

Every case runs through the CLI's entry point in this process (``run_edgetk_inproc``: the frameworks are
imported once, not once per case); the first case of each command also runs as a real ``edgetk`` process, for
what only a process shows (the exit status, nothing the interpreter or a native library prints on stderr)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.cli import CliResult, assert_clean_error, run_edgetk, run_edgetk_inproc
from tests.fixtures.deploy import _tiny_onnx, build_bundle
from tests.fixtures.home import Home


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    code: int
    needles: tuple[str, ...]


def C(id: str, args: str, code: int, *needles: str) -> Case:  # a table row
    return Case(id, tuple(args.split("|")), code, needles)


# {w} is the workspace. Arguments are separated by '|' so paths and values may hold spaces.
CASES = [
    # ---- convert: sources
    C("convert-missing-source", "convert|{w}/nope.onnx", 2, "nope.onnx", "does not exist"),
    C("convert-garbage-onnx", "convert|{w}/garbage.onnx", 2, "garbage.onnx"),
    C("convert-unknown-kind", "convert|{w}/notes.txt", 2, "notes.txt"),
    C("convert-empty-dir", "convert|{w}/empty", 2, "empty"),
    C("convert-factory-missing-fn", "convert|{w}/factory.py:make_model", 2, "make_model"),
    # ---- convert: options
    C("convert-bad-precision", "convert|{w}/model.onnx|--precision|fp8", 2, "fp8"),
    C("convert-bad-format", "convert|{w}/model.onnx|--format|pdf", 2, "pdf"),
    C("convert-input-shape-garbage", "convert|{w}/model.onnx|--input-shape|x=a,b", 2, "--input-shape", "image=1,224"),
    C("convert-input-shape-negative", "convert|{w}/model.onnx|--input-shape|x=1,-16", 2, "--input-shape"),
    C("convert-input-shape-unknown-name", "convert|{w}/model.onnx|--input-shape|nope=1,16", 2, "nope"),
    C("convert-unknown-target", "convert|{w}/model.onnx|--target|raspbery-pi-4", 2, "raspbery-pi-4", "raspberry-pi-4"),
    C("convert-bad-name", "convert|{w}/model.onnx|--name|../evil", 2, "../evil"),
    C("convert-out-exists", "convert|{w}/model.onnx|--out|{w}/existing", 2, "already exists", "--force"),
    C("convert-threads-zero", "convert|{w}/model.onnx|--threads|0", 2, "threads"),
    C("convert-samples-zero", "convert|{w}/model.onnx|--calibration-samples|0", 2, "calibration-samples"),
    # ---- convert: calibration and eval data
    C("calib-missing", "convert|{w}/model.onnx|--precision|int8|--calibration|{w}/nope.npz", 2, "nope.npz"),
    C("calib-not-npz", "convert|{w}/model.onnx|--precision|int8|--calibration|{w}/garbage.npz", 2, "garbage.npz"),
    C("calib-wrong-shape", "convert|{w}/model.onnx|--precision|int8|--calibration|{w}/wrong_shape.npz", 2, "shape"),
    C("calib-wrong-key", "convert|{w}/model.onnx|--precision|int8|--calibration|{w}/wrong_key.npz", 2, "nope"),
    C("calib-bad-dataset-toml", "convert|{w}/model.onnx|--precision|int8|--calibration|{w}/images_bad_toml", 2,
      "dataset.toml", "TOML"),
    C("calib-dataset-unknown-key", "convert|{w}/model.onnx|--precision|int8|--calibration|{w}/images_typo", 2,
      "layot", "layout"),
    C("calib-folder-no-toml", "convert|{w}/model.onnx|--precision|int8|--calibration|{w}/empty", 2, "dataset.toml"),
    C("eval-missing", "convert|{w}/model.onnx|--eval-data|{w}/nope_eval.npz", 2, "nope_eval.npz"),
    # ---- inspect
    C("inspect-missing", "inspect|{w}/nope.tflite", 2, "nope.tflite"),
    C("inspect-garbage-tflite", "inspect|{w}/garbage.tflite", 2, "garbage.tflite"),
    C("inspect-bundle-bad-json", "inspect|{w}/bundle_bad_json", 2, "manifest.json", "JSON"),
    # ---- targets
    C("targets-unknown", "targets|show|jetson-nanoo", 2, "jetson-nanoo", "jetson-nano"),
    C("targets-bad-profile-toml", "targets|list|--targets-dir|{w}/targets_bad", 2, "broken.toml"),
    C("targets-profile-unknown-key", "targets|list|--targets-dir|{w}/targets_typo", 2, "latency_budget_mss"),
    # ---- deploy / check and friends: bundles
    C("deploy-no-manifest", "deploy|{w}/empty|--device|local", 2, "not a bundle directory"),
    C("deploy-bundle-bad-json", "deploy|{w}/bundle_bad_json|--device|local", 2, "not valid JSON"),
    C("deploy-bundle-tampered", "deploy|{w}/bundle_tampered|--device|local", 2, "does not match its sha256", "rebuild"),
    C("deploy-bundle-manifest-missing-key", "deploy|{w}/bundle_no_artifacts|--device|local", 2, "artifacts"),
    # ---- device specs and inventories
    C("deploy-no-device", "deploy|{w}/bundle", 2, "No device given", "--device"),
    C("deploy-bad-spec", "deploy|{w}/bundle|--device|pi@@host", 2, "not a device spec"),
    C("deploy-bad-port", "deploy|{w}/bundle|--device|pi@host:99999", 2, "port"),
    C("deploy-inventory-missing", "deploy|{w}/bundle|--inventory|{w}/nope.toml", 2, "nope.toml", "does not exist"),
    C("deploy-inventory-bad-toml", "deploy|{w}/bundle|--inventory|{w}/inv_bad.toml", 2, "not valid TOML"),
    C("deploy-inventory-typo", "deploy|{w}/bundle|--inventory|{w}/inv_typo.toml", 2, "hots", "Did you mean 'host'"),
    C("deploy-inventory-no-host", "deploy|{w}/bundle|--inventory|{w}/inv_nohost.toml", 2, "'host' is missing"),
    C("deploy-inventory-port-type", "deploy|{w}/bundle|--inventory|{w}/inv_port.toml", 2, "port"),
    C("deploy-unknown-group", "deploy|{w}/bundle|--inventory|{w}/inv_ok.toml|--group|labb", 2, "labb", "lab"),
    C("deploy-group-without-inventory", "deploy|{w}/bundle|--device|local|--group|lab", 2, "--group needs --inventory"),
    # ---- flags
    C("deploy-parallel-zero", "deploy|{w}/bundle|--device|local|--parallel|0", 2, "parallel"),
    C("check-runs-zero", "check|{w}/bundle|--device|local|--runs|0", 2, "runs"),
    C("check-budget-negative", "check|{w}/bundle|--device|local|--budget-ms|-5", 2, "budget"),
    C("check-unknown-baseline", "check|{w}/bundle|--device|local|--baseline|no-such-check", 2, "no-such-check"),
    C("check-not-installed", "check|{w}/bundle|--device|local|--baseline|none", 2, "not installed", "deploy"),
    C("rollback-hostile-name", "rollback|../x|--device|local", 2, "../x"),
    C("remove-not-installed", "remove|ghost|--device|local", 2, "ghost", "not installed"),
    C("history-bad-store", "history|--store|{w}/garbage.npz", 2, "garbage.npz"),
    C("probe-bad-spec", "devices|probe|--device|a b", 2, "not a device spec"),
    C("unknown-command", "deplyo", 2, "deplyo"),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    w = tmp_path_factory.mktemp("bad input")  # a space in the path, on purpose
    _tiny_onnx(w / "model.onnx")
    (w / "garbage.onnx").write_bytes(b"\x08\x07not a model" * 50)
    (w / "garbage.tflite").write_bytes(b"TFL3" + os.urandom(300))
    (w / "garbage.npz").write_bytes(b"PK\x03\x04 not a zip")
    (w / "notes.txt").write_text("hello\n")
    (w / "empty").mkdir()
    (w / "existing").mkdir()
    (w / "factory.py").write_text("def other():\n    return None\n")
    np.savez(w / "wrong_shape.npz", x=np.zeros((8, 3, 3), np.float32))
    np.savez(w / "wrong_key.npz", nope=np.zeros((8, 1, 16), np.float32), other=np.zeros((8, 1, 16), np.float32))
    for name, toml in (("images_bad_toml", "layout = [unclosed\n"), ("images_typo", 'layot = "NHWC"\n')):
        folder = w / name
        folder.mkdir()
        (folder / "dataset.toml").write_text(toml)
        (folder / "000.png").write_bytes((Path(__file__).resolve().parents[2] / "calibration" / "digits-images" /
                                          "000.png").read_bytes())
    for name, text in (("targets_bad", "name = [\n"), ("targets_typo", None)):
        folder = w / name
        folder.mkdir()
        if text is None:
            shipped = Path(__file__).resolve().parents[2] / "targets" / "generic-x86_64.toml"
            text = shipped.read_text().replace("latency_budget_ms", "latency_budget_mss", 1)
            if "latency_budget_mss" not in text:
                text += "\nlatency_budget_mss = 5\n"
            text = text.replace('name = "generic-x86_64"', 'name = "typo-profile"')
            (folder / "typo-profile.toml").write_text(text)
        else:
            (folder / "broken.toml").write_text(text)
    build_bundle(w / "bundle", name="good")
    build_bundle(w / "bundle_bad_json", name="badjson")
    (w / "bundle_bad_json" / "manifest.json").write_text("{ not json")
    build_bundle(w / "bundle_tampered", name="tampered")
    data = bytearray((w / "bundle_tampered" / "model.fp32.onnx").read_bytes())
    data[-1] ^= 0xFF
    (w / "bundle_tampered" / "model.fp32.onnx").write_bytes(bytes(data))
    build_bundle(w / "bundle_no_artifacts", name="noart")
    manifest = json.loads((w / "bundle_no_artifacts" / "manifest.json").read_text())
    del manifest["artifacts"]
    (w / "bundle_no_artifacts" / "manifest.json").write_text(json.dumps(manifest))
    (w / "inv_bad.toml").write_text("[devices.pi\nhost = 1\n")
    (w / "inv_typo.toml").write_text('[devices.pi]\nhots = "10.0.0.1"\n')
    (w / "inv_nohost.toml").write_text('[devices.pi]\nuser = "pi"\n')
    (w / "inv_port.toml").write_text('[devices.pi]\nhost = "10.0.0.1"\nport = "ssh"\n')
    (w / "inv_ok.toml").write_text('[devices.pi]\nhost = "local"\ngroups = ["lab"]\n')
    return w


def _snapshot(root: Path) -> dict[str, tuple[int, float]]:
    out = {}
    for path in root.rglob("*"):
        if path.relative_to(root).parts[0] in ("home", "cwd"):
            continue
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime)
    return out


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 30
    commands = {c.args[0] for c in CASES}
    assert {"convert", "inspect", "targets", "deploy", "check", "rollback", "remove", "history", "devices"} <= commands
    assert {c.args[0] for c in IN_A_PROCESS} == commands and len(IN_A_PROCESS) == len(commands)


# the first case of each command (and of a mistyped one): run again as a real process
IN_A_PROCESS = [c for i, c in enumerate(CASES) if c.args[0] not in {d.args[0] for d in CASES[:i]}]


def _check(case: Case, workspace: Path, edgetk: Callable[..., CliResult]) -> None:
    home = workspace / "home"
    home.mkdir(exist_ok=True)
    cwd = workspace / "cwd"
    cwd.mkdir(exist_ok=True)
    before = _snapshot(workspace)
    args = [a.replace("{w}", str(workspace)) for a in case.args]
    result = edgetk(*args, cwd=cwd, env=Home(home).env, timeout=300)
    assert_clean_error(result, case.code, *case.needles)
    # one or two lines (click's own usage errors add "Usage:" and "Try ... -h" lines around theirs)
    # (progress lines such as "loading X (onnx)" may come before the error; they are not the message)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith(("Usage:", "Try '"))]
    start = next(i for i, ln in enumerate(lines) if ln.lower().startswith("error"))
    assert 1 <= len(lines) - start <= 2, result.stderr
    assert result.stdout.strip() == "" or case.args[0] in ("deploy", "check", "rollback", "remove"), result.stdout
    after = _snapshot(workspace)
    assert after == before, sorted(set(after.items()) ^ set(before.items()))
    assert not list(cwd.iterdir())
    assert not list(workspace.rglob("*.partial"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, workspace: Path) -> None:
    _check(case, workspace, run_edgetk_inproc)


@pytest.mark.parametrize("case", IN_A_PROCESS, ids=[c.id for c in IN_A_PROCESS])
def test_bad_input_in_a_process(case: Case, workspace: Path) -> None:
    _check(case, workspace, run_edgetk)

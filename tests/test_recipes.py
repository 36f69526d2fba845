"""Every recipe of every shipped profile, built on the digits CNN with the real converters and verified in the
real runtimes; the tflite-runtime 2.14 bound proven in a real tflite-runtime 2.14 venv; Edge TPU and Jetson paths.

Each DISTINCT recipe is built once: recipes that many profiles share (the Pi 4, Pi 5 and generic-aarch64 int8
TFLite) are grouped, and every bundle converts through one shared ``workdir`` so that a file already built for
the same source, data and recipe is reused (verification always runs again).

Not run here, because the hardware does not exist on this host:
- no Edge TPU: a compiled ``*_edgetpu.tflite`` is never executed; and the real ``edgetpu_compiler`` is not
  installed (it is not in the registries reachable here). The compile path is exercised with a STAND-IN script
  (below) that only copies the file and writes a log; the install hint is tested separately and is not counted
  as coverage of compiling.
- no GPU: the Jetson FP16 ONNX artifacts are verified on CPUExecutionProvider only; TensorRT and CUDA were not
  run. What is tested is the artifact, the manifest (providers, provider options) and the runner's provider
  selection logic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.pte import PTE_PROFILES, needs_executorch
from tests.fixtures.runner_output import report_doc
from toolkit.delivery.bundle import read_bundle
from toolkit.runtimes.compat import tflite_incompatibilities
from toolkit.conversion.onnx.from_tf import DEFAULT_OPSET
from toolkit.errors import ConversionError
from toolkit.runtimes.inspection import inspect_model
from toolkit.conversion.pipeline import ConvertOptions, ConvertResult, convert_bundle
from toolkit.model.targets import TargetProfile, load_profiles
from toolkit.model.recipe import Recipe

SHIPPED = {
    "raspberry-pi-3b", "raspberry-pi-4", "raspberry-pi-5", "raspberry-pi-zero-2w", "jetson-nano",
    "jetson-orin-nano", "coral-usb", "coral-dev-board", "generic-aarch64", "generic-x86_64",
}
PROFILES = load_profiles()


def _bounded_tflite(profile: TargetProfile) -> bool:
    return any(r.name == "tflite-runtime" and r.max_version for r in profile.runtimes)


def _expected_opset(profile: TargetProfile, recipe: Recipe) -> int:
    opset = recipe.opset or DEFAULT_OPSET
    return min(opset, profile.max_onnx_opset) if profile.max_onnx_opset else opset


def _key(profile: TargetProfile, recipe: Recipe) -> str:
    """What decides the built file and its checks: the recipe, the opset, a bounded tflite-runtime, Edge TPU."""
    extra = (_expected_opset(profile, recipe) if recipe.format == "onnx"
             else (_bounded_tflite(profile), profile.edgetpu and recipe.precision == "int8"))
    return json.dumps([recipe.to_dict(), extra], sort_keys=True)


def _groups() -> list[tuple[str, tuple[Recipe, ...], tuple[str, ...]]]:
    """(base profile, recipes to build in one bundle: at most one per format, profiles sharing them)."""
    sharing: dict[str, list[str]] = {}
    for profile in PROFILES.values():
        for recipe in profile.recipes:
            sharing.setdefault(_key(profile, recipe), []).append(profile.name)
    seen: set[str] = set()
    groups = []
    for profile in PROFILES.values():
        pending: dict[str, list[Recipe]] = {"tflite": [], "onnx": []}
        for recipe in profile.recipes:
            if recipe.format == "pte":  # PyTorch sources only: test_pte_recipes_are_built_from_a_torch_model
                continue
            key = _key(profile, recipe)
            if key not in seen:
                seen.add(key)
                pending[recipe.format].append(recipe)
        while pending["tflite"] or pending["onnx"]:
            batch = tuple(pending[f].pop(0) for f in ("tflite", "onnx") if pending[f])
            shared = tuple(sorted({n for r in batch for n in sharing[_key(profile, r)]}))
            groups.append((profile.name, batch, shared))
    return groups


GROUPS = _groups()


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def _one_off_profile(folder: Path, name: str, base: str, recipes: tuple[Recipe, ...]) -> None:
    """A user profile that extends ``base`` (its runtimes, opset, tolerance, providers) with only ``recipes``."""
    lines = [f'extends = "{base}"']
    first = recipes[0]
    if PROFILES[base].edgetpu and not (first.format == "tflite" and first.precision == "int8"):
        lines.append("edgetpu = false")  # an Edge TPU profile must start with full int8; this one builds fp32
    for recipe in recipes:
        lines.append("[[recipes]]")
        for key, value in recipe.to_dict().items():
            if value is None or value == []:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
    (folder / f"{name}.toml").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def recipe_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built artifacts shared by every bundle of this module (keyed by source, data, recipe, tool versions)."""
    root = os.environ.get("EDGETK_TEST_CACHE")
    if root:
        path = Path(root) / "recipe-builds"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("recipe-builds")


@pytest.fixture(scope="session")
def build_target(digits_keras, digits_calibration, digits_eval, recipe_workdir, tmp_path_factory):
    """convert_bundle for a target (optionally from an extra profile folder), memoized for the session."""
    done: dict[tuple, ConvertResult] = {}
    out_root = tmp_path_factory.mktemp("recipe-bundles")

    def build(target: str, targets_dir: Path | None = None, **extra) -> ConvertResult:
        key = (target, str(targets_dir), tuple(sorted(extra.items())))
        if key not in done:
            options = ConvertOptions(
                source=str(digits_keras), target=target, calibration=digits_calibration, eval_data=digits_eval,
                targets_dirs=(targets_dir,) if targets_dir else (), out=out_root / f"{target}-{len(done)}",
                use_cache=False, workdir=recipe_workdir, **extra,
            )
            done[key] = convert_bundle(options, progress=lambda message: None)
        return done[key]

    return build


# ------------------------------------------------------------------------------------------------ profiles


def test_every_shipped_profile_loads_and_each_distinct_recipe_is_exercised() -> None:
    assert SHIPPED <= set(PROFILES), SHIPPED - set(PROFILES)
    covered = {(n, json.dumps(r.to_dict(), sort_keys=True)) for _, batch, names in GROUPS for n in names
               for r in batch}
    for profile in PROFILES.values():
        assert profile.recipes
        for recipe in profile.recipes:
            if recipe.format == "pte":  # built from a PyTorch model: the test below
                continue
            assert (profile.name, json.dumps(recipe.to_dict(), sort_keys=True)) in covered, (profile.name, recipe)
    assert len(GROUPS) < sum(len(p.recipes) for p in PROFILES.values())  # shared recipes are built once


@needs_executorch
def test_pte_recipes_are_built_from_a_torch_model(pte_digits_bundle) -> None:
    """A .pte recipe needs a PyTorch source (a Keras one skips it), so the Keras digits CNN above cannot build
    it: every shipped profile's .pte recipe is the one the trained PyTorch digits net is built, verified and
    kept with in tests/executorch (its accuracy and the device's self-check are asserted there)."""
    _, manifest = pte_digits_bundle
    kept = [a for a in manifest["attempts"] if a["recipe"]["format"] == "pte" and a["recipe"]["precision"] == "int8"
            and a["outcome"] == "kept"]
    assert kept, [(a["recipe"]["format"], a["outcome"], a["reason"]) for a in manifest["attempts"]]

    def settings(recipe: dict) -> dict:
        return {k: v for k, v in recipe.items() if k != "nodes_to_exclude"}

    pte = [(p.name, r) for p in PROFILES.values() for r in p.recipes if r.format == "pte"]
    assert {name for name, _ in pte} == set(PTE_PROFILES)  # the Pi 4/5, generic-aarch64/x86_64, Jetson Orin Nano's CPU
    for name, recipe in pte:
        assert settings(json.loads(json.dumps(recipe.to_dict()))) == settings(kept[0]["recipe"]), name


@pytest.mark.parametrize(
    ("base", "recipes", "shared"), GROUPS,
    ids=[f"{b}:" + "+".join(r.label.replace(" ", "-") for r in rs) for b, rs, _ in GROUPS],
)
def test_recipe_builds_what_it_says(base, recipes, shared, build_target, tmp_path_factory) -> None:
    folder = tmp_path_factory.mktemp("one-off-profiles")
    name = f"{base}-exercise"
    _one_off_profile(folder, name, base, recipes)
    result = build_target(name, folder)
    manifest = result.manifest
    assert manifest.target.name == name
    profile = PROFILES[base]
    for recipe in recipes:
        # reduce_range left unset by the profile is decided by the plan (toolkit.conversion.onnx.saturation): on
        # for an x86 target, off elsewhere unless this host's kernels saturate and the artifact is rebuilt with it
        unset = recipe.reduce_range is None
        wanted = dataclasses.replace(recipe, nodes_to_exclude=())
        tried = [a for a in manifest.attempts if dataclasses.replace(
            a.recipe, nodes_to_exclude=(), reduce_range=None if unset else a.recipe.reduce_range) == wanted]
        assert tried, (recipe.label, [a.recipe for a in manifest.attempts])
        kept = [a for a in tried if a.outcome == "kept"]
        # Speed never drops an artifact (a slower one ships, never preferred), so host timing noise cannot excuse
        # a recipe: each one is built and verified, and every check below runs.
        assert kept, [(a.outcome, a.reason) for a in tried]
        record = manifest.artifact(kept[0].file or "")
        assert record.file == f"model.{recipe.precision}.{recipe.format}"
        assert (record.format, record.precision) == (recipe.format, recipe.precision)
        assert record.recipe.io_dtype == recipe.io_dtype
        io = recipe.io_dtype if (recipe.format, recipe.precision) == ("tflite", "int8") else "float32"
        assert [s.dtype for s in record.inputs] == [io], record.inputs
        assert [s.dtype for s in record.outputs] == [io], record.outputs
        assert record.execution_providers == recipe.execution_providers
        assert record.verification is not None and record.verification.samples == 497
        assert record.verification.accuracy is not None
        assert record.verification.accuracy >= record.verification.reference_accuracy - profile.tolerance.max_top1_drop
        assert record.verification.cosine_similarity >= profile.tolerance.min_cosine
        info = inspect_model(result.bundle_dir / record.file)
        assert info.precision == recipe.precision, (record.file, info.precision)
        if recipe.precision == "int8":
            assert info.quantized_ops >= 4
        if recipe.format == "onnx":
            assert info.opset == _expected_opset(profile, recipe)
            assert record.provider_options == {
                ep: dict(profile.provider_options[ep]) for ep in recipe.execution_providers
                if ep in profile.provider_options
            }
        if recipe.format == "tflite" and _bounded_tflite(profile):
            assert tflite_incompatibilities(result.bundle_dir / record.file, "tflite-runtime", "2.14") == []
    # Exactly one preferred artifact per format, never one with a problem.
    for fmt in {r.format for r in manifest.artifacts}:
        preferred = [r for r in manifest.artifacts if r.format == fmt and r.preferred]
        assert len(preferred) == 1, (fmt, [(r.file, r.status) for r in manifest.artifacts])
        assert preferred[0].status in ("ok", "no_speedup_measured")
    read_bundle(result.bundle_dir)


# ------------------------------------------------------------------------------------------------ tflite-runtime 2.14


def _runner_check(python: Path, bundle: Path, *artifacts: str) -> dict:
    args = [str(python), str(bundle / "edgetk_runner.py"), "check", "--bundle", str(bundle), "--runs", "5",
            "--warmup", "1"]
    for artifact in artifacts:
        args += ["--artifact", artifact]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return report_doc(proc.stdout)


@pytest.mark.parametrize("target", ["raspberry-pi-3b", "coral-dev-board"])
def test_bounded_profiles_ship_tflite_that_tflite_runtime_214_loads(target, build_target, legacy_env) -> None:
    """The artifacts the profile chose, loaded and run for real by tflite-runtime 2.14.0 with numpy 1.26."""
    result = build_target(target)
    tflite = [r.file for r in result.manifest.artifacts if r.format == "tflite" and r.verification is not None]
    assert "model.int8.tflite" in tflite and "model.fp32.tflite" in tflite
    doc = _runner_check(legacy_env.python, result.bundle_dir, *tflite)
    assert doc["ok"], json.dumps(doc)[:3000]
    for report in doc["reports"]:
        assert report["runtime"]["name"] == "tflite-runtime"
        assert report["runtime"]["version"].startswith("2.14")
        assert report["error"] is None
        assert report["outputs_match"]["ok"] and report["outputs_match"]["top1_agreement"] == 1.0
    assert sorted(r["artifact"] for r in doc["reports"]) == sorted(tflite)


def test_checker_agrees_with_tflite_runtime_214_on_a_dynamic_range_model(build_target, legacy_env, tmp_path) -> None:
    """A dynamic-range TFLite model built for an unbounded target: the checker says 2.14 cannot load it, and
    tflite-runtime 2.14 really cannot; a bounded target refuses to build it when asked for it explicitly."""
    result = build_target("generic-x86_64", precisions=("dynamic",), formats=("tflite",))
    artifact = result.bundle_dir / "model.dynamic.tflite"
    problems = tflite_incompatibilities(artifact, "tflite-runtime", "2.14")
    assert any(p.startswith("FULLY_CONNECTED version 12") for p in problems), problems
    assert tflite_incompatibilities(artifact, "tflite-runtime", None) == []  # unbounded: not checked
    doc = _runner_check(legacy_env.python, result.bundle_dir, "model.dynamic.tflite")
    (report,) = doc["reports"]
    assert report["error"] is not None and "FULLY_CONNECTED" in report["error"]["message"], report
    assert "12" in report["error"]["message"]
    with pytest.raises(ConversionError, match="tflite-runtime <= 2.14 does not know FULLY_CONNECTED version 12"):
        build_target("raspberry-pi-3b", precisions=("dynamic",), formats=("tflite",))


# ------------------------------------------------------------------------------------------------ Edge TPU


def test_edgetpu_without_compiler_ships_the_bundle_and_says_what_to_do(build_target) -> None:
    if shutil.which("edgetpu_compiler"):
        pytest.skip("a real edgetpu_compiler is on PATH here; this test is about its absence")
    result = build_target("coral-usb")
    manifest = result.manifest
    int8 = manifest.artifact("model.int8.tflite")
    assert [s.dtype for s in int8.inputs] == ["uint8"] and [s.dtype for s in int8.outputs] == ["uint8"]
    assert int8.preferred
    assert not any("edgetpu" in r.file for r in manifest.artifacts)
    (hint,) = [a for a in manifest.attempts if "Edge TPU" in a.reason]
    assert hint.outcome == "failed" and hint.file == "model.int8.tflite"
    assert "edgetpu_compiler is not on PATH" in hint.reason
    assert "apt-get install edgetpu-compiler" in hint.workaround
    assert "packages.cloud.google.com/apt coral-edgetpu-stable main" in hint.workaround
    assert "edgetpu_compiler --show_operations --out_dir . model.int8.tflite" in hint.workaround
    read_bundle(result.bundle_dir)


STAND_IN_COMPILER = f"""#!{sys.executable}
# STAND-IN for edgetpu_compiler, written by tests/test_recipes.py. It does NOT compile anything: it copies the
# input to <out_dir>/<stem>_edgetpu.tflite and writes a log, so that the toolkit's handling of a compiler run
# (command line, output name, record, log) is tested. The real compiler was not run.
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--out_dir") + 1])
model = Path(args[-1])
assert "--show_operations" in args
shutil.copyfile(model, out / (model.stem + "_edgetpu.tflite"))
print("Edge TPU Compiler version 0.0.0-stand-in")
print("Model compiled successfully (stand-in: copied, not compiled).")
"""


def test_edgetpu_compile_step_with_a_stand_in_compiler(build_target, tmp_path, monkeypatch) -> None:
    """STAND-IN compiler (see STAND_IN_COMPILER): the real edgetpu_compiler was not run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    compiler = bin_dir / "edgetpu_compiler"
    compiler.write_text(STAND_IN_COMPILER)
    compiler.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = build_target("coral-dev-board", name="coral-standin")
    manifest = result.manifest
    compiled = manifest.artifact("model.int8_edgetpu.tflite")
    assert compiled.delegate == "libedgetpu.so.1"
    assert compiled.verification is None and compiled.status == "no_speedup_measured" and not compiled.preferred
    assert any("0.0.0-stand-in" in n for n in compiled.notes)
    assert any("not verified on this host" in n for n in compiled.notes)
    assert manifest.artifact("model.int8.tflite").preferred
    log = (result.bundle_dir / "edgetpu_compiler.log").read_text()
    assert "stand-in" in log
    assert any(a.outcome == "kept" and a.file == "model.int8_edgetpu.tflite" for a in manifest.attempts)
    read_bundle(result.bundle_dir)  # the compiled file's sha256 is in the manifest and matches


# ------------------------------------------------------------------------------------------------ Jetson (GPU)


@pytest.mark.parametrize(("target", "opset"), [("jetson-nano", 13), ("jetson-orin-nano", 17)])
def test_jetson_profiles_ship_fp16_onnx_for_tensorrt_and_cuda(target, opset, build_target) -> None:
    """No GPU here: the FP16 artifact is verified on CPUExecutionProvider; TensorRT/CUDA were NOT run."""
    result = build_target(target)
    manifest = result.manifest
    fp16 = manifest.artifact("model.fp16.onnx")
    assert fp16.preferred
    assert fp16.execution_providers == ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    assert fp16.provider_options["TensorrtExecutionProvider"]["trt_fp16_enable"] is True
    assert fp16.provider_options["TensorrtExecutionProvider"]["trt_engine_cache_enable"] is True
    assert fp16.status == "no_speedup_measured"  # CPU timings say nothing about TensorRT speed
    assert any("TensorrtExecutionProvider" in n and "not available here" in n for n in fp16.notes)
    assert inspect_model(result.bundle_dir / fp16.file).opset == opset
    assert fp16.bytes < 0.6 * manifest.artifact("model.fp32.onnx").bytes
    assert fp16.verification is not None and fp16.verification.cosine_similarity > 0.9999
    data = json.loads((result.bundle_dir / "manifest.json").read_text())
    (raw,) = [a for a in data["artifacts"] if a["file"] == "model.fp16.onnx"]
    assert raw["provider_options"]["TensorrtExecutionProvider"]["trt_engine_cache_path"] == "trt_cache"


def test_runner_provider_selection_falls_back_to_cpu() -> None:
    """The runner's choice of providers from the manifest and what onnxruntime offers (no GPU needed)."""
    import importlib.util

    from toolkit import device_side

    spec = importlib.util.spec_from_file_location("edgetk_runner_providers",
                                                  device_side.source_path(device_side.RUNNER_FILE))
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)  # the assembled runner: the file the device runs
    select_providers = runner.select_providers

    wanted = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    options = {"TensorrtExecutionProvider": {"trt_fp16_enable": True, "trt_max_workspace_size": 1073741824,
                                             "trt_engine_cache_path": "trt_cache"},
               "CUDAExecutionProvider": {}}
    jetson = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    providers, provider_options, missing = select_providers(wanted, jetson, options)
    assert providers == jetson and missing == []
    assert provider_options[0] == {"trt_fp16_enable": "true", "trt_max_workspace_size": "1073741824",
                                   "trt_engine_cache_path": "trt_cache"}
    assert provider_options[1:] == [{}, {}]
    providers, provider_options, missing = select_providers(wanted, ["CUDAExecutionProvider", "CPUExecutionProvider"],
                                                            options)
    assert providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert missing == ["TensorrtExecutionProvider"]
    assert select_providers(wanted, ["CPUExecutionProvider"], options)[:2] == (["CPUExecutionProvider"], [{}])
    assert select_providers([], ["CPUExecutionProvider"])[0] == ["CPUExecutionProvider"]
    # a misordered manifest keeps its order; CPU always goes last
    assert select_providers(["CPUExecutionProvider", "CUDAExecutionProvider"], jetson)[0] == [
        "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_runner_opens_a_jetson_artifact_on_cpu_here(build_target) -> None:
    """The fp16 artifact opened the way the device's runner opens it: TensorRT/CUDA missing, CPU used."""
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("a GPU onnxruntime is installed; this test is about a CPU-only host")
    result = build_target("jetson-nano")
    doc = _runner_check(Path(sys.executable), result.bundle_dir, "model.fp16.onnx")
    (report,) = doc["reports"]
    assert report["error"] is None, report
    assert report["runtime"]["providers"] == ["CPUExecutionProvider"]
    assert report["runtime"]["providers_missing"] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    assert report["outputs_match"]["ok"]

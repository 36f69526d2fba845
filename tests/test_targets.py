"""Target profiles: the shipped files load and carry what findings.md measured; bad files are refused with the
file, the key and the fix; extends, user folders and EDGETK_TARGETS_PATH resolve as documented; a probed
device is matched to the right board and never to a Pi from the arch alone."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.profiles import MINIMAL_PROFILE
from toolkit.errors import UsageError
from toolkit.resources import targets_dir
from toolkit.model.platform import host_profile_name, match_profile
from toolkit.model.profile_files import ENV_VAR
from toolkit.model.targets import (
    TargetProfile,
    get_profile,
    load_profiles,
    runtime_supports,
)
from toolkit.model.recipe import Recipe

SHIPPED = {
    "raspberry-pi-3b", "raspberry-pi-4", "raspberry-pi-5", "raspberry-pi-zero-2w", "jetson-nano",
    "jetson-orin-nano", "coral-usb", "coral-dev-board", "generic-aarch64", "generic-x86_64",
}

MINIMAL = MINIMAL_PROFILE


@pytest.fixture(autouse=True)
def _no_env_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture(scope="module")
def shipped() -> dict[str, TargetProfile]:
    return load_profiles()


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    return path


def refused(tmp_path: Path, text: str, *needles: str, name: str = "bad-board") -> UsageError:
    """Load a user folder holding one bad profile; the error must name the file and every needle."""
    path = write(tmp_path / "user", name, text)
    with pytest.raises(UsageError) as info:
        load_profiles(targets_dirs=[tmp_path / "user"])
    text_out = str(info.value)
    assert str(path) in text_out, text_out
    for needle in needles:
        assert needle in text_out, (needle, text_out)
    return info.value


# ------------------------------------------------------------------------------------------- shipped


def test_every_shipped_profile_loads_and_validates(shipped: dict[str, TargetProfile]) -> None:
    assert SHIPPED <= set(shipped)
    for name, profile in shipped.items():
        assert profile.name == name
        assert profile.origin == "shipped"
        assert profile.path is not None and profile.path.parent == targets_dir()
        assert profile.recipes and all(isinstance(r, Recipe) for r in profile.recipes)
        assert profile.runtimes and profile.cpu.cores >= 1 and profile.memory_mb >= 512
        assert profile.fallback[-1] == "fp32"
        assert 0 < profile.tolerance.max_top1_drop <= 0.05 and 0.9 <= profile.tolerance.min_cosine < 1
        assert profile.sources and all(s.startswith("https://") for s in profile.sources), name
        assert profile.to_dict()["recipes"][0]["label"] == profile.preferred_recipe.label
        for recipe in profile.recipes:
            if recipe.format == "onnx":
                assert "onnxruntime" in profile.runtime_names
                assert profile.max_onnx_opset is not None
                assert recipe.opset is None or recipe.opset <= profile.max_onnx_opset


def test_tflite_runtime_profiles_never_list_a_dynamic_tflite_recipe(shipped: dict[str, TargetProfile]) -> None:
    """tflite-runtime 2.14 cannot load TF 2.21 dynamic-range models (FULLY_CONNECTED v12, findings.md)."""
    bound = [p for p in shipped.values() if "tflite-runtime" in p.runtime_names]
    assert {"raspberry-pi-3b", "raspberry-pi-zero-2w", "coral-dev-board", "coral-usb", "raspberry-pi-4"} <= {
        p.name for p in bound
    }
    for profile in bound:
        assert not [r for r in profile.recipes if r.format == "tflite" and r.precision == "dynamic"], profile.name


def test_cpu_profiles_never_prefer_fp16_or_dynamic_onnx(shipped: dict[str, TargetProfile]) -> None:
    for profile in shipped.values():
        if profile.accelerators:
            continue
        assert "fp16" not in profile.fallback, profile.name
        assert profile.preferred_recipe.precision == "int8", profile.name
        for recipe in profile.recipes:
            assert recipe.precision != "fp16", (profile.name, recipe.label)
            assert not (recipe.format == "onnx" and recipe.precision == "dynamic"), profile.name
            if recipe.format == "onnx" and recipe.precision == "int8" and not recipe.a16w8:
                assert (recipe.activation_type, recipe.weight_type, recipe.quant_format) == ("uint8", "int8", "qdq")


def test_a16w8_comes_after_8bit_int8_on_cpu_profiles_only(shipped: dict[str, TargetProfile]) -> None:
    """A16W8 (16-bit activations) is an accuracy fallback listed after an 8-bit INT8 recipe of its format, on the
    CPU profile whose onnxruntime floor runs int16 Q/DQ (>= 1.17); accelerator profiles (Edge TPU, TensorRT)
    cannot run int16 and do not list it, nor does any profile list a TFLite A16W8 (reference kernels, no
    XNNPACK)."""
    with_a16w8 = set()
    for profile in shipped.values():
        recipes = list(profile.recipes)
        for i, recipe in enumerate(recipes):
            if not recipe.a16w8:
                continue
            with_a16w8.add(profile.name)
            assert recipe.format == "onnx" and not profile.accelerators, profile.name
            assert any(r.format == recipe.format and r.precision == "int8" and not r.a16w8 for r in recipes[:i])
            assert recipe.label == "onnx int8 (A16W8 qdq minmax)"
    assert with_a16w8 == {"generic-x86_64"}


def test_x86_prefers_onnx_static_u8s8(shipped: dict[str, TargetProfile]) -> None:
    first = shipped["generic-x86_64"].preferred_recipe
    assert (first.format, first.precision, first.activation_type, first.weight_type) == ("onnx", "int8", "uint8",
                                                                                         "int8")
    assert first.label == "onnx int8 (U8S8 qdq minmax reduce_range)"  # an x86 device may lack VNNI


def test_edgetpu_profiles_prefer_full_int8_with_uint8_io(shipped: dict[str, TargetProfile]) -> None:
    coral = [p for p in shipped.values() if p.edgetpu]
    assert {p.name for p in coral} == {"coral-usb", "coral-dev-board"}
    for profile in coral:
        first = profile.preferred_recipe
        assert (first.format, first.precision, first.io_dtype) == ("tflite", "int8", "uint8")
        assert all(r.format == "tflite" for r in profile.recipes)
        assert [a.delegate for a in profile.accelerators] == ["libedgetpu.so.1"]


def test_jetson_profiles_prefer_fp16_onnx_on_tensorrt(shipped: dict[str, TargetProfile]) -> None:
    nano, orin = shipped["jetson-nano"], shipped["jetson-orin-nano"]
    assert nano.python == "3.6" and nano.max_onnx_opset == 13
    assert not runtime_supports(nano, "onnxruntime", "1.16.0")  # JetPack 4 stops at onnxruntime-gpu 1.11
    for profile in (nano, orin):
        first = profile.preferred_recipe
        assert (first.format, first.precision) == ("onnx", "fp16")
        assert first.execution_providers[:2] == ("TensorrtExecutionProvider", "CUDAExecutionProvider")
        assert first.execution_providers[-1] == "CPUExecutionProvider"
        assert first.opset is not None and first.opset <= (profile.max_onnx_opset or 0)
        assert profile.provider_options["TensorrtExecutionProvider"]["trt_fp16_enable"] is True
        assert profile.accelerators[0].kind == "gpu"


def test_runtime_supports_bounds(shipped: dict[str, TargetProfile]) -> None:
    pi3 = shipped["raspberry-pi-3b"]
    assert runtime_supports(pi3, "tflite-runtime", "2.14.0")
    assert not runtime_supports(pi3, "tflite-runtime", "2.13.1")
    assert not runtime_supports(pi3, "tflite-runtime", "2.15.0")
    assert not runtime_supports(pi3, "litert", "2.3.0")  # not listed
    pi4 = shipped["raspberry-pi-4"]
    assert runtime_supports(pi4, "litert", "2.3.0")
    assert runtime_supports(pi4, "onnxruntime", "1.31.1")
    assert runtime_supports(pi4, "onnxruntime", "1.16.3+cpu")
    assert not runtime_supports(pi4, "onnxruntime", "1.15.1")
    assert not runtime_supports(pi4, "onnxruntime", "garbage")


# ------------------------------------------------------------------------------------------- user profiles


def test_user_profile_with_a_shipped_name_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "raspberry-pi-4", MINIMAL)
    profiles = load_profiles(targets_dirs=[tmp_path])
    pi4 = profiles["raspberry-pi-4"]
    assert pi4.origin == "user" and pi4.path == path
    assert pi4.description == "a test board" and pi4.cpu.model == "Cortex-A53"
    assert profiles["raspberry-pi-5"].origin == "shipped"


def test_extends_inherits_and_overrides(tmp_path: Path) -> None:
    write(tmp_path, "my-pi", """
        extends = "raspberry-pi-4"
        description = "my Pi 4 with a tighter budget"
        latency_budget_ms = 12.5
        sources = ["https://example.org/my-notes"]

        [tolerance]
        min_cosine = 0.995

        [[recipes]]
        format = "tflite"
        precision = "fp32"
    """)
    base = get_profile("raspberry-pi-4")
    mine = get_profile("my-pi", targets_dirs=[tmp_path])
    assert mine.extends == "raspberry-pi-4" and mine.origin == "user"
    assert mine.lineage == (str(tmp_path / "my-pi.toml"), str(base.path))
    assert mine.latency_budget_ms == 12.5
    assert mine.tolerance.min_cosine == 0.995  # tables merge key by key ...
    assert mine.tolerance.max_top1_drop == base.tolerance.max_top1_drop
    assert [r.label for r in mine.recipes] == ["tflite fp32"]  # ... arrays are replaced wholesale
    assert mine.runtimes == base.runtimes and mine.cpu.model == "Cortex-A72" and mine.arch == "aarch64"
    assert mine.sources[-1] == "https://example.org/my-notes" and set(base.sources) < set(mine.sources)


def test_a_user_profile_can_extend_the_shipped_profile_it_shadows(tmp_path: Path) -> None:
    write(tmp_path, "raspberry-pi-4", """
        extends = "raspberry-pi-4"
        latency_budget_ms = 40
    """)
    pi4 = get_profile("raspberry-pi-4", targets_dirs=[tmp_path])
    assert pi4.origin == "user" and pi4.latency_budget_ms == 40
    assert pi4.preferred_recipe.label == "tflite int8 (int8 io)"


def test_env_path_and_targets_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_a, env_b, flag = tmp_path / "a", tmp_path / "b", tmp_path / "flag"
    write(env_a, "board-x", MINIMAL.replace("latency_budget_ms = 50", "latency_budget_ms = 1"))
    write(env_b, "board-x", MINIMAL.replace("latency_budget_ms = 50", "latency_budget_ms = 2"))
    write(env_b, "board-y", MINIMAL)
    monkeypatch.setenv(ENV_VAR, f"{env_a}{os.pathsep}{env_b}")
    profiles = load_profiles()
    assert profiles["board-x"].latency_budget_ms == 2 and profiles["board-x"].path == env_b / "board-x.toml"
    assert "board-y" in profiles and SHIPPED <= set(profiles)
    write(flag, "board-x", MINIMAL.replace("latency_budget_ms = 50", "latency_budget_ms = 3"))
    assert get_profile("board-x", targets_dirs=[flag]).latency_budget_ms == 3


def test_missing_targets_dir_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a directory"):
        load_profiles(targets_dirs=[tmp_path / "nope"])


def test_unknown_profile_name_suggests_the_close_one() -> None:
    with pytest.raises(UsageError) as info:
        get_profile("raspberry-pi-44")
    assert "did you mean 'raspberry-pi-4'?" in info.value.message
    assert "edgetk targets list" in (info.value.hint or "")


# ------------------------------------------------------------------------------------------- validation


def test_unknown_key_with_did_you_mean(tmp_path: Path) -> None:
    error = refused(tmp_path, MINIMAL.replace("latency_budget_ms = 50", "latency_budget = 50"),
                    "key 'latency_budget'", "did you mean 'latency_budget_ms'?")
    assert "docs/targets.md" in (error.hint or "")


def test_unknown_key_inside_a_recipe(tmp_path: Path) -> None:
    refused(tmp_path, MINIMAL + 'io_dtyp = "uint8"\n', "key 'recipes[0].io_dtyp'", "did you mean 'io_dtype'?")


def test_wrong_type(tmp_path: Path) -> None:
    error = refused(tmp_path, MINIMAL.replace("threads = 2", 'threads = "two"'), "key 'threads'",
                    "must be an integer", "got a string")
    assert "threads" in (error.hint or "")
    refused(tmp_path, MINIMAL.replace("cores = 2", "cores = 2.5"), "key 'cpu.cores'", "must be an integer")


def test_unknown_runtime(tmp_path: Path) -> None:
    error = refused(tmp_path, MINIMAL.replace('name = "litert"', 'name = "tflite_runtime"'),
                    "key 'runtimes[0].name'", "unknown runtime 'tflite_runtime'", "did you mean 'tflite-runtime'?")
    assert "litert, tflite-runtime, tensorflow, onnxruntime" in (error.hint or "")


def test_unknown_precision(tmp_path: Path) -> None:
    refused(tmp_path, MINIMAL.replace('precision = "int8"', 'precision = "int4"'), "key 'recipes[0].precision'",
            "unknown precision 'int4'")
    refused(tmp_path, MINIMAL.replace('fallback = ["int8", "fp32"]', 'fallback = ["int8", "fp64"]'),
            "key 'fallback'", "unknown precision 'fp64'")


def test_unknown_format(tmp_path: Path) -> None:
    refused(tmp_path, MINIMAL.replace('format = "tflite"', 'format = "tflight"'), "key 'recipes[0].format'",
            "did you mean 'tflite'?")


def test_io_dtype_on_an_onnx_recipe_is_refused(tmp_path: Path) -> None:
    text = MINIMAL + textwrap.dedent("""
        [[recipes]]
        format = "onnx"
        precision = "int8"
        io_dtype = "uint8"
    """)
    error = refused(tmp_path, text, "key 'recipes[1].io_dtype'", "needs a full-integer TFLite recipe")
    assert "leave io_dtype at float32" in (error.hint or "")


def test_dynamic_tflite_on_tflite_runtime_is_refused(tmp_path: Path) -> None:
    text = MINIMAL.replace('name = "litert"', 'name = "tflite-runtime"').replace('"int8"\n', '"dynamic"\n')
    refused(tmp_path, text, "key 'recipes[0].precision'", "FULLY_CONNECTED version 12")


def test_onnx_recipe_needs_onnxruntime_and_an_opset_bound(tmp_path: Path) -> None:
    onnx = MINIMAL.replace('format = "tflite"', 'format = "onnx"')
    refused(tmp_path, onnx, "key 'recipes[0]'", "onnxruntime is not among the runtimes")
    with_ort = onnx.replace('name = "litert"', 'name = "onnxruntime"')
    refused(tmp_path, with_ort, "key 'max_onnx_opset'", "required when the profile has an ONNX recipe")
    too_high = with_ort.replace("threads = 2", "threads = 2\nmax_onnx_opset = 13") + "opset = 17\n"
    refused(tmp_path, too_high, "key 'recipes[0].opset'", "above max_onnx_opset 13")


def test_unknown_execution_provider(tmp_path: Path) -> None:
    text = MINIMAL.replace("threads = 2", 'threads = 2\nexecution_providers = ["CudaExecutionProvider"]')
    refused(tmp_path, text, "key 'execution_providers'", "did you mean 'CUDAExecutionProvider'?")


def test_missing_required_key(tmp_path: Path) -> None:
    refused(tmp_path, MINIMAL.replace('arch = "aarch64"\n', ""), "the key 'arch' is missing")
    refused(tmp_path, MINIMAL.replace("min_cosine = 0.99\n", ""), "key 'tolerance.min_cosine'", "missing")


def test_edgetpu_profile_must_prefer_full_int8(tmp_path: Path) -> None:
    text = MINIMAL.replace("threads = 2", "threads = 2\nedgetpu = true")
    refused(tmp_path, text, "key 'recipes[0]'", "Edge TPU", 'io_dtype = "uint8"')


def test_fallback_must_end_with_fp32(tmp_path: Path) -> None:
    refused(tmp_path, MINIMAL.replace('fallback = ["int8", "fp32"]', 'fallback = ["fp32", "int8"]'),
            "key 'fallback'", "end with fp32")


def test_name_must_match_the_file(tmp_path: Path) -> None:
    refused(tmp_path, 'name = "other"\n' + MINIMAL, "key 'name'", "does not match the file name")


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    refused(tmp_path, MINIMAL + "this is not toml\n", "not valid TOML")


def test_unknown_extends(tmp_path: Path) -> None:
    refused(tmp_path, 'extends = "raspbery-pi-4"\n', "key 'extends'", "no profile named 'raspbery-pi-4'",
            "did you mean 'raspberry-pi-4'?")


def test_extends_cycle(tmp_path: Path) -> None:
    user = tmp_path / "user"
    write(user, "board-a", 'extends = "board-b"\n')
    write(user, "board-b", 'extends = "board-a"\n')
    with pytest.raises(UsageError) as info:
        load_profiles(targets_dirs=[user])
    text = str(info.value)
    assert "key 'extends'" in text and "cycle" in text
    assert "board-a -> board-b -> board-a" in text or "board-b -> board-a -> board-b" in text
    assert str(user / "board-a.toml") in text or str(user / "board-b.toml") in text


def test_extends_itself_without_a_shadowed_profile(tmp_path: Path) -> None:
    refused(tmp_path, 'extends = "bad-board"\n' + MINIMAL, "key 'extends'", "extends itself")


def test_a_child_missing_what_no_parent_has(tmp_path: Path) -> None:
    text = 'extends = "raspberry-pi-4"\n[tolerance]\nmax_top1_drop = 2.0\n'
    refused(tmp_path, text, "key 'tolerance.max_top1_drop'", "fraction in [0, 1]")


# ------------------------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("arch", "cpu_model", "model_name", "expected"),
    [
        ("aarch64", "Cortex-A72", "Raspberry Pi 4 Model B Rev 1.4", "raspberry-pi-4"),
        ("aarch64", None, "Raspberry Pi 4 Model B Rev 1.5", "raspberry-pi-4"),
        ("armv7l", "ARMv7 Processor rev 3 (v7l)", "Raspberry Pi 4 Model B Rev 1.1", "raspberry-pi-4"),
        ("aarch64", "Cortex-A72", None, "raspberry-pi-4"),  # lscpu's model name alone
        ("aarch64", "0xd08", None, "raspberry-pi-4"),  # cpuinfo's CPU part alone
        ("aarch64", "Cortex-A76", "Raspberry Pi 5 Model B Rev 1.0", "raspberry-pi-5"),
        ("aarch64", None, "Raspberry Pi 3 Model B Plus Rev 1.3", "raspberry-pi-3b"),
        ("aarch64", "Cortex-A53", "Raspberry Pi Zero 2 W Rev 1.0", "raspberry-pi-zero-2w"),
        ("aarch64", "Cortex-A53", None, "generic-aarch64"),  # A53 alone: Pi 3B, Zero 2 W or Coral? unknown
        ("aarch64", "ARMv8 Processor rev 1 (v8l)", "NVIDIA Jetson Nano Developer Kit", "jetson-nano"),
        ("aarch64", "Cortex-A78AE", "NVIDIA Jetson Orin Nano Developer Kit", "jetson-orin-nano"),
        ("aarch64", None, "Freescale i.MX8MQ Phanbell", "coral-dev-board"),
        ("aarch64", None, None, "generic-aarch64"),  # never a Pi from the arch alone
        ("arm64", "Neoverse-N1", None, "generic-aarch64"),
        # qemu-user: an aarch64 kernel showing the host's x86 CPU is an emulator, whatever else it claims
        ("aarch64", "AMD EPYC 7763 64-Core Processor", None, "generic-aarch64"),
        ("aarch64", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "Raspberry Pi 4 Model B", "generic-aarch64"),
        ("x86_64", "Intel(R) Core(TM) i7-10700 CPU @ 2.90GHz", None, "generic-x86_64"),
        ("AMD64", None, None, "generic-x86_64"),
    ],
)
def test_match_profile(arch: str, cpu_model: str | None, model_name: str | None, expected: str,
                       shipped: dict[str, TargetProfile]) -> None:
    assert match_profile(arch=arch, cpu_model=cpu_model, model_name=model_name) == expected
    assert expected in shipped


def test_match_profile_unknown_arch() -> None:
    with pytest.raises(UsageError, match="riscv64"):
        match_profile(arch="riscv64", cpu_model=None)


def test_host_profile_is_a_shipped_profile_of_this_arch(shipped: dict[str, TargetProfile]) -> None:
    import platform

    name = host_profile_name()
    assert name in shipped
    if platform.machine() == "x86_64":
        assert name == "generic-x86_64"


@pytest.mark.parametrize(
    ("line", "key", "needle"),
    [
        ('quant_format = "qop"', "quant_format", "unknown quant_format 'qop'"),
        ('calibration_method = "mse"', "calibration_method", "unknown calibration_method 'mse'"),
        ('activation_type = "int4"', "activation_type", "unknown activation_type 'int4'"),
        ('weight_type = "int16"', "weight_type", "weight_type 'int16' is not offered"),
        ('activation_type = "int16"\nquant_format = "qoperator"', "quant_format", "only as QDQ"),
        ("threads = 0", "threads", "threads must be at least 1"),
    ],
)
def test_recipe_errors_from_recipe_itself_name_file_and_key(tmp_path: Path, line: str, key: str,
                                                            needle: str) -> None:
    text = 'extends = "generic-x86_64"\n[[recipes]]\nformat = "onnx"\nprecision = "int8"\n' + line + "\n"
    refused(tmp_path, text, f"key 'recipes[0].{key}'", needle)


def test_version_bounds_are_pep440(tmp_path: Path) -> None:
    """Bounds compare as PEP 440 versions: a release candidate is not the release (it comes before it)."""
    from toolkit.model.targets import RuntimeRequirement

    tflite = RuntimeRequirement("tflite-runtime", min_version="2.14", max_version="2.14")
    assert tflite.admits("2.14.0") and tflite.admits("2.14.9") and tflite.admits("2.14.0.post1")
    assert not tflite.admits("2.14.0rc1")  # before 2.14, so below the lower bound
    assert not tflite.admits("2.15.0rc1") and not tflite.admits("2.15.0")
    assert tflite.bounds == ">=2.14, <2.15"
    ort = RuntimeRequirement("onnxruntime", min_version="1.16")
    assert ort.admits("1.16.3+cu118") and ort.admits("v1.17") and not ort.admits("1.16.0rc2")
    assert not ort.admits("") and not ort.admits("latest")
    assert RuntimeRequirement("litert").bounds == "any" and RuntimeRequirement("litert").admits("0.1")
    refused(tmp_path, MINIMAL.replace('name = "litert"', 'name = "litert"\nmin_version = "two"'),
            "key 'runtimes[0].min_version'", "'two' is not a version")


def test_an_unknown_execution_provider_in_a_recipe_is_refused_by_the_recipe(tmp_path: Path) -> None:
    text = MINIMAL + 'execution_providers = ["CudaExecutionProvider"]\n'
    refused(tmp_path, text, "key 'recipes[0].execution_providers'", "did you mean 'CUDAExecutionProvider'?")


def test_a_wrong_value_deep_in_a_table_names_the_whole_key(tmp_path: Path) -> None:
    text = MINIMAL.replace("threads = 2", "threads = 2\n[provider_options.CudaExecutionProvider]\nx = 1")
    refused(tmp_path, text, "key 'provider_options.CudaExecutionProvider'", "did you mean 'CUDAExecutionProvider'?")
    text = MINIMAL + "nodes_to_exclude = [1]\n"
    refused(tmp_path, text, "the key 'recipes[0].nodes_to_exclude' must be a list of strings", "got an integer")
    refused(tmp_path, MINIMAL.replace("[cpu]", "cpu = 3\n[other]"), "unknown top-level key 'other'")


def test_regression_and_placement_tables(tmp_path: Path) -> None:
    text = MINIMAL + textwrap.dedent("""
        [regression]
        min_slowdown_pct = 40
        baseline_checks = 6

        [[placement]]
        format = "tflite"
        on = "edgetpu"
        artifacts = "*_edgetpu.tflite"
    """)
    profile = get_profile("board-p", targets_dirs=[write(tmp_path / "ok", "board-p", text).parent])
    assert profile.regression.min_slowdown_pct == 40 and profile.regression.baseline_checks == 6
    assert profile.regression.alpha == 0.01  # the policy's default where the file says nothing
    (placement,) = profile.placement
    assert (placement.on, placement.artifacts, placement.min_nodes_pct) == ("edgetpu", "*_edgetpu.tflite", 100.0)
    refused(tmp_path, text.replace("baseline_checks = 6", "baseline_checks = 6\nalpah = 0.1"),
            "unknown key 'regression.alpah'", "did you mean 'alpha'?")
    refused(tmp_path, text.replace("min_slowdown_pct = 40", "alpha = 2.0"), "key 'regression'", "alpha")
    refused(tmp_path, text.replace('on = "edgetpu"', 'on = "npu"'), "key 'placement[0]'", "not a TFLite delegate")
    pte = text.replace('[[placement]]\nformat = "tflite"', '[[placement]]\nformat = "pte"').replace(
        'on = "edgetpu"', 'on = "xnnpack"').replace('artifacts = "*_edgetpu.tflite"', "min_nodes_pct = 80")
    (placement,) = get_profile("board-p", targets_dirs=[write(tmp_path / "pte", "board-p", pte).parent]).placement
    assert (placement.format, placement.on, placement.min_nodes_pct) == ("pte", "xnnpack", 80.0)
    assert placement.applies_to("model.int8.pte", "pte") and not placement.applies_to("model.int8.tflite", "tflite")
    refused(tmp_path, pte.replace('on = "xnnpack"', 'on = "gpu"'), "key 'placement[0]'",
            "not an ExecuTorch backend", "xnnpack")
    refused(tmp_path, pte.replace('format = "pte"', 'format = "tflte"'), "placement[0]", "tflte")

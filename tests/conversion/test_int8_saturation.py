"""Which CPUs saturate onnxruntime's U8S8 kernels (toolkit.conversion.onnx.saturation), and what the plan makes of
it: the cpuinfo flags as Linux writes them (an AVX2-only AMD EPYC, an AVX-512 VNNI Zen 4, an Alder Lake with
AVX-VNNI, a Sapphire Rapids with AMX, a Skylake-SP with AVX-512 but no VNNI, a Cortex-A72's Features line). The
converting end to end on a saturating host is in tests/verification/test_output_roles.py."""

from __future__ import annotations

import pytest

from toolkit.conversion.onnx.saturation import resolved, saturates
from toolkit.model.recipe import Recipe
from toolkit.model.vocabulary import Format, Precision, QuantType

AVX2 = "fpu sse4_1 sse4_2 avx f16c fma avx2 bmi2 sha_ni".split()


@pytest.mark.parametrize(("arch", "flags", "expected"), [
    ("x86_64", AVX2, True),  # VPMADDUBSW: int16 pairwise sums
    ("amd64", AVX2, True),
    ("x86_64", AVX2 + ["avx512f", "avx512bw"], True),  # AVX-512 without VNNI saturates too
    ("x86_64", AVX2 + ["avx512f", "avx512_vnni"], False),
    ("x86_64", AVX2 + ["avx_vnni"], False),
    ("x86_64", AVX2 + ["amx_tile", "amx_int8"], False),
    ("aarch64", "fp asimd evtstrm crc32 cpuid".split(), False),  # ARM kernels widen before adding
    ("armv7l", [], False),
])
def test_which_cpus_saturate(arch: str, flags: list[str], expected: bool) -> None:
    assert saturates(arch=arch, flags=flags) is expected


def test_x86_targets_get_reduce_range_others_keep_8_bit_weights_and_a_profile_choice_stands() -> None:
    u8s8 = Recipe(Format.ONNX, Precision.INT8)
    assert resolved(u8s8, "x86_64").reduce_range is True
    assert resolved(u8s8, "aarch64").reduce_range is False
    assert resolved(Recipe(Format.ONNX, Precision.INT8, reduce_range=False), "x86_64").reduce_range is False
    a16w8 = Recipe(Format.ONNX, Precision.INT8, activation_type=QuantType.INT16)
    assert resolved(a16w8, "x86_64").reduce_range is None  # int16 activations: no U8S8 kernel
    assert resolved(Recipe(Format.TFLITE, Precision.INT8), "x86_64").reduce_range is None
    assert resolved(u8s8, "x86_64").label == "onnx int8 (U8S8 qdq minmax reduce_range)"


def test_an_arm_target_is_verified_with_its_numerics_on_a_saturating_host() -> None:
    """The probe's flags decide: an AVX2-only host verifies an ARM target's 8-bit-weight INT8 ONNX with
    session.x64quantprecision (no 7-bit rebuild); an x86 target gets 7-bit weights from the plan instead; a
    VNNI host needs neither."""
    from tests.fixtures.cpu_flags import AVX2, VNNI, probe_flags
    from toolkit.conversion.onnx.saturation import X64_QUANT_PRECISION, host_saturates, target_numerics

    u8s8 = Recipe(Format.ONNX, Precision.INT8)
    with probe_flags(AVX2):
        assert host_saturates()
        arm = resolved(u8s8, "aarch64")
        assert arm.reduce_range is False and target_numerics(arm, "aarch64") == X64_QUANT_PRECISION
        x86 = resolved(u8s8, "x86_64")
        assert x86.reduce_range is True and target_numerics(x86, "x86_64") == {}
        assert target_numerics(Recipe(Format.ONNX, Precision.INT8, reduce_range=False), None) == {}  # this host
        assert target_numerics(Recipe(Format.TFLITE, Precision.INT8), "aarch64") == {}
    with probe_flags(VNNI):
        assert not host_saturates() and target_numerics(resolved(u8s8, "aarch64"), "aarch64") == {}

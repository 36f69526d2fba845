"""Which CPUs saturate onnxruntime's U8S8 int8 kernels, and what the static INT8 ONNX recipe does about it (the one
place that knows; read once per process).

On x86-64 without VNNI (AVX2, or AVX-512 without VNNI) onnxruntime's MLAS multiplies uint8 activations by int8
weights with VPMADDUBSW, which adds each pair of products into an int16 with saturation (255 x 127 x 2 = 64770 >
32767); int8 activations (S8S8) are shifted to uint8 and take the same path. onnxruntime's quantization guide
names the remedy, ``reduce_range``: weights in 7 bits (255 x 64 x 2 = 32640 fits). VNNI (VPDPBUSD) and AMX
accumulate into int32 and ARM's kernels widen before adding: neither saturates. Measured on the trained face stage
(tests/verification/test_output_roles.py) on an AVX2-only EPYC: worst errors per output 0.012 / 0.104 / 0.204 of
the float range with 8-bit weights, 0.004 / 0.028 / 0.020 with reduce_range (docs/verification.md).

* A target whose CPU is x86 gets ``reduce_range`` (its devices may lack VNNI; the toolkit cannot know): the plan
  sets it on the static INT8 ONNX recipes (:func:`resolved`), the quantizer says why (:data:`REDUCE_RANGE_NOTE`).
* Another target (ARM) is quantized with 8-bit weights, and on a host whose kernels saturate its artifact is
  verified with the target's numerics: onnxruntime's session option ``session.x64quantprecision = "1"``
  (:func:`target_numerics`) turns the constant int8 weights into uint8 so that MLAS uses its U8U8 kernels, which
  do not saturate (an x86 host reproduced an emulated Cortex-A72's outputs within 0.004 of the range:
  findings.md section 7). The option is written in the artifact's notes. Only a host profile (the target is
  this saturating host) still gets the 7-bit rebuild when its 8-bit artifact fails
  (:func:`toolkit.conversion.saturation_retry.retry`), the first attempt listed as dropped with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from toolkit.model.vocabulary import Format, Precision

if TYPE_CHECKING:
    from toolkit.model.recipe import Recipe

# cpuinfo flags of the x86 int8 instructions that accumulate into int32 (onnxruntime picks them when present)
NON_SATURATING_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
X86_ARCHES = ("x86_64", "x86")

REDUCE_RANGE_NOTE = (
    "reduce_range: weights quantized to 7 bits, so that onnxruntime's U8S8 kernels on x86 CPUs without VNNI "
    "(AVX2: int8 products added pairwise into int16) cannot saturate; an x86 device may lack VNNI")
HOST_SATURATES = ("this host's x86 CPU has no VNNI: onnxruntime's U8S8 kernels here add int8 products pairwise "
                  "into int16 and saturate, which the target's kernels do not")


def saturates(*, arch: str, flags: Iterable[str]) -> bool:
    """Whether onnxruntime's U8S8 kernels saturate on a CPU of ``arch`` (any spelling of ``uname -m``) with the
    cpuinfo ``flags``: x86 without any of :data:`NON_SATURATING_FLAGS`; never on ARM."""
    from toolkit.model.platform import normalize_arch

    return normalize_arch(arch) in X86_ARCHES and not NON_SATURATING_FLAGS & set(flags)


@lru_cache(maxsize=1)
def host_saturates() -> bool:
    """:func:`saturates` for this machine, from the device probe's own reading of /proc/cpuinfo (no flags read:
    not x86, or not saturating)."""
    from toolkit.model.platform import device_probe_module

    probe = device_probe_module()
    flags = str(probe.probe_cpuinfo().get("flags") or "").split()
    arch = str(probe.probe_basics().get("arch") or "")
    return bool(flags) and saturates(arch=arch, flags=flags)


def applies(recipe: Recipe) -> bool:
    """Whether ``recipe`` runs onnxruntime's 8-bit int8 kernels: static INT8 ONNX with 8-bit activations."""
    return recipe.format == Format.ONNX and recipe.precision == Precision.INT8 and not recipe.a16w8


def resolved(recipe: Recipe, arch: str | None) -> Recipe:
    """``recipe`` with ``reduce_range`` decided where the profile left it unset: on for a target whose CPU is x86
    (no arch: a profile of this host, on when this host saturates), off elsewhere; other recipes as they are."""
    if not applies(recipe) or recipe.reduce_range is not None:
        return recipe
    from toolkit.model.platform import normalize_arch

    on = host_saturates() if arch is None else normalize_arch(arch) in X86_ARCHES
    return dataclasses.replace(recipe, reduce_range=on)


# onnxruntime's session option that makes an x86 host without VNNI compute a U8S8 artifact as ARM does
X64_QUANT_PRECISION = {"session.x64quantprecision": "1"}
X64_QUANT_PRECISION_NOTE = (
    "verified with onnxruntime's session option session.x64quantprecision = 1: this host's x86 CPU has no VNNI "
    "and its U8S8 kernels saturate, which the target's do not; the option has onnxruntime run the int8 weights "
    "as uint8 (U8U8 kernels that do not saturate), so the 8-bit-weight artifact is verified as the target computes "
    "it (host latency with it means nothing)")


def target_numerics(recipe: Recipe, arch: str | None) -> Mapping[str, str]:
    """The onnxruntime session options that verify ``recipe``'s artifact with the target's numerics on this host:
    :data:`X64_QUANT_PRECISION` for an 8-bit-weight static INT8 ONNX of a target that is not x86 when this host
    saturates; else none (an x86 target, or this host's own profile, computes as this host does)."""
    from toolkit.model.platform import normalize_arch

    if not applies(recipe) or recipe.reduce_range or arch is None or normalize_arch(arch) in X86_ARCHES:
        return {}
    return dict(X64_QUANT_PRECISION) if host_saturates() else {}

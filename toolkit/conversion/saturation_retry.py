"""An ONNX INT8 artifact that failed verification only because this host's x86 kernels saturate, built again
with 7-bit weights (``reduce_range``) and verified, where the target computes as this host (a host profile; an
ARM target's artifact is verified with its numerics instead, ``onnx.saturation.target_numerics``): the pipeline's step for what
:mod:`toolkit.conversion.onnx.saturation` knows (kept apart from it: that module is read by the plan and the
quantizer, this one builds and verifies, which the plan and the quantizer sit below)."""

from __future__ import annotations

import dataclasses

from toolkit.conversion.candidate import build_and_verify
from toolkit.conversion.onnx.saturation import HOST_SATURATES, applies, host_saturates, target_numerics
from toolkit.conversion.run import Candidate, ConvertRun, Failure
from toolkit.model.vocabulary import AttemptOutcome


def retry(run: ConvertRun, failed: Candidate) -> Candidate | None:
    """``failed`` (out of tolerance) rebuilt with ``reduce_range`` when this host saturates and it was built with
    8-bit weights: the first attempt is appended to ``run.attempts`` as dropped, with why; the rebuilt candidate is
    returned verified, its notes saying why (None: not applicable, or the rebuild failed, listed too)."""
    recipe = failed.recipe
    if not (failed.failures and applies(recipe) and not recipe.reduce_range and host_saturates()):
        return None
    if target_numerics(recipe, run.policy.arch):  # verified with the target's numerics: its failure is real
        return None
    why = f"{HOST_SATURATES}; reduce_range keeps the weights in 7 bits, which cannot saturate"
    run.attempts.append(failed.attempt(AttemptOutcome.DROPPED, "; ".join(failed.problems),
                                       workaround=f"rebuilt with reduce_range next: {why}"))
    run.progress(f"{recipe.label} out of tolerance on this host ({'; '.join(failed.failures)}): {HOST_SATURATES}; "
                 "rebuilding with reduce_range")
    result = build_and_verify(run, dataclasses.replace(recipe, reduce_range=True), explicit=failed.explicit)
    if isinstance(result, Failure):
        run.attempts.append(result.attempt())
        return None
    note = (f"reduce_range retry: the 8-bit-weight artifact failed verification here "
            f"({'; '.join(failed.failures)[:160]}): {why}")
    return dataclasses.replace(result, record=dataclasses.replace(result.record, notes=result.record.notes + (note,)))

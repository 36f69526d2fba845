"""The ExecuTorch bundled program beside each ``.pte``: ``model.<precision>.bpte``, the program with a few held-out
inputs and the FLOAT model's outputs, so the device checks itself with ExecuTorch's own
``verify_result_with_bundled_expected_output``. The limit (``PteRecord.bundled_atol``) is twice this artifact's
error here plus float rounding (1e-4 of the outputs' magnitude): kernels that compute what this host's did
pass, a broken kernel or corrupted delegate payload fails. ExecuTorch refuses a bundled file as a plain program
(identifier ``BP08``, not ``ET12``), so the ``.pte`` itself stays plain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from toolkit.model.artifact import ArtifactRecord, PteRecord
from toolkit.model.tensors import TensorSpec

BUNDLED_SAMPLES = 4
FLOAT_ROUNDING = 1e-4  # of the outputs' magnitude: what an fp32 kernel on another CPU may differ by


def bundled_name(artifact: str) -> str:
    """``model.int8.pte`` -> ``model.int8.bpte``."""
    return artifact[: -len(".pte")] + ".bpte"


def attach(record: ArtifactRecord, staging: Path, inputs: Sequence[TensorSpec], feeds: Sequence[Mapping[str, np.ndarray]],
           reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]]) -> ArtifactRecord:
    """Write ``record``'s bundled program into ``staging`` (the first ``BUNDLED_SAMPLES`` held-out ``feeds``, the float
    ``reference`` and this artifact's ``outputs`` on this host); the record naming it with its limit."""
    import torch
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    count = min(BUNDLED_SAMPLES, len(feeds), len(reference))
    if count == 0:
        return record
    cases = [MethodTestCase(
        inputs=[torch.from_numpy(np.ascontiguousarray(feeds[i][spec.name])) for spec in inputs],
        expected_outputs=[torch.from_numpy(np.ascontiguousarray(np.asarray(out, dtype=np.float32)))
                          for out in reference[i]]) for i in range(count)]
    error = max((float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(r, np.float64))))
                 for i in range(count) for a, r in zip(outputs[i], reference[i]) if np.size(r)), default=0.0)
    magnitude = max((float(np.max(np.abs(r))) for i in range(count) for r in reference[i] if np.size(r)), default=1.0)
    atol = float(2.0 * error + FLOAT_ROUNDING * max(1.0, magnitude))
    bundled = BundledProgram(None, [MethodTestSuite(method_name="forward", test_cases=cases)],
                             pte_file_path=str(staging / record.file))
    name = bundled_name(record.file)
    (staging / name).write_bytes(serialize_from_bundled_program_to_flatbuffer(bundled))
    base = record.pte or PteRecord(delegated_nodes=0, total_nodes=0)
    return dataclasses.replace(record, pte=dataclasses.replace(base, bundled=name, bundled_atol=atol))

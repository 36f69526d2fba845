"""Every verification run of a candidate (load, held-out samples, timings, batch sizes) happens in a child
process of its own (toolkit/conversion/measure_child.py): a runtime that crashes during one candidate's
verification drops that candidate, naming the signal and the stage, and the convert ships the others.

What is planted, and why: no runtime here crashes on a held-out sample after running sample 0 of the same
artifact (the real crashes we have, test_crash_guard.py's edited RESHAPE, crash at load). So a ``sitecustomize``
put on the child's PYTHONPATH wraps onnxruntime's ``InferenceSession.run`` in the verification child only (it
looks at ``sys.orig_argv``) and sends the process a real SIGSEGV at the third inference of a quantized ONNX model
(one holding QuantizeLinear). The signal, the process it kills, the convert and the fp32 candidate are real;
only the kernel bug is stood in for. Nothing in the toolkit knows of the plant.
"""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.cli import run_edgetk

SITECUSTOMIZE = '''
import sys

if "toolkit.conversion.measure_child" in getattr(sys, "orig_argv", ()):
    import os
    import signal

    import onnxruntime

    real_init, real_run = onnxruntime.InferenceSession.__init__, onnxruntime.InferenceSession.run

    def __init__(self, model, *args, **kwargs):
        real_init(self, model, *args, **kwargs)
        with open(model, "rb") as handle:
            self.planted_quantized = b"QuantizeLinear" in handle.read()
        self.planted_runs = 0

    def run(self, *args, **kwargs):
        if self.planted_quantized:
            self.planted_runs += 1
            if self.planted_runs == 3:  # held-out sample 2: the first inference (sample 0) passed
                os.kill(os.getpid(), signal.SIGSEGV)
        return real_run(self, *args, **kwargs)

    onnxruntime.InferenceSession.__init__, onnxruntime.InferenceSession.run = __init__, run
'''


def test_a_runtime_crash_in_one_candidates_verification_drops_it_and_ships_the_others(
        digits_keras: Path, digits_calibration: Path, digits_eval: Path, tmp_path: Path) -> None:
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = tmp_path / "bundle"
    result = run_edgetk("--debug", "convert", digits_keras, "--calibration", digits_calibration, "--eval-data",
                        digits_eval, "--precision", "fp32", "--precision", "int8", "--format", "onnx", "--out", out,
                        "--no-cache", "--json", env={"PYTHONPATH": str(plant)})
    assert result.code == 0, result.stderr[-3000:]
    doc = result.json()  # --debug keeps stdout one document
    crashed = [a for a in doc["attempts"] if "SIGSEGV" in (a.get("reason") or "")]
    assert len(crashed) == 1, [(a["recipe"]["precision"], a["reason"]) for a in doc["attempts"]]
    reason = crashed[0]["reason"]
    assert reason.startswith("the int8 ONNX crashed onnxruntime while verifying it on held-out sample 2 (SIGSEGV)"), \
        reason
    assert crashed[0]["recipe"]["precision"] == "int8" and crashed[0]["outcome"] == "failed"
    assert [a["file"] for a in doc["artifacts"]] == ["model.fp32.onnx"]  # the convert went on: fp32 shipped
    assert not (out / "model.int8.onnx").exists() and (out / "model.fp32.onnx").is_file()
    manifest = (out / "manifest.json").read_text()
    assert "crashed onnxruntime while verifying it on held-out sample 2 (SIGSEGV)" in manifest
    # --debug: the Python stack at the crash, from the child (faulthandler), names where it died
    assert "Fatal Python error: Segmentation fault" in result.stderr, result.stderr[-3000:]
    assert "sitecustomize.py" in result.stderr and "measure_child.py" in result.stderr

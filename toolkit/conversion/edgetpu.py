"""The Edge TPU step: compile the verified full-int8 TFLite artifact with ``edgetpu_compiler``. Without the
compiler the bundle still ships (the CPU int8 artifact runs anywhere) and an attempt says exactly what to
install and run. The compiled model cannot be verified here: it needs an Edge TPU.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from toolkit.conversion.policy import Policy
from toolkit.delivery.bundle import sha256_file
from toolkit.model.artifact import ArtifactRecord, Attempt
from toolkit.model.recipe import Recipe
from toolkit.model.vocabulary import ArtifactStatus, AttemptOutcome, Format, IoDtype, Precision

EDGETPU_COMPILER = "edgetpu_compiler"
EDGETPU_LOG = "edgetpu_compiler.log"
EDGETPU_INSTALL = (
    "curl https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo apt-key add - && "
    'echo "deb https://packages.cloud.google.com/apt coral-edgetpu-stable main" | '
    "sudo tee /etc/apt/sources.list.d/coral-edgetpu.list && "
    "sudo apt-get update && sudo apt-get install edgetpu-compiler"
)


def compile_for_edgetpu(
    records: Sequence[ArtifactRecord], policy: Policy, attempts: list[Attempt], staging: Path
) -> list[ArtifactRecord]:
    """Compile the full-int8 artifact for the Edge TPU with ``edgetpu_compiler`` when it is on PATH."""
    int8 = next((r for r in records if r.format == Format.TFLITE and r.precision == Precision.INT8
                 and r.recipe is not None and r.recipe.io_dtype in (IoDtype.UINT8, IoDtype.INT8)), None)
    recipe = int8.recipe if int8 and int8.recipe else Recipe(Format.TFLITE, Precision.INT8, io_dtype=IoDtype.UINT8)
    if int8 is None:
        attempts.append(Attempt(recipe, AttemptOutcome.FAILED, "not compiled for the Edge TPU: no full-integer TFLite artifact "
                                "passed verification (the Edge TPU runs only those)"))
        return []
    stem = Path(int8.file).stem  # model.int8
    compiled_name = f"{stem}_edgetpu.tflite"
    command = f"{EDGETPU_COMPILER} --show_operations --out_dir . {int8.file}"
    compiler = shutil.which(EDGETPU_COMPILER)
    if compiler is None:
        attempts.append(Attempt(
            recipe, AttemptOutcome.FAILED,
            f"not compiled for the Edge TPU: {EDGETPU_COMPILER} is not on PATH (it runs only on x86-64 "
            f"Debian/Ubuntu); {int8.file} runs on the CPU meanwhile",
            file=int8.file,
            workaround=f"install it ({EDGETPU_INSTALL}), then in the bundle folder run: {command} "
            f"(writes {compiled_name})",
        ))
        return []
    out_dir = staging / ".edgetpu"
    out_dir.mkdir()
    try:
        proc = subprocess.run(
            [compiler, "--show_operations", "--out_dir", str(out_dir), str(staging / int8.file)],
            capture_output=True, text=True, timeout=600, check=False,
        )
        log = (proc.stdout or "") + (proc.stderr or "")
        (staging / EDGETPU_LOG).write_text(log)
        produced = out_dir / compiled_name
        if proc.returncode != 0 or not produced.is_file():
            tail = " ".join(log.strip().splitlines()[-3:])[:400]
            attempts.append(Attempt(recipe, AttemptOutcome.FAILED, f"{EDGETPU_COMPILER} failed (exit {proc.returncode}): {tail}; "
                                    f"see {EDGETPU_LOG}", file=int8.file))
            return []
        shutil.move(str(produced), staging / compiled_name)
    except (OSError, subprocess.TimeoutExpired) as exc:
        attempts.append(Attempt(recipe, AttemptOutcome.FAILED, f"{EDGETPU_COMPILER} could not run: {exc}", file=int8.file))
        return []
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    # the real compiler prints "Edge TPU Compiler version 16.0.384591198"
    version = next((line.strip() for line in log.splitlines()
                    if line.lower().startswith("edge tpu compiler version")), "version unknown")
    path = staging / compiled_name
    record = dataclasses.replace(
        int8,
        file=compiled_name,
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        verification=None,
        golden=None,
        host_latency_ms=None,
        fp32_latency_ms=None,
        runtime=None,
        status=ArtifactStatus.NO_SPEEDUP_MEASURED,
        preferred=False,
        delegate=policy.delegate or "libedgetpu.so.1",
        notes=(f"compiled from {int8.file} by {EDGETPU_COMPILER} ({version}); log: {EDGETPU_LOG}",
               "runs only with the Edge TPU delegate; not verified on this host (no Edge TPU here): "
               f"{int8.file} is the verified CPU artifact"),
    )
    attempts.append(Attempt(recipe, AttemptOutcome.KEPT, f"compiled for the Edge TPU by {EDGETPU_COMPILER}", file=compiled_name))
    return [record]

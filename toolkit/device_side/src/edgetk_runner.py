#!/usr/bin/env python3
"""edgetk on-device runner: measure a bundle's artifacts ON the device and print ONE JSON document.

This file is copied into every bundle (``<bundle>/edgetk_runner.py``) and run by ``edgetk check`` on the
device. It must run on Python >= 3.6 (JetPack 4 ships 3.6) with the standard library, numpy and whichever
runtime the device has; it imports nothing from the toolkit. ``probe`` needs the standard library only. It is
assembled on the host from blocks (toolkit/device_side/src/runner/, each after its ``# --- block:`` line below): one
loader per runtime (a ``Loader`` chosen from LOADER_CLASSES) and the measuring code that asks it (docs/runner.md).

Commands (docs/runner.md has the full schema)::

    python3 edgetk_runner.py probe
    python3 edgetk_runner.py memory [--cgroup DIR]   (MemAvailable, cgroup and ulimit -v limits, OOM-kill counts)
    python3 edgetk_runner.py check --bundle DIR [--artifact FILE]... [--runs N] [--warmup N]
                                   [--min-time SECONDS] [--threads N] [--runtime NAME] [--timeout SECONDS]
    python3 edgetk_runner.py run-one --bundle DIR --artifact FILE [same options]   (one artifact, in-process)
    python3 edgetk_runner.py run-group --bundle DIR --artifact FILE... [same options]   (one import, a fork each)

    check/run-one also take: --profile [--profile-top N] [--profile-runs N], --throughput [--batch-sizes 1,4,8]
    [--in-flight 1,2,4], --loads, --cache-dir DIR (device-side caches: TensorRT engines, optimized models)

Every report carries ``placement`` (the host's placement gate reads it; keep the keys)::

    {"intended", "nodes_total", "nodes_on_intended", "time_share_on_intended", "fallback_ops": [op type, ...],
     "fell_back", "source": "graph" | "profile" | "none", "note"}

``intended`` is the artifact's first ONNX execution provider, or for TFLite ``edgetpu`` / ``gpu`` / ``XNNPACK``;
counts are null where nothing was counted. ``--profile`` adds ``profile`` (per op type and top nodes; ONNX
Runtime's profiler in a second session, latency percentiles stay those of the unprofiled runs; TFLite's Python
interpreters have no op timer, which the profile says), ``--throughput`` adds ``throughput`` (the curve over
batch sizes, or requests in flight for a fixed batch, with batched outputs compared per sample), ``--loads``
adds ``loads`` (cold with the page-cache drop verified, warm, and load options before/after, each a fresh
process). docs/runner.md documents each shape.

``check`` verifies each artifact's sha256 against manifest.json, then measures it in its own child process
(``run-one``) so that a runtime that crashes on one artifact (a segfault in a kernel, an abort in a delegate)
is reported for that artifact while the others still report, and so that peak RSS is per artifact. The .pte
artifacts (SHARED_IMPORT_FORMATS) go to one ``run-group`` child instead, which imports their runtime (torch, where
the Python binding runs them) once and forks a process per artifact: still one process, one crash and one peak RSS
per artifact, one import. Where the native runner (``edgetk-pte-runner``, pte_runner.cpp, beside executorch's
libraries) is installed, each .pte runs in it instead, driven through a framed pipe: no torch anywhere.

Every failure is a JSON error ``{"kind", "message", "hint"}`` with ``kind`` one of ERROR_KINDS
(``missing_runtime``, ``unsupported_op``, ``corrupt_artifact``, ``integrity``, ``crash``, ``bad_bundle``,
``usage``, ``out_of_memory``, ``killed``; ``bad_report`` is the host's). Exit code 0 whenever the JSON document
was printed (even when artifacts failed), 2 for a usage error (still one JSON document). Native libraries that
print to stdout cannot corrupt the document: fd 1 is pointed at stderr while the runner works and the JSON is
written to the saved original stdout at the end. ``check``'s document is framed (REPORT_MARK with its length and
sha256 before it, the end mark after it): the host reads only what is inside a whole frame, so a line a
sitecustomize prints and a report cut short cannot be taken for a report (docs/runner.md, "The frame").

Out of memory is named, not taken for a crash or a damaged file: a ``MemoryError``, a ``std::bad_alloc`` or an
allocation failure under ``ulimit -v`` in a worker, or a worker killed by SIGKILL while the kernel's OOM-kill
count (``/proc/vmstat``, the memory cgroup's ``memory.events``) rose, is ``out_of_memory`` with the file's size,
the peak RSS seen, MemAvailable and the cgroup and ``ulimit -v`` limits. ``check`` writes MEMORY_MARK lines to
stderr (at the start and after each artifact) so the host can tell the same of a runner killed as a whole.

Per artifact report keys read by the host's gates (toolkit/checks/checking.py): ``latency_samples_ms`` (every timed
run in ms, in the order measured, thinned evenly to MAX_SAMPLES; the host stores them so that the regression
gate tests samples from several checks rather than one median) and, where the runtime can tell,
``placement``: ``{"intended", "nodes_total", "nodes_on_intended", "time_share_on_intended",
"fallback_ops": [...]}`` (``intended`` the delegate or execution provider the artifact asks for:
``edgetpu``/``xnnpack``/``gpu`` or an ONNX Runtime provider name; ``fallback_ops`` the nodes that ran
elsewhere, each a string or ``{"name", "op_type", "on"}``).
"""

import argparse
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback
from typing import Any  # noqa: F401 (type comments)


# --- block: runner/base.py ---
# --- block: runner/report.py ---
# --- block: runner/environment.py ---
# --- block: runner/memory.py ---
# --- block: runner/models.py ---
# --- block: runner/measuring.py ---
# --- block: runner/loading.py ---
# --- block: runner/tflite.py ---
# --- block: runner/litert.py ---
# --- block: runner/tflite_runtime.py ---
# --- block: runner/tensorflow.py ---
# --- block: runner/onnxruntime.py ---
# --- block: runner/pte.py ---
# --- block: runner/executorch_native.py ---
# --- block: runner/executorch_binding.py ---
# --- block: runner/executorch.py ---
# --- block: runner/loaders.py ---
# --- block: runner/throughput.py ---
# --- block: runner/workers.py ---
# --- block: runner/run.py ---
# --- block: runner/check.py ---
# --- block: runner/evaluate.py ---
# --- block: runner/cli.py ---


if __name__ == "__main__":
    sys.exit(main())

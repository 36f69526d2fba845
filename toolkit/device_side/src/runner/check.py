"""check: each artifact verified, then measured in its worker (the workers block), or in one run-group for the formats
that share one import (a child forked per artifact); the document check prints (the command line frames it).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any  # noqa: F401
from .base import RUNNER_VERSION, RunnerError
from .environment import artifact_format, default_threads, environment, find_record, read_manifest, verify_artifact
from .memory import note_memory, oom_kills, oom_rose, own_cgroup, own_peak_rss_mb
from .models import CPU_PROVIDER, LOADERS, XNNPACK, import_numpy, loaders_for
from .report import json_bytes, write_all
from .run import measure_loads, run_one
from .workers import empty_report, run_child, worker_cmd, worker_report

# --- shipped from here (the lines above are for the host's type checker) ---

# The formats whose runtime import dominates a worker's life (a loader's ``shares_import``: ExecuTorch's Python
# runtime imports torch, 6-10 s on an x86 host, 43-55 s under qemu): their artifacts share one import per check
# (run-group). TFLite and ONNX Runtime import in 0.1-1 s and keep a fresh process per artifact.
SHARED_IMPORT_FORMATS = tuple(sorted(set(loader.format for loader in LOADERS if loader.shares_import)))


_FORKED = []  # type: list  # the pid of run-group's current child, for its SIGTERM handler


def import_runtime(fmt):
    # type: (str) -> Any
    """Import the runtime of ``fmt`` (and numpy) in this process; the milliseconds it took, None when it failed
    (each artifact's worker then imports again and reports the failure as its own, ``missing_runtime`` etc.)."""
    t0 = time.perf_counter()
    try:
        import_numpy()
        for loader in loaders_for(fmt)[:1]:
            loader.import_once()
    except Exception:
        return None
    return round((time.perf_counter() - t0) * 1000.0, 3)


def _forked(bundle, name, opts):
    # type: (str, str, argparse.Namespace) -> dict
    """``run_one`` of one artifact in a child forked from this process, its report read from a pipe. The child
    starts where every other artifact's child starts (the runtime imported, nothing loaded): its ``load_ms`` is a
    first load and its ``peak_rss_mb`` its own (a forked process's ru_maxrss starts at the pages it maps, not at
    the parent's peak). A crash or a hang past --timeout ends that child only and is reported like ``run_child``'s."""
    import select
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    log = tempfile.TemporaryFile()  # the child's stderr: the tail of a crash goes into its report
    cgroup = own_cgroup()
    before = oom_kills(cgroup)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, write the report, leave without the parent's exit handlers
        try:
            os.close(read_end)
            os.dup2(log.fileno(), 2)
            os.dup2(2, 1)
            write_all(write_end, json_bytes(run_one(bundle, name, opts, verify=not opts.skip_verify)))
        finally:
            os._exit(0)
    _FORKED[:] = [pid]
    os.close(write_end)
    chunks, timed_out, deadline = [], False, time.monotonic() + opts.timeout  # type: (list, bool, float)
    while True:
        ready = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))[0]
        chunk = os.read(read_end, 1 << 16) if ready else b""
        if not ready:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    status = os.waitpid(pid, 0)[1]
    _FORKED[:] = []
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    log.close()
    sys.stderr.write(text)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return worker_report(name, opts, code, b"".join(chunks).decode("utf-8", "replace"), text[-1500:],
                          timed_out, opts.timeout, oom_rose(before, oom_kills(cgroup)) if code else None)


def run_group(bundle, names, opts, emit):
    # type: (str, list, argparse.Namespace, Any) -> None
    """Import the artifacts' runtime once, then measure each artifact in a child forked from this process
    (:func:`_forked`), emitting its report as soon as it ends. Each report carries ``import_ms`` (the one import,
    measured here) and ``worker`` (what the artifacts shared)."""

    def stop(signum, frame):
        # type: (int, Any) -> None
        for pid in _FORKED:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        formats = set(artifact_format(find_record(read_manifest(bundle), name)) for name in names)
    except RunnerError:  # each artifact's child reports it
        formats = set()
    import_ms = import_runtime(formats.pop()) if len(formats) == 1 else None
    worker = {"process": "forked", "artifacts": list(names), "import_ms": import_ms,
              "import_peak_rss_mb": own_peak_rss_mb()}
    for name in names:
        report = _forked(bundle, name, opts)
        if import_ms is not None and (report.get("runtime") or {}).get("name"):
            report["import_ms"] = import_ms  # the child found the runtime imported: the import is this one
        report["worker"] = worker
        emit(report)


def _group_children(bundle, names, opts):
    # type: (str, list, argparse.Namespace) -> dict
    """``run-group`` of ``names`` in one child process: name -> report. The group's own deadline is --timeout per
    artifact plus one for the import; reports it printed before it died or was stopped are kept."""
    seconds = opts.timeout * (len(names) + 1)
    cgroup = own_cgroup()
    before = oom_kills(cgroup)
    proc = subprocess.Popen(worker_cmd("run-group", bundle, names, opts), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.terminate()  # its SIGTERM handler kills the artifact's child it forked
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    found = {}  # type: dict
    for line in (out or "").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("artifact") in names:
            found[doc["artifact"]] = doc
    tail = (err or "")[-1500:]
    oom = oom_rose(before, oom_kills(cgroup)) if proc.returncode else None
    return dict((name, found.get(name) or worker_report(name, opts, proc.returncode, "", tail, timed_out, seconds,
                                                         oom))
                for name in names)


def check(opts):
    # type: (argparse.Namespace) -> dict
    doc = {"runner_version": RUNNER_VERSION, "ok": False, "environment": environment(), "reports": [],
           "error": None}  # type: Any
    note_memory()
    bundle = os.path.abspath(os.path.expanduser(opts.bundle))
    try:
        manifest = read_manifest(bundle)
        names = opts.artifact or [a["file"] for a in manifest["artifacts"]]
        for name in names:
            find_record(manifest, name)
    except RunnerError as exc:
        doc["error"] = exc.to_dict()
        return doc
    if not names:
        doc["error"] = RunnerError("bad_bundle", "manifest.json in {} lists no artifacts.".format(bundle),
                                   "Rebuild the bundle with `edgetk convert`.").to_dict()
        return doc
    failed = {}  # type: dict
    for name in names:
        record = find_record(manifest, name)
        try:
            verify_artifact(bundle, record)
        except RunnerError as exc:
            failed[name] = empty_report(name, opts.threads or default_threads(manifest, record), opts.runs,
                                        opts.warmup)
            failed[name]["error"] = exc.to_dict()
    grouped = {}  # type: dict
    for fmt in SHARED_IMPORT_FORMATS if hasattr(os, "fork") else ():
        group = [n for i, n in enumerate(names) if n not in failed and n not in names[:i]
                 and artifact_format(find_record(manifest, n)) == fmt]
        if group:
            grouped.update(_group_children(bundle, group, opts))
    for name in names:
        record = find_record(manifest, name)
        if name in failed:
            doc["reports"].append(failed[name])
            continue
        report = dict(grouped[name]) if name in grouped else run_child(bundle, name, opts)
        if getattr(opts, "loads", False) and report.get("error") is None:
            report["loads"] = measure_loads(bundle, name, opts, report)
        doc["reports"].append(report)
        note_memory()
    doc["ok"] = all(report_ok(r) for r in doc["reports"])
    return doc


def report_ok(report):
    # type: (dict) -> bool
    """Measured, outputs match, nothing fell off an accelerator it was built for (XNNPACK and the CPU provider
    are the CPU itself: their partial placement is reported, not failed), batched outputs equal per sample."""
    if report.get("error") is not None:
        return False
    if report.get("outputs_match") is not None and not report["outputs_match"].get("ok"):
        return False
    placement = report.get("placement") or {}
    if placement.get("fell_back") and placement.get("intended") not in (XNNPACK, CPU_PROVIDER):
        return False
    per_sample = (report.get("throughput") or {}).get("per_sample") or {}
    return per_sample.get("ok", True) is not False

"""A worker process per artifact: its command line (check's options passed on), and its fate turned into the
artifact's report: the report it printed, or killed, out of memory, crashed, timed out.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
from typing import Any  # noqa: F401
from .base import RunnerError, signal_name
from .memory import MEMORY_WORDS, children_peak_mb, oom_kills, oom_rose, out_of_memory, own_cgroup

# --- shipped from here (the lines above are for the host's type checker) ---

def empty_report(name, threads, runs, warmup):
    # type: (str, Any, int, int) -> dict
    """The report of ``name`` before anything is measured (every worker's fate starts from it)."""
    return {
        "artifact": name,
        "runtime": {"name": None, "version": None},
        "threads": threads,
        "load_ms": None,
        "first_inference_ms": None,
        "latency_ms": None,
        "runs": 0,
        "warmup": warmup,
        "peak_rss_mb": None,
        "outputs_match": None,
        "error": None,
    }


def _forwarded(opts):
    # type: (argparse.Namespace) -> list
    """The options of ``check`` that its ``run-one`` children take too."""
    args = []  # type: list
    for flag in ("profile", "throughput"):
        if getattr(opts, flag, False):
            args.append("--" + flag)
    for flag, dest in (("--profile-top", "profile_top"), ("--profile-runs", "profile_runs"),
                       ("--batch-sizes", "batch_sizes"), ("--in-flight", "in_flight"), ("--cache-dir", "cache_dir")):
        value = getattr(opts, dest, None)
        if value is not None:
            args += [flag, ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)]
    return args


def worker_cmd(command, bundle, names, opts, extra=()):
    # type: (str, str, list, argparse.Namespace, tuple) -> list
    """The command line of a worker (``run-one`` or ``run-group``) for ``names`` with ``check``'s options."""
    cmd = [sys.executable, os.path.abspath(__file__), command, "--bundle", bundle]
    for name in names:
        cmd += ["--artifact", name]
    cmd += ["--runs", str(opts.runs), "--warmup", str(opts.warmup), "--min-time", str(opts.min_time),
            "--timeout", str(opts.timeout), "--skip-verify"]
    if opts.threads:
        cmd += ["--threads", str(opts.threads)]
    if opts.runtime:
        cmd += ["--runtime", opts.runtime]
    if getattr(opts, "cold", False) and not extra:
        cmd.append("--cold")
    return cmd + _forwarded(opts) + list(extra)


def worker_report(name, opts, returncode, stdout, tail, timed_out, seconds, oom=None):
    # type: (str, argparse.Namespace, Any, str, str, bool, float, Any) -> dict
    """The report a worker printed for ``name``, or what its fate says: killed after ``seconds``, out of memory
    (``oom``: whether the kernel's OOM-kill count rose while it ran, None: unknown; or its stderr says so),
    killed by a signal (the runtime crashed on this artifact), or ended without a report."""
    report = empty_report(name, opts.threads, opts.runs, opts.warmup)
    path = os.path.join(os.path.abspath(os.path.expanduser(opts.bundle)), name)
    killed = returncode is not None and returncode < 0 and -returncode == getattr(signal, "SIGKILL", 9)
    words = MEMORY_WORDS.search(tail or "")
    if returncode and not timed_out and (killed and oom or words):
        how = ("the worker was killed by SIGKILL and the kernel's OOM-kill count rose" if killed and oom else
               "the worker ended with {}: {}".format(
                   "signal " + signal_name(-returncode) if returncode < 0 else "exit code {}".format(returncode),
                   words.group(0) if words else ""))
        report["error"] = out_of_memory(name, path, how, children_peak_mb())
        report["error"]["detail"] = tail or None
        return report
    if killed and not timed_out:
        report["error"] = RunnerError(
            "killed",
            "The worker measuring {} was killed by SIGKILL, {}.".format(
                name, "not by the kernel's out-of-memory killer (its OOM-kill count did not rise)" if oom is False
                else "and the kernel's OOM-kill count cannot be read here"),
            "Something on the device killed it (a watchdog, a supervisor, a container's memory limit); look at "
            "`dmesg` and the system journal.", detail=tail or None).to_dict()
        return report
    if timed_out:
        report["error"] = RunnerError(
            "crash", "Measuring {} did not finish within {:g} s; the worker was killed.".format(name, seconds),
            "Lower --runs/--min-time, or raise --timeout if the device is this slow.").to_dict()
        return report
    if returncode is not None and returncode < 0:
        report["error"] = RunnerError(
            "crash",
            "The worker measuring {} was killed by {} (the runtime crashed on this artifact).".format(
                name, signal_name(-returncode)),
            "Try another runtime (--runtime) or another artifact of the bundle; the stderr tail is in 'detail'.",
            detail=tail or None).to_dict()
        return report
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and parsed.get("artifact") == name:
            return parsed
    report["error"] = RunnerError(
        "crash", "The worker measuring {} exited with code {} without a report.".format(name, returncode),
        "Run `python3 edgetk_runner.py run-one --bundle DIR --artifact {}` on the device to see why.".format(
            name), detail=tail or None).to_dict()
    return report


def run_child(bundle, name, opts, extra=()):
    # type: (str, str, argparse.Namespace, tuple) -> dict
    """Run ``run-one`` for one artifact in a child process and turn its fate into a report."""
    cmd = worker_cmd("run-one", bundle, [name], opts, extra)
    cgroup = own_cgroup()
    before = oom_kills(cgroup)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=opts.timeout)
    except subprocess.TimeoutExpired:
        return worker_report(name, opts, None, "", "", True, opts.timeout)
    return worker_report(name, opts, proc.returncode, proc.stdout, (proc.stderr or "")[-1500:], False, 0.0,
                          oom_rose(before, oom_kills(cgroup)) if proc.returncode else None)

"""Out of memory named, not taken for a crash: MemAvailable, cgroup and ulimit limits, the kernel's OOM-kill
counts.
"""
import json
import os
import re
import sys
from typing import Any  # noqa: F401
from device_probe import probe_read
from .base import MEMORY_MARK, RunnerError

# --- shipped from here (the lines above are for the host's type checker) ---

MEMORY_WORDS = re.compile(r"MemoryError|bad_alloc|out of memory|Cannot allocate memory|failed to map segment|"
                          r"Failed to allocate|Unable to allocate|Memory allocation|ENOMEM", re.I)


OOM_HINT = ("Try a smaller artifact (an int8 one), fewer threads (--threads 1), or free memory on the device "
            "(stop other services, or raise its cgroup's memory limit or `ulimit -v`).")


CGROUP_ROOT = "/sys/fs/cgroup"


def _mb(value):
    # type: (Any) -> Any
    return None if value is None else round(value / (1024.0 * 1024.0), 1)


def own_cgroup():
    # type: () -> Any
    """The folder of this process's memory cgroup: v1's memory controller where it is mounted, else the v2
    unified hierarchy's (None where neither can be read)."""
    unified = None
    for line in (probe_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            folder = os.path.normpath(os.path.join(CGROUP_ROOT, "memory") + parts[2])
            if os.path.isdir(folder):
                return folder
        elif parts[0] == "0" and not parts[1]:
            unified = os.path.normpath(CGROUP_ROOT + parts[2])
    return unified if unified and os.path.isdir(unified) else None


def _counter(text, key):
    # type: (Any, str) -> Any
    match = re.search(r"^%s (\d+)\s*$" % key, text or "", re.M)
    return int(match.group(1)) if match else None


def oom_kills(cgroup=None):
    # type: (Any) -> dict
    """The kernel's OOM-kill counts: ``system`` (/proc/vmstat) and ``cgroup`` (the memory cgroup's memory.events,
    or v1's memory.oom_control), None each where it cannot be read."""
    group = None
    if cgroup:
        group = _counter(probe_read(os.path.join(cgroup, "memory.events")), "oom_kill")
        if group is None:
            group = _counter(probe_read(os.path.join(cgroup, "memory.oom_control")), "oom_kill")
    return {"system": _counter(probe_read("/proc/vmstat", 1 << 20), "oom_kill"), "cgroup": group}


def oom_rose(before, after):
    # type: (Any, Any) -> Any
    """True when an OOM-kill count rose between two :func:`oom_kills`, None when neither count could be read."""
    known = [k for k in ("system", "cgroup") if (before or {}).get(k) is not None and (after or {}).get(k) is not None]
    if not known:
        return None
    return any(after[k] > before[k] for k in known)


def _cgroup_value(folder, names):
    # type: (str, tuple) -> Any
    for name in names:
        text = (probe_read(os.path.join(folder, name)) or "").strip()
        if text.isdigit() and int(text) < (1 << 60):  # v2's "max" and v1's huge number: no limit
            return int(text)
    return None


def cgroup_limit_bytes(cgroup):
    # type: (Any) -> Any
    """The smallest memory limit from ``cgroup`` up to its hierarchy's root (a parent's limit binds too)."""
    limits = []
    folder = cgroup
    while folder and folder.startswith(CGROUP_ROOT) and len(folder) > len(CGROUP_ROOT):
        limit = _cgroup_value(folder, ("memory.max", "memory.limit_in_bytes"))
        if limit is not None:
            limits.append(limit)
        folder = os.path.dirname(folder)
    return min(limits) if limits else None


def available_memory_bytes():
    # type: () -> Any
    """MemAvailable from /proc/meminfo (None where it is missing)."""
    match = re.search(r"MemAvailable:\s+(\d+)\s+kB", probe_read("/proc/meminfo") or "")
    return int(match.group(1)) * 1024 if match else None


def own_peak_rss_mb():
    # type: () -> Any
    """The largest resident size this process reached, in MB (None where unknown)."""
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, AttributeError):
        return None
    return round(rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0, 1)


def children_peak_mb():
    # type: () -> Any
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    except (ImportError, AttributeError):
        return None
    return round(rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0, 1) or None


def peak_seen_mb():
    # type: () -> Any
    """The largest resident size this process or any of its ended children reached, in MB."""
    peaks = [p for p in (own_peak_rss_mb(), children_peak_mb()) if p]
    return max(peaks) if peaks else None


def memory_facts(cgroup=None):
    # type: (Any) -> dict
    """What memory the device has for this run: MemAvailable, the cgroup's limit and peak, ``ulimit -v``, the
    OOM-kill counts, the peak this process saw (MB; None where unknown)."""
    cgroup = cgroup or own_cgroup()
    address_space = None
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        address_space = None if soft == resource.RLIM_INFINITY else soft
    except (ImportError, AttributeError, ValueError):
        pass
    return {
        "available_mb": _mb(available_memory_bytes()),
        "cgroup": cgroup,
        "cgroup_limit_mb": _mb(cgroup_limit_bytes(cgroup)) if cgroup else None,
        "cgroup_peak_mb": _mb(_cgroup_value(cgroup, ("memory.peak", "memory.max_usage_in_bytes"))) if cgroup else None,
        "address_space_limit_mb": _mb(address_space),
        "oom_kills": oom_kills(cgroup),
        "peak_rss_mb": peak_seen_mb(),
    }


def note_memory(facts=None):
    # type: (Any) -> None
    """One MEMORY_MARK line on stderr: what the host reports when this whole process is killed."""
    try:
        sys.stderr.write(MEMORY_MARK + json.dumps(facts or memory_facts()) + "\n")
        sys.stderr.flush()
    except (IOError, OSError, ValueError):
        pass


def memory_line(text):
    # type: (str) -> str
    """The line of ``text`` that says memory ran out (numpy's ImportError is a page of advice), else its last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if MEMORY_WORDS.search(line)]
    return (said or lines or [text])[-1][:300]


def out_of_memory(name, path, how, peak_mb=None):
    # type: (str, Any, str, Any) -> dict
    """The ``out_of_memory`` error of artifact ``name``: ``how`` it ran out, with the file's size, the peak RSS
    seen, what the device has available and its limits, and what to try."""
    facts = memory_facts()
    try:
        size = os.path.getsize(path) if path else None
    except OSError:
        size = None
    peak = peak_mb or facts["peak_rss_mb"]
    how = memory_line(how)
    has = ["MemAvailable {:g} MB".format(facts["available_mb"]) if facts["available_mb"] is not None
           else "MemAvailable unknown"]
    if facts["cgroup_limit_mb"] is not None:
        has.append("cgroup limit {:g} MB".format(facts["cgroup_limit_mb"]))
    if facts["address_space_limit_mb"] is not None:
        has.append("ulimit -v {:g} MB".format(facts["address_space_limit_mb"]))
    message = "{} ran out of memory on the device ({}): file {}, peak seen {}; the device has {}.".format(
        name, how, "size unknown" if size is None else "{:.1f} MB".format(size / 1e6) if size >= 100000
        else "{:.1f} KB".format(size / 1e3), "{:g} MB".format(peak) if peak else "unknown", ", ".join(has))
    error = RunnerError("out_of_memory", message, OOM_HINT).to_dict()
    error["memory"] = dict(facts, file_bytes=size, peak_rss_mb=peak)
    return error

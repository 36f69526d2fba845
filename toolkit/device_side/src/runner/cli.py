"""The command line: the parser, selected_model (what an application on the device calls), main.
"""
import argparse
import json
import os
import sys
from typing import Any  # noqa: F401
from .base import (
    DEFAULT_RUNS, DEFAULT_TIMEOUT, DEFAULT_WARMUP, ONNX_RUNTIMES, RUNNER_VERSION, RunnerError, TFLITE_RUNTIMES,
    UsageFailure,
)
from .check import check, run_group
from .environment import probe
from .evaluate import run_eval, run_layers
from .memory import OOM_HINT, memory_facts
from .models import DEFAULT_PROFILE_RUNS, DEFAULT_PROFILE_TOP, LOADERS, toolkit_home
from .report import framed, json_bytes, write_all
from .run import LOAD_VARIANTS, run_one

# --- shipped from here (the lines above are for the host's type checker) ---

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageFailure(message)


def _positive_int(text):
    # type: (str) -> int
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _int_list(text):
    # type: (str) -> list
    """``1,4,8`` -> [1, 4, 8] (each at least 1)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected integers separated by commas, e.g. 1,4,8")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected integers >= 1 separated by commas, e.g. 1,4,8")
    return values


def _non_negative_float(text):
    # type: (str) -> float
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def selected_model(name, root=None):
    # type: (str, Any) -> str
    """The path of the model file a device should run for the installed bundle ``name``: the artifact the last
    ``edgetk check`` selected on this device (``<home>/bundles/NAME/selected.json``, ``<home>`` the toolkit's home:
    ``root``, else $EDGETK_HOME, else ~/.edgetk), or, when that
    selection is for another version than the installed one or there is none, the manifest's preferred
    artifact (the profile's proposal). In an application: ``path = edgetk_runner.selected_model("NAME")``."""
    bdir = os.path.join(os.path.expanduser(root) if root else toolkit_home(), "bundles", name)
    link = os.path.join(bdir, "current")
    if not os.path.islink(link):
        raise RunnerError("bad_bundle", "the bundle %r is not installed here" % name, "edgetk deploy it first")
    version = os.readlink(link).rstrip("/")
    try:
        with open(os.path.join(bdir, "selected.json")) as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        doc = {}
    if isinstance(doc, dict) and doc.get("version") == version and doc.get("artifact"):
        return os.path.join(bdir, version, doc["artifact"])
    with open(os.path.join(bdir, version, "manifest.json")) as handle:
        artifacts = json.load(handle).get("artifacts") or []
    chosen = next((a for a in artifacts if a.get("preferred")), artifacts[0] if artifacts else None)
    if chosen is None:
        raise RunnerError("bad_bundle", "the bundle %r has no artifacts" % name, "convert it again")
    return os.path.join(bdir, version, chosen["file"])


def build_parser():
    # type: () -> argparse.ArgumentParser
    parser = _Parser(prog="edgetk_runner.py", description="edgetk on-device runner (prints one JSON document)")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("probe", help="describe this device and its runtimes")
    p = sub.add_parser("memory", help="the memory this device has now, and its OOM-kill counts (stdlib only)")
    p.add_argument("--cgroup", default=None, help="the memory cgroup's folder (default: this process's)")
    p = sub.add_parser("selected", help="the path of the model file the last check selected for a bundle")
    p.add_argument("--name", required=True)
    p.add_argument("--root", default=None, help="the toolkit's home (default $EDGETK_HOME, else ~/.edgetk)")
    for command in ("check", "run-one", "run-group"):
        p = sub.add_parser(command, help={
            "check": "measure a bundle's artifacts", "run-one": "measure one artifact in this process",
            "run-group": "import the artifacts' runtime once, measure each in a process forked from this one "
                         "(one JSON line per artifact)"}[command])
        p.add_argument("--bundle", required=True)
        p.add_argument("--artifact", action="append", required=command != "check")
        p.add_argument("--runs", type=_positive_int, default=DEFAULT_RUNS)
        p.add_argument("--warmup", type=_positive_int, default=DEFAULT_WARMUP)
        p.add_argument("--min-time", type=_non_negative_float, default=0.0, dest="min_time")
        p.add_argument("--threads", type=_positive_int, default=None)
        p.add_argument("--runtime", choices=tuple(loader.runtime for loader in LOADERS), default=None)
        p.add_argument("--timeout", type=_non_negative_float, default=DEFAULT_TIMEOUT)
        p.add_argument("--cold", action="store_true",
                       help="drop the artifact from the page cache before loading it (a load as after a reboot)")
        p.add_argument("--profile", action="store_true", help="per-operator profile and placement per artifact")
        p.add_argument("--profile-top", type=_positive_int, default=DEFAULT_PROFILE_TOP, dest="profile_top")
        p.add_argument("--profile-runs", type=_positive_int, default=DEFAULT_PROFILE_RUNS, dest="profile_runs")
        p.add_argument("--throughput", action="store_true",
                       help="inferences/s at several batch sizes (dynamic batch) or requests in flight")
        p.add_argument("--batch-sizes", type=_int_list, default=None, dest="batch_sizes")
        p.add_argument("--in-flight", type=_int_list, default=None, dest="in_flight")
        p.add_argument("--loads", action="store_true",
                       help="cold, warm and optimized loads, each in a fresh process, with the first inference")
        p.add_argument("--cache-dir", default=None, dest="cache_dir",
                       help="device-side caches (TensorRT engines, optimized models); default <home>/cache")
        if command != "check":
            p.add_argument("--skip-verify", action="store_true")
        if command == "run-one":
            p.add_argument("--load-only", action="store_true", dest="load_only")
            p.add_argument("--load-variant", choices=LOAD_VARIANTS, default=None, dest="load_variant")
            p.add_argument("--fresh-cache", action="store_true", dest="fresh_cache")
    for command in ("eval", "layers"):
        p = sub.add_parser(command, help="the eval set through one artifact" if command == "eval" else
                           "the golden samples through one artifact, intermediate tensors kept")
        p.add_argument("--bundle", required=True)
        p.add_argument("--artifact", action="append", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--threads", type=_positive_int, default=None)
        p.add_argument("--runtime", choices=TFLITE_RUNTIMES + ONNX_RUNTIMES, default=None)
        if command == "eval":
            p.add_argument("--chunk", type=_positive_int, default=None, help="samples per chunk (default: by memory)")
        else:
            p.add_argument("--samples", type=_positive_int, default=2)
    return parser


def main(argv=None):
    # type: (Any) -> int
    out_fd = os.dup(1)
    os.dup2(2, 1)  # whatever a native library prints goes to stderr; the JSON goes to the saved fd
    words = sys.argv[1:] if argv is None else argv
    frame = framed if words[:1] == ["check"] else (lambda data: data)

    def emit(doc):
        # type: (dict) -> None
        sys.stdout.flush()
        write_all(out_fd, frame(json_bytes(doc)))

    try:
        opts = build_parser().parse_args(argv)
        if opts.command is None:
            raise UsageFailure("a command is required: probe, check, run-one, eval or layers")
        if getattr(opts, "runs", 1) == 0 and getattr(opts, "min_time", 0.0) == 0:
            raise UsageFailure("--runs must be at least 1 (or give --min-time)")
    except UsageFailure as exc:
        emit({"runner_version": RUNNER_VERSION, "ok": False, "environment": None, "reports": [],
              "error": RunnerError("usage", str(exc), "python3 edgetk_runner.py {probe | check --bundle DIR "
                                   "[--artifact FILE]... [--runs N] [--warmup N] [--min-time S] [--threads N] "
                                   "[--runtime NAME]}").to_dict()})
        return 2
    if opts.command == "probe":
        emit(probe())
    elif opts.command == "memory":
        emit(memory_facts(opts.cgroup if opts.cgroup and os.path.isdir(opts.cgroup) else None))
    elif opts.command == "selected":
        try:
            emit({"runner_version": RUNNER_VERSION, "ok": True, "path": selected_model(opts.name, opts.root)})
        except RunnerError as exc:
            emit({"runner_version": RUNNER_VERSION, "ok": False, "path": None, "error": exc.to_dict()})
            return 1
    elif opts.command == "check":
        try:
            doc = check(opts)
        except MemoryError:
            doc = {"runner_version": RUNNER_VERSION, "ok": False, "environment": None, "reports": [],
                   "error": RunnerError("out_of_memory", "The runner itself ran out of memory on the device "
                                        "(MemoryError); the device has {} MB available.".format(
                                            memory_facts()["available_mb"]), OOM_HINT).to_dict()}
        emit(doc)
        if doc["error"] and doc["error"]["kind"] == "usage":
            return 2
    elif opts.command == "run-group":
        run_group(os.path.abspath(os.path.expanduser(opts.bundle)), opts.artifact, opts, emit)
    elif opts.command in ("eval", "layers"):
        emit(run_eval(opts) if opts.command == "eval" else run_layers(opts))
    else:
        bundle = os.path.abspath(os.path.expanduser(opts.bundle))
        emit(run_one(bundle, opts.artifact[0], opts, verify=not opts.skip_verify))
    return 0

"""The device (the probe's block, each runtime's version) and the bundle (manifest, integrity, on-demand
files, an artifact's format and threads).
"""
import json
import os
import re
import sys
from typing import Any, Dict  # noqa: F401
from device_probe import probe_environment, probe_module_present
from shared import RUNTIME_ROWS, sha256_file
from .base import PACKAGES, REDEPLOY_HINT, RUNNER_VERSION, RunnerError

# --- shipped from here (the lines above are for the host's type checker) ---

# --- device probe: device_probe.py's block, inlined here when assembled (toolkit.device_side) ---


def environment():
    # type: () -> dict
    """What the device is and what state it is in right now (clocks, temperature): stdlib only."""
    return probe_environment()


def _normalize(name):
    # type: (str) -> str
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_version(dist):
    # type: (str) -> Any
    """Version of an installed distribution without importing it (importlib.metadata, else a dist-info scan)."""
    try:
        from importlib import metadata  # novermin (Python >= 3.8; older ones scan dist-info below)

        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    except ImportError:
        pass
    wanted = _normalize(dist)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            match = re.match(r"^(.+?)-([^-]+?)(?:-py[\d.]+)?\.(?:dist-info|egg-info)$", name)
            if match and _normalize(match.group(1)) == wanted:
                return match.group(2)
    return None


def runtime_versions():
    # type: () -> dict
    out = {}
    for runtime, (module, dists) in PACKAGES.items():
        version = None
        if probe_module_present(module):
            for dist in dists:
                version = dist_version(dist)
                if version:
                    break
            version = version or "unknown"
        out[runtime] = version
    return out


def onnxruntime_providers():
    # type: () -> list
    if not probe_module_present("onnxruntime"):
        return []
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except Exception:  # a broken install (e.g. numpy missing) is reported by the versions, not here
        return []


def probe():
    # type: () -> dict
    return {
        "runner_version": RUNNER_VERSION,
        "environment": environment(),
        "runtimes": runtime_versions(),
        "onnxruntime_providers": onnxruntime_providers(),
    }


def safe_name(name):
    # type: (Any) -> bool
    return (
        isinstance(name, str)
        and bool(name)
        and not name.startswith(("/", "~"))
        and "\\" not in name
        and ".." not in name.split("/")
    )


def read_manifest(bundle):
    # type: (str) -> dict
    path = os.path.join(bundle, "manifest.json")
    if not os.path.isdir(bundle):
        raise RunnerError("bad_bundle", "{} is not a directory.".format(bundle),
                          "Pass the bundle directory (on the device: ~/.edgetk/bundles/<name>/current).")
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, IOError):
        raise RunnerError("bad_bundle", "{} has no readable manifest.json.".format(bundle), REDEPLOY_HINT)
    except ValueError as exc:
        raise RunnerError("bad_bundle", "manifest.json in {} is not valid JSON ({}).".format(bundle, exc),
                          REDEPLOY_HINT)
    artifacts = data.get("artifacts") if isinstance(data, dict) else None
    if not isinstance(artifacts, list) or not all(isinstance(a, dict) and safe_name(a.get("file"))
                                                  for a in artifacts):
        raise RunnerError("bad_bundle", "manifest.json in {} has no valid 'artifacts' list.".format(bundle),
                          REDEPLOY_HINT)
    return data


# --- file hash: shared.py's block, inlined here when assembled (toolkit.device_side) ---


def find_record(manifest, name):
    # type: (dict, str) -> dict
    """The manifest's record of the artifact ``name`` (a usage error naming the ones it has)."""
    for record in manifest["artifacts"]:
        if record.get("file") == name:
            return record
    raise RunnerError("usage", "The bundle has no artifact {} (it has: {}).".format(
        name, ", ".join(str(a.get("file")) for a in manifest["artifacts"])))


def verify_artifact(bundle, record):
    # type: (str, dict) -> None
    """Refuse an artifact that is missing or whose sha256 differs from manifest.json."""
    name = record["file"]
    path = os.path.join(bundle, name)
    if not os.path.isfile(path):
        raise RunnerError("bad_bundle", "The artifact {} listed in manifest.json is missing.".format(name),
                          REDEPLOY_HINT)
    expected = record.get("sha256")
    actual = sha256_file(path)
    if not isinstance(expected, str) or actual != expected.lower():
        raise RunnerError(
            "integrity",
            "{} does not match its sha256 in manifest.json (expected {}, found {}); not measured.".format(
                name, expected, actual),
            REDEPLOY_HINT,
        )


ON_DEMAND_HINT = ("Remove the file on the device (the next `edgetk check` pushes the bundle's copy again, checked "
                  "on the host first).")


def on_demand_file(bundle, manifest, name):
    # type: (str, dict, str) -> str
    """The path of ``name``, a file the host pushes only when a check asks (the eval set, a layer probe), after
    checking it against its sha256 in manifest.json's ``on_demand``; refused when missing, unrecorded or
    different, like an artifact."""
    entry = [e for e in manifest.get("on_demand") or [] if isinstance(e, dict) and e.get("file") == name]
    if not entry or not safe_name(name):
        raise RunnerError("bad_bundle", "{} is not recorded in manifest.json (a bundle from an older edgetk); "
                          "not used.".format(name), "Convert the bundle again, then deploy it.")
    path = os.path.join(bundle, name)
    if not os.path.isfile(path) or os.path.islink(path):
        raise RunnerError("bad_bundle", "{} is missing on the device.".format(name),
                          "Run the check again: the host pushes it when a check asks for it.")
    expected = entry[0].get("sha256")
    actual = sha256_file(path)
    if not isinstance(expected, str) or actual != expected.lower():
        raise RunnerError("integrity", "{} does not match its sha256 in manifest.json (expected {}, found {}); "
                          "not used.".format(name, expected, actual), ON_DEMAND_HINT)
    return path


def artifact_format(record):
    # type: (Dict[str, Any]) -> str
    """The artifact's format: the manifest's, else its file's suffix (a format of RUNTIME_ROWS), else tflite (the
    first manifests named no format)."""
    formats = [row["format"] for row in RUNTIME_ROWS]
    fmt = record.get("format")
    if fmt in formats:
        return str(fmt)
    for suffix in formats:
        if str(record["file"]).endswith("." + suffix):
            return suffix
    return "tflite"


def default_threads(manifest, record):
    # type: (dict, dict) -> int
    for source in (record.get("recipe"), manifest.get("runtime_preferences")):
        if isinstance(source, dict):
            value = source.get("threads")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return os.cpu_count() or 1

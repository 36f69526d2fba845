"""What a push learns of the device: the probe's basics (device_probe.py's block, inlined into the shipped file),
the free disk where bundles go, the configured Python, zlib, and whether the runner's Python has numpy (asked in a
child that overlaps ``begin``'s other work).
"""
import json
import os
import shutil
import subprocess
from typing import Any, Dict, List, Literal, Optional, Tuple, Union  # noqa: F401 (type comments)
from device_probe import probe_basics
from .answer import emit
from .layout import BASE, existing_dir, free_bytes, makedirs, read_config_python

# --- shipped from here (the lines above are for the host's type checker) ---

def device_info():
    # type: () -> Dict[str, Any]
    """The probe's basics plus what a push needs: free disk where bundles go, the configured Python, zlib."""
    info = probe_basics()
    info.update({
        # where bundles go: ~/.edgetk may be its own filesystem (an SD card's data partition)
        "free_bytes": free_bytes(existing_dir(BASE)),
        "config_python": read_config_python(),
        "zlib": zlib_available(),
    })
    return info


def cmd_info():
    # type: () -> None
    emit(device_info())


def zlib_available():
    # type: () -> bool
    try:
        import zlib  # noqa: F401  (a Python built without zlib cannot inflate: deploy then sends files as they are)
    except ImportError:
        return False
    return True


NUMPY_CHECK = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('numpy') else 1)"


NUMPY_OK = os.path.join(BASE, "helper", "numpy-ok.json")  # Pythons seen with numpy (only positives are kept)


def _numpy_ok_list():
    # type: () -> List[str]
    try:
        with open(NUMPY_OK) as handle:
            data = json.load(handle)
        return data if isinstance(data, list) else []
    except (OSError, IOError, ValueError):
        return []


def start_numpy_check(python):
    # type: (str) -> Tuple[str, Optional[str], Union[None, Literal[False], subprocess.Popen[bytes]]]
    """Whether the runner's Python has numpy, asked in a child started now and read at the end of begin (so it
    overlaps the lock and the hashing); None when that Python does not start. A Python once seen with numpy is
    not asked again (a Python that lacks it is asked every time, so a later `edgetk devices setup` shows)."""
    python = python or read_config_python() or "python3"
    found = shutil.which(python) if os.sep not in python else python
    # the path as named, not resolved: a venv's python is a link to the base interpreter, with other packages
    key = os.path.abspath(found) if found else None
    if key and key in _numpy_ok_list():
        return python, key, None
    import subprocess  # only now: importing it costs a slow board tens of ms, and most pushes need no child

    try:
        null = open(os.devnull, "wb")
        return python, key, subprocess.Popen([python, "-c", NUMPY_CHECK], stdout=null, stderr=null)
    except (OSError, IOError):
        return python, key, False


def finish_numpy_check(started):
    # type: (Tuple[str, Optional[str], Union[None, Literal[False], subprocess.Popen[bytes]]]) -> Dict[str, Any]
    python, key, proc = started
    if proc is None:
        return {"runner_python": python, "numpy": True}
    if proc is False:
        return {"runner_python": python, "numpy": None}
    try:
        code = proc.wait(timeout=30)
    except Exception:
        proc.kill()
        code = None
    if code == 0 and key:
        try:
            seen = _numpy_ok_list()[-20:] + [key]
            tmp = "%s.%d" % (NUMPY_OK, os.getpid())
            makedirs(os.path.dirname(NUMPY_OK))
            with open(tmp, "w") as handle:
                json.dump(seen, handle)
            os.replace(tmp, NUMPY_OK)
        except (OSError, IOError):
            pass
    return {"runner_python": python, "numpy": None if code is None else code == 0}

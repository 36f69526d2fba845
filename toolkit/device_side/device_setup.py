# mypy: ignore-errors
"""The device's side of ``edgetk devices setup`` (toolkit/delivery/provisioning.py): small steps, each printing
one JSON document, run as ``python -c <this file> COMMAND ARGS...`` with the device's base python or the venv's
(setup runs before anything is installed there).

Commands::

    venv-state VENV_DIR      {"state": "ok"|"broken"|"absent"|"foreign", "python": path, "venv": path}
    remove-venv VENV_DIR     removes a broken venv (only a directory holding pyvenv.cfg); prints {}
    list DIR                 {file name: size} of the regular files in DIR (creating it)
    record PYTHON            merges {"python": PYTHON} into ~/.edgetk/config.json atomically; prints the file
    verify MODULE=DIST...    imports each module (proof it loads): {"versions": {dist: version or null}, "errors"}

Python >= 3.6 (vermin-checked), stdlib only, imports nothing from toolkit.
"""
import importlib
import json
import os
import shutil
import subprocess
import sys


def venv_state(venv):
    venv = os.path.abspath(os.path.expanduser(venv))
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(venv):
        state = "absent"
    elif not os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        state = "foreign"
    else:
        try:
            state = "ok" if subprocess.call([python, "-c", "pass"]) == 0 else "broken"
        except OSError:
            state = "broken"
    return {"state": state, "python": python, "venv": venv}


def remove_venv(venv):
    venv = os.path.abspath(os.path.expanduser(venv))
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        shutil.rmtree(venv)
    return {}


def list_files(directory):
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    return {n: os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
            if os.path.isfile(os.path.join(directory, n))}


def record(python):
    path = os.path.join(os.path.expanduser("~"), ".edgetk", "config.json")
    if not os.path.isdir(os.path.dirname(path)):
        os.makedirs(os.path.dirname(path), 0o755)
    try:
        with open(path) as handle:
            data = json.load(handle)
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data["python"] = python
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)
    return data


def verify(*items):
    try:
        from importlib import metadata
    except ImportError:
        metadata = None
    out, errors = {}, {}
    for item in items:
        module, dist = item.split("=", 1)
        try:
            importlib.import_module(module)
        except Exception as exc:
            errors[dist] = "%s: %s" % (type(exc).__name__, exc)
            out[dist] = None
            continue
        try:
            out[dist] = metadata.version(dist) if metadata else "unknown"
        except Exception:
            out[dist] = "unknown"
    return {"versions": out, "errors": errors}


COMMANDS = {"venv-state": venv_state, "remove-venv": remove_venv, "list": list_files, "record": record,
            "verify": verify}

if __name__ == "__main__":
    sys.stdout.write(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])) + "\n")

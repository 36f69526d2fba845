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
    pte-runner-install FILE  copies the native .pte runner FILE into executorch's lib/ folder (beside the runtime
                             libraries it links, where the runner looks for it) and starts it once (proof its
                             libraries load): {"ok", "binary", "output"}
    pte-runner-build CPP ARGV_JSON   compiles CPP there with the device's own compiler: ARGV_JSON is the host's
                             command line with {compiler}, {include}, {lib} and {out} to fill in:
                             {"ok", "binary", "compiler", "output"}

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


PTE_RUNNER = "edgetk-pte-runner"  # the name edgetk_runner.py looks for in executorch's lib/ folder


def _executorch_lib():
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        if os.path.isdir(os.path.join(folder, "lib")):
            return os.path.join(folder, "lib")
    return None


def _try_runner(binary):
    try:
        proc = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    text = (proc.stdout + proc.stderr).decode("utf-8", "replace").strip()
    return proc.returncode == 2 and "usage:" in text, text[-600:]  # no arguments: its usage line, exit 2


def pte_runner_install(source):
    lib = _executorch_lib()
    if lib is None:
        return {"ok": False, "binary": None, "output": "executorch is not installed in this python"}
    binary = os.path.join(lib, PTE_RUNNER)
    tmp = binary + ".tmp"
    shutil.copyfile(os.path.expanduser(source), tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, binary)
    ok, output = _try_runner(binary)
    return {"ok": ok, "binary": binary, "output": output}


def pte_runner_build(source, argv_json):
    lib = _executorch_lib()
    if lib is None:
        return {"ok": False, "binary": None, "compiler": None, "output": "executorch is not installed here"}
    compiler = next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
    if compiler is None:
        return {"ok": False, "binary": None, "compiler": None, "output": "no C++ compiler (g++, c++, clang++)"}
    binary = os.path.join(lib, PTE_RUNNER)
    fill = {"compiler": compiler, "include": os.path.join(os.path.dirname(lib), "include"), "lib": lib,
            "out": binary + ".tmp", "source": os.path.expanduser(source)}
    argv = [part.format(**fill) for part in json.loads(argv_json)]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = proc.stdout.decode("utf-8", "replace").strip()[-1500:]
    if proc.returncode:
        return {"ok": False, "binary": None, "compiler": compiler, "output": output}
    os.replace(binary + ".tmp", binary)
    ok, tried = _try_runner(binary)
    return {"ok": ok, "binary": binary, "compiler": compiler, "output": output or tried}


COMMANDS = {"venv-state": venv_state, "remove-venv": remove_venv, "list": list_files, "record": record,
            "verify": verify, "pte-runner-install": pte_runner_install, "pte-runner-build": pte_runner_build}

if __name__ == "__main__":
    sys.stdout.write(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])) + "\n")

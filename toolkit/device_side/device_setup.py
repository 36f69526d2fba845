# mypy: ignore-errors
"""The device's side of ``edgetk devices setup`` (toolkit/delivery/provisioning.py): small steps, each printing
one JSON document, run as ``python -c <this file> COMMAND ARGS...`` with the device's base python or the venv's
(setup runs before anything is installed there).

Commands::

    venv-state VENV_DIR      {"state": "ok"|"broken"|"absent"|"foreign", "python": path, "venv": path}
    remove-venv VENV_DIR     removes a broken venv (only a directory holding pyvenv.cfg); prints {}
    list DIR                 {file name: size} of the regular files in DIR (creating it)
    record PYTHON [HOME]     merges {"python": PYTHON} into HOME/config.json (HOME: the toolkit's home on the
                             device, default $EDGETK_HOME, else ~/.edgetk) atomically; prints the file
    writable DIR...          for each DIR (made for the test, then removed): {"dirs": {DIR: {"ok", "error",
                             "noexec"}}}, so
                             setup knows it can write there (and load native code from there) before it
                             downloads anything
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


def record(python, home=None):
    home = home or os.environ.get("EDGETK_HOME") or os.path.join("~", ".edgetk")
    path = os.path.join(os.path.expanduser(home), "config.json")
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


ST_NOEXEC = 8  # statvfs f_flag on Linux (os.ST_NOEXEC, named only from Python 3.7 on some builds)


def writable(*dirs):
    """Whether each directory can be made and written (a file created, synced and removed there), and whether
    its filesystem is mounted noexec (native libraries cannot be loaded from it)."""
    out = {}
    for directory in dirs:
        path = os.path.abspath(os.path.expanduser(directory))
        entry = {"ok": False, "error": None, "noexec": False}
        made = []  # the directories this check makes, removed again after it (deepest first)
        parent = path
        while not os.path.isdir(parent) and os.path.dirname(parent) != parent:
            made.append(parent)
            parent = os.path.dirname(parent)
        try:
            if made:
                os.makedirs(path, 0o755)
            probe = os.path.join(path, ".edgetk-write-test.%d" % os.getpid())
            with open(probe, "wb") as handle:
                handle.write(b"x")
                os.fsync(handle.fileno())
            os.remove(probe)
            entry["ok"] = True
            entry["noexec"] = bool(os.statvfs(path).f_flag & ST_NOEXEC)
        except OSError as exc:
            entry["error"] = "%s: %s" % (exc.strerror or exc, getattr(exc, "filename", None) or path)
        for directory_made in made:
            try:
                os.rmdir(directory_made)
            except OSError:
                pass
        out[directory] = entry
    return {"dirs": out}


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
            "verify": verify, "writable": writable, "pte-runner-install": pte_runner_install,
            "pte-runner-build": pte_runner_build}

if __name__ == "__main__":
    sys.stdout.write(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])) + "\n")

#!/usr/bin/env python3
# mypy: ignore-errors
"""The ``edgetk`` Mender Update Module (Update Modules protocol v3): installs an edge-toolkit bundle that a
Mender artifact carries, checks it on the device, and lets Mender roll it back when the check fails.

Install on the device once as ``/usr/share/mender/modules/v3/edgetk`` (mode 0755). ``edgetk export BUNDLE
--mender`` writes the artifact; its payload is ``bundle.tar`` (the bundle directory), ``device_helper.py``
(the same helper ``edgetk deploy`` runs, from the toolkit that built the artifact) and ``edgetk-meta.json``
(name, version, files with sha256, gates, runs). Python >= 3.6, stdlib only; imports nothing from toolkit.

States (Mender calls ``edgetk STATE FILES_DIR``):

- ``ArtifactInstall``: under the helper's bundle lock, ``prepare`` the version directory, copy in the files it
  lists as missing, then ``finish``: every file's sha256 is verified and ``current`` is switched with one
  rename(2), exactly as a push does. Interrupted before ``finish``, ``current`` is untouched.
- ``ArtifactCommit``: runs the bundle's runner (``check``) and fails (exit 1) when an artifact does not run,
  its outputs differ from the golden outputs, or its p90 is over the budget: Mender then rolls back. The
  report is left in ``<home>/reports/`` for ``edgetk history import`` (or the next SSH check).
- ``ArtifactRollback``: when this update made the new version current, switch back with the helper's
  ``rollback`` (which verifies the older version's files first), or remove a first install.
- ``SupportsRollback``: Yes. ``NeedsArtifactReboot``: No. Other states: nothing to do.

Where: ``<home>`` is ``$EDGETK_HOME`` (the toolkit's home, as the inventory's ``home`` names it for SSH deploys),
else ``$EDGETK_MENDER_HOME/.edgetk`` (older setups), else ``/data/edgetk/.edgetk`` (Mender's persistent
partition); the runner's Python is ``$EDGETK_MENDER_PYTHON``, else ``<home>/config.json``'s ``python`` (what
``edgetk devices setup`` records), else ``python3``.
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

# the toolkit's home on the device ($EDGETK_HOME, the name every device-side program reads it by; the same
# place `home` names in the inventory for SSH deploys), else .edgetk under $EDGETK_MENDER_HOME (older setups),
# else /data/edgetk/.edgetk on Mender's persistent partition
HOME = os.path.abspath(os.environ.get("EDGETK_HOME") or os.path.join(
    os.environ.get("EDGETK_MENDER_HOME") or "/data/edgetk", ".edgetk"))
ENV = dict(os.environ, EDGETK_HOME=HOME)  # what the helper and the runner run with
STATE_FILE = "edgetk-state.json"


def log(message):
    sys.stderr.write("edgetk: %s\n" % message)
    sys.stderr.flush()


def payload(files_dir, name):
    return os.path.join(files_dir, "files", name)


def load_meta(files_dir):
    with open(payload(files_dir, "edgetk-meta.json")) as handle:
        return json.load(handle)


def helper(files_dir, *args):
    """Run the bundle's device helper (from the payload) in HOME; its JSON answer, or exit with its error."""
    argv = [sys.executable, "-S", payload(files_dir, "device_helper.py")] + list(args)
    proc = subprocess.run(argv, cwd=HOME, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    answer = framed(files_dir, proc.stdout)
    if answer is None:
        answer = {"error": (proc.stdout + proc.stderr).strip()[-500:]}
    if proc.returncode != 0:
        log("helper %s failed: %s" % (args[0], answer.get("error") or answer))
        sys.exit(1)
    return answer


def helper_module(files_dir):
    """The payload's device_helper.py as a module (its top level only defines things), for its constants."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("edgetk_device_helper", payload(files_dir, "device_helper.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def framed(files_dir, text):
    """The helper's JSON answer from its stdout: it frames it (FRAME_BEGIN ... FRAME_END) so that other output
    around it cannot break it."""
    helper_code = helper_module(files_dir)
    start = text.rfind(helper_code.FRAME_BEGIN)
    if start < 0:
        return None
    body = text[start + len(helper_code.FRAME_BEGIN):]
    end = body.find(helper_code.FRAME_END)
    try:
        return json.loads(body[:end] if end >= 0 else body)
    except ValueError:
        return None


def save_state(files_dir, state):
    path = os.path.join(files_dir, STATE_FILE)
    with open(path + ".tmp", "w") as handle:
        json.dump(state, handle)
    os.replace(path + ".tmp", path)


def load_state(files_dir):
    try:
        with open(os.path.join(files_dir, STATE_FILE)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def current_of(name):
    link = os.path.join(HOME, "bundles", name, "current")
    try:
        return os.readlink(link)
    except OSError:
        return None


def install(files_dir):
    meta = load_meta(files_dir)
    name, version, files = meta["name"], meta["version"], meta["files"]
    if not os.path.isdir(HOME):
        os.makedirs(HOME, 0o755)
    previous = current_of(name)
    save_state(files_dir, {"previous": previous, "installed": False})
    token = "mender-%d-%d" % (os.getpid(), int(time.time()))
    helper(files_dir, "lock", name, "300", "900", token)
    try:
        plan = helper(files_dir, "prepare", name, version, json.dumps(files))
        vdir = os.path.join(HOME, "bundles", name, version)
        wanted = set(plan.get("missing") or [])
        with tarfile.open(payload(files_dir, "bundle.tar")) as tar:
            for member in tar.getmembers():
                if member.name in wanted and member.isfile():
                    source = tar.extractfile(member)
                    target = os.path.join(vdir, member.name)  # names the helper validated in prepare
                    with open(target + ".part", "wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
                    os.replace(target + ".part", target)
                    wanted.discard(member.name)
        if wanted:
            log("the artifact lacks files the bundle lists: %s" % ", ".join(sorted(wanted)))
            sys.exit(1)
        if os.environ.get("EDGETK_MENDER_TEST_STOP_BEFORE_SWITCH"):  # tests: a power cut before the switch
            os.kill(os.getpid(), 9)
        helper(files_dir, "finish", name, version, json.dumps(files), str(meta.get("keep", 3)), token)
    except SystemExit:
        subprocess.run([sys.executable, "-S", payload(files_dir, "device_helper.py"), "unlock", name, token],
                       cwd=HOME, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        raise
    save_state(files_dir, {"previous": previous, "installed": True})
    log("%s %s is current (was %s)" % (name, version[:12], (previous or "none")[:12]))


def runner_python():
    if os.environ.get("EDGETK_MENDER_PYTHON"):
        return os.environ["EDGETK_MENDER_PYTHON"]
    try:
        with open(os.path.join(HOME, "config.json")) as handle:
            python = json.load(handle).get("python")
        if python:
            return python
    except (OSError, ValueError):
        pass
    return "python3"


def gate(doc, budget_ms):
    """The reasons the check fails (empty: it passed): the host's gates minus the regression baseline."""
    reasons = []
    if doc.get("error"):
        reasons.append("the runner failed: %s" % (doc["error"].get("message") or doc["error"]))
    reports = doc.get("reports") or []
    if not reports and not reasons:
        reasons.append("the runner reported no artifacts")
    for report in reports:
        artifact = report.get("artifact")
        if report.get("error"):
            reasons.append("%s: could not run: %s" % (artifact, report["error"].get("message")))
            continue
        if not (report.get("outputs_match") or {}).get("ok"):
            reasons.append("%s: outputs differ from the golden outputs" % artifact)
        p90 = (report.get("latency_ms") or {}).get("p90")
        if budget_ms is not None and (p90 is None or p90 > budget_ms):
            reasons.append("%s: p90 %s ms exceeds the budget of %g ms" % (artifact, p90, budget_ms))
    return reasons


REPORT_MARK = "\x1eedgetk-report"  # the runner's frame (edgetk_runner.py framed)


def unframe(stdout):
    """The JSON of the runner's framed report (its length and sha256 checked), else '' (no whole frame)."""
    import hashlib

    at = stdout.rfind(REPORT_MARK + " ")
    if at < 0:
        return ""
    head, _, rest = stdout[at:].partition("\n")
    try:
        _, length, digest = head.split(" ")
        body = rest[:int(length)]
    except ValueError:
        return ""
    whole = rest[int(length):].startswith(REPORT_MARK + "-end\n")
    if whole and hashlib.sha256(body.encode("utf-8")).hexdigest() == digest:
        return body
    return ""


def report_text(stdout):
    """The runner's report: framed, or the plain JSON a runner before the frame printed (runner_version 1)."""
    text = unframe(stdout)
    if text:
        return text
    try:
        plain = json.loads(stdout.strip() or "null")
    except ValueError:
        return ""
    return stdout.strip() if isinstance(plain, dict) and plain.get("runner_version") == "1" else ""


def commit(files_dir):
    meta = load_meta(files_dir)
    name, version = meta["name"], meta["version"]
    vdir = os.path.join(HOME, "bundles", name, version)
    argv = [runner_python(), os.path.join(vdir, meta.get("runner") or "edgetk_runner.py"), "check", "--bundle", vdir,
            "--runs", str(meta.get("runs", 20)), "--warmup", str(meta.get("warmup", 3))]
    proc = subprocess.run(argv, cwd=HOME, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    try:
        doc = json.loads(report_text(proc.stdout)) if proc.returncode == 0 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):  # no whole run, no whole frame: no report (docs/runner.md, "The frame")
        why = "killed by signal %d" % -proc.returncode if proc.returncode < 0 else "exit code %d" % proc.returncode
        doc = {"error": {"kind": "no_report", "message": "the runner gave no whole report (%s): %s" % (
            why, (proc.stderr.strip().splitlines() or ["no output"])[-1])}}
    reasons = gate(doc, meta.get("budget_ms"))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    reports = os.path.join(HOME, "reports")
    if not os.path.isdir(reports):
        os.makedirs(reports, 0o755)
    out = os.path.join(reports, "%s-%s-%s.json" % (name, version[:12], stamp))
    record = {"schema": "edgetk-mender-check/1", "bundle": name, "version": version, "created_at": stamp,
              "device": os.environ.get("EDGETK_DEVICE_NAME") or os.uname()[1], "passed": not reasons,
              "reasons": reasons, "budget_ms": meta.get("budget_ms"), "runner": doc}
    with open(out + ".tmp", "w") as handle:
        json.dump(record, handle, indent=1)
    os.replace(out + ".tmp", out)
    if reasons:
        log("the check failed, the update will be rolled back: " + "; ".join(reasons))
        sys.exit(1)
    log("the check passed (report: %s)" % out)


def rollback(files_dir):
    meta = load_meta(files_dir)
    state = load_state(files_dir)
    name, version = meta["name"], meta["version"]
    if current_of(name) != version:
        log("%s: the new version never became current; nothing to roll back" % name)
        return
    if state.get("previous") and state["previous"] != version:
        helper(files_dir, "rollback", name)
        log("%s: back to %s" % (name, state["previous"][:12]))
    elif not state.get("previous"):
        helper(files_dir, "remove", name)
        log("%s: a first install was removed" % name)


def main(argv):
    if len(argv) < 2:
        log("usage: edgetk STATE FILES_DIR")
        return 2
    state, files_dir = argv[0], argv[1] if len(argv) > 1 else ""
    if state == "SupportsRollback":
        print("Yes")
    elif state == "NeedsArtifactReboot":
        print("No")
    elif state == "ArtifactInstall":
        install(files_dir)
    elif state == "ArtifactCommit":
        commit(files_dir)
    elif state == "ArtifactRollback":
        rollback(files_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

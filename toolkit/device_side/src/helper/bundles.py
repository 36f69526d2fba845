"""The installed bundles, one verb each: ``rollback`` (to the version before, verified first), ``select`` and
``selected`` (the artifact the last check chose, beside ``current``), ``status`` and ``remove``.
"""
import json
import os
import shutil
import time
from typing import Any, Dict, Optional  # noqa: F401 (type comments)
from .answer import emit, fail
from .layout import BASE, bundle_dir, load_history, read_current, safe_rel
from .storage import switch_current, verify, write_durably
from .locks import acquire_lock, release_lock

# --- shipped from here (the lines above are for the host's type checker) ---

def cmd_rollback(name):
    # type: (str) -> None
    bdir = bundle_dir(name)
    if not os.path.isdir(bdir):
        fail("not_installed", "the bundle %r is not installed" % name)
    current = read_current(name)
    history = load_history(name)
    versions = [h["version"] for h in history]
    if current not in versions or versions.index(current) == 0:
        fail("no_previous", "there is no version before %s to roll back to" % (current or "none")[:12])
    entry = history[versions.index(current) - 1]
    bad = verify(os.path.join(bdir, entry["version"]), entry.get("files", {}))
    if bad:
        fail("integrity", "the previous version is damaged: " + ", ".join(bad), bad=bad)
    switch_current(name, entry["version"])
    emit({"current": entry["version"], "previous": current})


SELECTED = "selected.json"  # beside ``current``: the artifact the last check selected (toolkit/checks/selection.py)


def read_selected(name):
    # type: (str) -> Optional[Dict[str, Any]]
    try:
        with open(os.path.join(bundle_dir(name), SELECTED)) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def cmd_select(name, doc_json, request=None, timeout="120"):
    # type: (str, str, Optional[str], str) -> None
    """Write the selection of the installed version: a compare-and-swap on ``current``, under the bundle's lock
    (so no push's switch falls between the comparison and the write), written durably. When another version
    was installed since this selection's check began, refuse (``not_current``) naming that version and who
    installed it: that version's own check decides its selection."""
    bdir = bundle_dir(name)
    if not os.path.isdir(bdir):
        fail("not_installed", "the bundle %r is not installed" % name)
    try:
        doc = json.loads(doc_json)
    except ValueError:
        fail("usage", "the selection is not JSON")
    token = "select-%d-%d" % (os.getpid(), int(time.time() * 1000))
    acquire_lock(name, float(timeout), request or '{"what": "selection"}', token)
    try:
        current = read_current(name)
        if current is None or not isinstance(doc, dict) or doc.get("version") != current:
            by = next((h.get("by") for h in load_history(name) if h.get("version") == current), None)
            fail("not_current", "the selection is for version %s, but %s is installed"
                 % (str(doc.get("version") if isinstance(doc, dict) else None)[:12], (current or "none")[:12]),
                 current=current, by=by)
        artifact = doc.get("artifact")
        if artifact is not None and not os.path.isfile(os.path.join(bdir, current, safe_rel(artifact))):
            fail("usage", "the selected artifact %r is not in version %s" % (artifact, current[:12]))
        write_durably(os.path.join(bdir, SELECTED), json.dumps(doc, indent=1, sort_keys=True))
    finally:
        release_lock(name, token)
    emit({"selected": artifact})


def cmd_selected(name):
    # type: (str) -> None
    emit({"selected": read_selected(name)})


def cmd_status():
    # type: () -> None
    root = os.path.join(BASE, "bundles")
    out = {}
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            if name.startswith(".") or not os.path.isdir(os.path.join(root, name)):
                continue
            history = load_history(name)
            out[name] = {
                "current": read_current(name),
                "selected": read_selected(name),
                "versions": [{"version": h.get("version"), "installed_at": h.get("installed_at"), "by": h.get("by")}
                             for h in history],
            }
    emit({"bundles": out})


def cmd_remove(name):
    # type: (str) -> None
    bdir = bundle_dir(name)
    if not os.path.isdir(bdir):
        fail("not_installed", "the bundle %r is not installed" % name)
    shutil.rmtree(bdir)
    emit({"removed": name})

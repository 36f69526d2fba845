"""``edgetk history import FILE|DIR...``: check reports that devices left behind (the Mender Update Module
writes one per update to ``reports/`` in the toolkit's home there, ``$EDGETK_HOME``) recorded in the history like
any other check.

The device already gated the check (error, golden outputs, budget); its verdict is kept as it is, with a note
that no regression baseline was compared there. A report's run id is its file's sha256, so importing the same
file twice stores it once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from toolkit.errors import UsageError
from toolkit.model.records import JsonDict
from toolkit.store.history import Store

SCHEMA = "edgetk-mender-check/1"
_NOTE = "regression: gated on the device (Mender update module) without a baseline"


@dataclass(frozen=True)
class ImportResult:
    store: str
    files: int
    checks: int
    imported: int

    def to_dict(self) -> JsonDict:
        return {"store": self.store, "files": self.files, "checks": self.checks, "imported": self.imported}


def _files(paths: Sequence[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(path.glob("*.json")))
        elif path.is_file():
            out.append(path)
        else:
            raise UsageError(f"{path} does not exist.", hint="Pass report files or the folder they were copied to.")
    if not out:
        raise UsageError("No report files to import.", hint="Pass the .json files from reports/ in the toolkit's home "
                         "on the device (the Mender module's default: /data/edgetk/.edgetk/reports/).")
    return out


def _when(stamp: str) -> str:
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%dT%H:%M:%S.000000+00:00")
    except (TypeError, ValueError):
        raise UsageError(f"created_at {stamp!r} is not a UTC time stamp like 20261201T100934Z.") from None


def import_reports(paths: Sequence[Path], store: Store, *, device: str | None = None) -> ImportResult:
    """Record every report file (``device`` overrides the name the device gave itself)."""
    from toolkit.model.runner_report import parse_runner_output
    from toolkit.errors import DeviceError
    from toolkit.model.device_records import GateResult

    files = _files([Path(p) for p in paths])
    checks = imported = 0
    for path in files:
        raw = path.read_bytes()
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UsageError(f"{path} is not JSON ({exc}).") from None
        if not isinstance(record, dict) or record.get("schema") != SCHEMA:
            raise UsageError(f"{path} is not a device check report ({SCHEMA}).",
                             hint="Import the files the edgetk Mender update module wrote to reports/ in the "
                             "toolkit's home.")
        name = device or str(record.get("device") or "unknown")
        try:
            reports = parse_runner_output(json.dumps(record.get("runner") or {}), device=name, artifacts=[])
        except DeviceError:
            reports = []
        reasons = [str(r) for r in record.get("reasons") or ()]
        gated = []
        for report in reports:
            mine = [r for r in reasons if r.startswith(f"{report.artifact}:")]
            general = [r for r in reasons if ":" not in r.split(" ", 1)[0]]
            failures = tuple(mine + general)
            gated.append(replace(report, gates=GateResult(not failures, failures, (_NOTE,))))
        run_id = hashlib.sha256(raw).hexdigest()[:12]
        ids = store.record(gated, bundle=str(record["bundle"]), version=str(record["version"]), run_id=run_id,
                           created_at=_when(str(record.get("created_at"))), skip_existing=True)
        checks += len(ids)
        imported += 1 if gated else 0
    return ImportResult(store.location.display, len(files), checks, imported)

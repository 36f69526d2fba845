"""The public Python API: the CLI's commands as keyword-only functions that return the data the CLI prints.

::

    import toolkit

    built = toolkit.convert("digits.keras", target="raspberry-pi-4", calibration="calib.npz")
    fleet = toolkit.deploy(built.bundle_dir, devices=["pi@192.168.1.40"], check=True, budget_ms=50)
    print(fleet.passed, fleet.to_dict())            # the same document as `edgetk deploy --check --json`
    result = toolkit.run("digits.keras", devices=["local"], calibration="calib.npz")
    print(result.exit_code, result.to_dict())       # the same document as `edgetk run --json`

Every command of ``edgetk`` calls exactly one function here and renders its result; ``result.to_dict()`` is
the command's ``--json`` document. Shared option groups (:mod:`toolkit.model.options`) are taken as keywords;
an unknown one is a ``TypeError``. Errors are ``toolkit.errors`` types; a device that fails inside a fleet is
not an exception but its :class:`DeviceResult` (whose ``answer`` is the verb's typed answer:
:class:`StatusAnswer`, :class:`PruneAnswer`, ... from :mod:`toolkit.model.answers`), and the fleet's
``exit_code`` is the CLI's (4, else 2, else 1, else 0). Heavy frameworks load only inside the functions that
need them; ``import toolkit.api`` is light.
"""

from __future__ import annotations

from toolkit.api.end_to_end import quickstart, run
from toolkit.api.fleet import add_key, check, deploy, probe, prune, remove, rollback, select_devices, setup, status
from toolkit.api.local import (convert, convert_options, export_mender, history, history_import, history_sync,
                               inspect, list_targets, make_report, optimize, show_target)
from toolkit.api.results import (BundleInspection, DeviceResult, FleetReport, History, RunResult, TargetCatalog,
                                 TargetView)
from toolkit.model.answers import (AddKeyAnswer, InstalledBundle, ProbeAnswer, PruneAnswer, RemoveAnswer,
                                   RollbackAnswer, SetupAnswer, StatusAnswer)

__all__ = ["AddKeyAnswer", "BundleInspection", "DeviceResult", "FleetReport", "History", "InstalledBundle",
           "ProbeAnswer", "PruneAnswer", "RemoveAnswer", "RollbackAnswer", "RunResult", "SetupAnswer", "StatusAnswer",
           "TargetCatalog", "TargetView", "add_key", "check", "convert", "convert_options", "deploy", "export_mender",
           "history", "history_import", "history_sync", "inspect", "list_targets", "make_report", "optimize", "probe",
           "prune", "quickstart", "remove", "rollback", "run", "select_devices", "setup", "show_target", "status"]

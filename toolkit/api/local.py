"""The verbs that stay on this machine: ``convert``, ``inspect``, ``list_targets``/``show_target``, ``optimize``,
``export_mender``, ``history`` (and its ``sync``/``import``) and ``make_report``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack  # Any: either optimize report

from toolkit.api.keywords import ConvertKeywords
from toolkit.api.results import BundleInspection, History, PathLike, Progress, TargetCatalog, TargetView
from toolkit.errors import UsageError
from toolkit.model.options import ConvertOptions, build, split_keywords, with_option_keywords

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.conversion.pipeline import ConvertResult
    from toolkit.delivery.mender import MenderExport
    from toolkit.reporting.html import ReportData
    from toolkit.runtimes.inspection import ModelInfo
    from toolkit.store.guard import SyncResult
    from toolkit.store.imports import ImportResult


@with_option_keywords(ConvertOptions)
def convert(source: PathLike, *, progress: Progress | None = None, **options: Unpack[ConvertKeywords]
            ) -> ConvertResult:
    """``edgetk convert``: build, verify and write a bundle; returns ``ConvertResult(bundle_dir, manifest, cached)``.

    ``options`` are :class:`toolkit.model.options.ConvertOptions`' fields (target, calibration, precisions, ...).
    """
    from toolkit.conversion.pipeline import convert_bundle

    built = convert_options(source, **options)
    if progress is None:
        return convert_bundle(built)
    return convert_bundle(built, progress=progress)


def convert_options(source: PathLike, **values: Unpack[ConvertKeywords]) -> ConvertOptions:
    """``ConvertOptions`` from keyword values (paths as str or Path, sequences as lists or tuples)."""
    (convert_values,) = split_keywords("convert", values, ConvertOptions)
    return build(ConvertOptions, convert_values, source=str(source))


def inspect(path: PathLike, *, layers: bool = False) -> ModelInfo | BundleInspection:
    """``edgetk inspect``: a ``ModelInfo`` for a .tflite/.onnx file, a ``BundleInspection`` for a bundle.

    ``layers``: also the layer-wise INT8 error table of each INT8 artifact (``layers/<artifact>.json``, written
    by convert; ``toolkit.conversion.layers``), worst layer first."""
    from toolkit.delivery.bundle import read_bundle
    from toolkit.runtimes.inspection import inspect_model

    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist.", hint="Pass a .tflite, an .onnx or a bundle directory.")
    if path.is_dir():
        bundle = read_bundle(path)
        tables = None
        if layers:
            from toolkit.conversion.layers import read_table

            found = {a.file: read_table(path, a.file) for a in bundle.manifest.artifacts}
            tables = {file: table for file, table in found.items() if table is not None}
        return BundleInspection(
            path, bundle.manifest, tuple(inspect_model(path / a.file) for a in bundle.manifest.artifacts), tables
        )
    if layers:
        raise UsageError(f"--layers needs a bundle directory; {path} is a single model file.",
                         hint="Pass the bundle that convert wrote: the layer-wise tables are kept there.")
    return inspect_model(path)


def list_targets(*, targets_dirs: Sequence[PathLike] = ()) -> TargetCatalog:
    """``edgetk targets list``: every target profile (the user's folders win over shipped ones of a name)."""
    from toolkit.model.targets import load_profiles

    return TargetCatalog(tuple(load_profiles(targets_dirs=tuple(Path(d) for d in targets_dirs)).values()))


def show_target(name: str, *, targets_dirs: Sequence[PathLike] = ()) -> TargetView:
    """``edgetk targets show NAME``: one resolved profile."""
    from toolkit.model.targets import get_profile

    return TargetView(get_profile(name, targets_dirs=tuple(Path(d) for d in targets_dirs)))

def optimize(source: PathLike, *, out: PathLike, load_time: bool = False, device_python: str | None = None,
             repeats: int = 5, **techniques: Any) -> Any:
    """``edgetk optimize``: compress a Keras 3 or PyTorch model (``techniques``: see
    ``toolkit.optimization.optimize``); with ``load_time``, measure a converted artifact's cold-load variants
    instead. Returns a report whose ``to_dict()`` is the ``--json`` document."""
    if load_time:
        given = [k for k, v in techniques.items() if v not in (None, False)]
        if given:
            raise UsageError("--load-time measures a converted artifact; it does not combine with the "
                             f"compression techniques ({', '.join(sorted(given))}).",
                             hint="Run `edgetk optimize` on the source first, convert it, then --load-time on "
                                  "the artifact.")
        from toolkit.optimization.load_time import load_time_report

        return load_time_report(str(source), out_dir=out, python=device_python, repeats=repeats)
    from toolkit.optimization import optimize as do_optimize

    return do_optimize(str(source), out=out, **techniques)
def export_mender(bundle: PathLike, *, device_types: Sequence[str], output: PathLike,
                  artifact_name: str | None = None, budget_ms: float | None = None, runs: int = 20,
                  warmup: int = 3, force: bool = False) -> MenderExport:
    """``edgetk export BUNDLE --mender``: a Mender module-image artifact of the bundle (and the ``edgetk``
    Update Module beside it), built with ``mender-artifact``."""
    from toolkit.delivery.mender import export_mender as write

    return write(bundle, device_types=tuple(device_types), output=output, artifact_name=artifact_name,
                 budget_ms=budget_ms, runs=runs, warmup=warmup, force=force)


def history(*, device: str | None = None, bundle: str | None = None, limit: int | None = None,
            store: PathLike | None = None) -> History:
    """``edgetk history``: the stored checks (of one device or bundle, the newest ``limit``)."""
    from toolkit.store import Store

    checks = Store(store).history(device=device, bundle=bundle, limit=limit)
    return History(tuple(checks))


def history_sync(*, store: PathLike | None = None, source: PathLike | None = None) -> SyncResult:
    """``edgetk history sync``: copy the results that ``--store-fallback`` kept locally into ``store`` (each
    check once, however often it runs), then empty the local file."""
    from toolkit.store import Store
    from toolkit.store.guard import sync

    return sync(Store(store), source=Path(source) if source is not None else None)


def history_import(paths: Sequence[PathLike], *, store: PathLike | None = None,
                   device: str | None = None) -> ImportResult:
    """``edgetk history import``: record the check reports that devices left (Mender update module)."""
    from toolkit.store import Store
    from toolkit.store.imports import import_reports

    return import_reports([Path(p) for p in paths], Store(store), device=device)

def make_report(bundle: PathLike | None = None, *, whole_history: bool = False, html: PathLike | None = None,
                device: str | None = None, store: PathLike | None = None) -> ReportData:
    """``edgetk report``: a bundle's host and device measurements, or (``whole_history``) every stored check
    and the trends; ``html`` also writes the self-contained page there."""
    from toolkit.reporting.html import collect, write_html

    if (bundle is None) == (not whole_history):
        raise UsageError("Pass either a BUNDLE directory or --history.",
                         hint="edgetk report bundles/NAME --html report.html, or edgetk report --history")
    data = collect(Path(bundle) if bundle is not None else None, store=store, device=device)
    if html is not None:
        write_html(data, Path(html))
    return data

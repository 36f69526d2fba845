"""Caches of the convert stage, keyed by what they depend on: whole bundles (``cache_root()/<key>``: same source,
data, options, profile and tool versions copy the bundle, verification included) and built artifacts
(``ConvertOptions.workdir``: verification always runs again). Both are optimisations: a read-only or broken
cache never fails a conversion.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.conversion import calibration as cal
from toolkit.__about__ import __version__
from toolkit.conversion.base import BuiltArtifact
from toolkit.conversion.plan import detect_is_factory
from toolkit.conversion.policy import Policy
from toolkit.model.artifact import FloatIO
from toolkit.model.manifest import MANIFEST_SCHEMA_VERSION
from toolkit.model.reading import RecordProblem, read_record
from toolkit.model.recipe import Recipe
from toolkit.model.records import JsonObject

if TYPE_CHECKING:
    from toolkit.conversion.data import RunData
    from toolkit.model.options import ConvertOptions

_DISTRIBUTIONS = ("tensorflow", "keras", "tf2onnx", "onnx", "onnxruntime", "onnxconverter-common", "ai-edge-litert",
                  "torch", "litert-torch", "numpy")


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"edge-toolkit": __version__}
    for dist in _DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


def source_hash(source: str) -> str:
    path = Path(source.rsplit(":", 1)[0] if detect_is_factory(source) else source)
    return cal.hash_path(path) if path.exists() else hashlib.sha256(source.encode()).hexdigest()


def _hash_if(path: Path | None) -> str | None:
    return cal.hash_path(path) if path and Path(path).exists() else None


def _digest(material: Any, length: int) -> str:  # Any: any JSON document
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:length]


def cache_root() -> Path:
    root = os.environ.get("EDGETK_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgetk" / "convert"


def bundle_key(options: ConvertOptions, policy: Policy, name: str) -> str:
    material = {
        "source": source_hash(options.source),
        "weights": _hash_if(options.weights),
        "calibration": _hash_if(options.calibration),
        "eval": _hash_if(options.eval_data),
        "labels": _hash_if(options.labels),
        "options": {k: v for k, v in options.to_config().items() if k not in ("out", "force", "use_cache", "source")},
        "recipes": [r.to_dict() for r in policy.recipes],
        "tolerance": dataclasses.asdict(policy.tolerance),
        "target": policy.name,
        "name": name,
        "versions": tool_versions(),
        "manifest": MANIFEST_SCHEMA_VERSION,  # a bundle cached under an older schema lacks what this one records
    }
    return _digest(material, 32)


def _replace(target: Path, fill: Callable[[Path], object], suffix: str) -> None:
    """Fill a temporary folder beside ``target``, then put it in ``target``'s place. The caches are an
    optimisation: a read-only cache folder must not fail a conversion."""
    try:
        tmp = target.with_name(target.name + suffix)
        shutil.rmtree(tmp, ignore_errors=True)
        fill(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    except OSError:
        pass


def store_bundle(bundle_dir: Path, target: Path) -> None:
    _replace(target, lambda tmp: shutil.copytree(bundle_dir, tmp), ".tmp")


def build_dir(options: ConvertOptions, policy: Policy, data: RunData) -> Path | None:
    """``options.workdir``/<everything a built file depends on but the recipe>: None without a workdir."""
    if options.workdir is None:
        return None
    material = {
        "source": source_hash(options.source),
        "weights": _hash_if(options.weights),
        "calibration": data.calibration_ref.sha256 if data.calibration_ref else None,
        "calibration_samples": len(data.calibration),
        "input_values": sorted(options.input_values),  # --input-value changes the samples and the graph quantized
        "shapes": {k: list(v) for k, v in data.shapes.items()},
        "dynamic_batch": options.dynamic_batch,
        "max_opset": policy.max_opset,
        "versions": tool_versions(),
    }
    return Path(options.workdir) / _digest(material, 24)


def recipe_key(recipe: Recipe) -> str:
    return _digest(recipe.to_dict(), 16)


def reuse_build(builds: Path | None, recipe: Recipe, output: Path) -> BuiltArtifact | None:
    """The artifact an earlier run built for this recipe (same source, data, options, tools), copied to
    ``output``; None when there is none."""
    if builds is None:
        return None
    folder = builds / recipe_key(recipe)
    try:
        meta = json.loads((folder / "built.json").read_text())
        shutil.copyfile(folder / "artifact", output)
        return _built(meta, output)
    except (OSError, ValueError, RecordProblem):
        return None


def _built(meta: JsonObject, output: Path) -> BuiltArtifact:
    return BuiltArtifact(
        path=output,
        float_nodes=tuple(meta.get("float_nodes", ())),
        notes=tuple(meta.get("notes", ())),
        exporter=meta.get("exporter"),
        layout=meta.get("layout"),
        float_io=tuple(read_record(FloatIO, f, docs="") for f in meta.get("float_io", ())),
    )


def keep_build(builds: Path | None, recipe: Recipe, built: BuiltArtifact) -> None:
    meta = {"float_nodes": list(built.float_nodes), "notes": list(built.notes), "exporter": built.exporter,
            "layout": built.layout, "recipe": recipe.to_dict(), "float_io": [f.to_dict() for f in built.float_io]}

    def fill(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        shutil.copyfile(built.path, tmp / "artifact")
        (tmp / "built.json").write_text(json.dumps(meta))

    if builds is not None:
        _replace(builds / recipe_key(recipe), fill, f".tmp{os.getpid()}")

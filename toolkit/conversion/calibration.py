"""Calibration and evaluation data: read it, settle the model's dynamic dimensions from it, validate it
against the model's inputs before any converter sees it, and split off a held-out part for verification.

Formats (calibration/README.md): ``.npy`` (one array, single-input model); ``.npz`` (arrays keyed by input
name, ``x`` for a single input, labels under ``y``); a folder of images with a ``dataset.toml``. Samples lie
along the first axis: an array with the input's rank along the batch axis, an array with one more dimension
with a sample axis in front (inputs whose batch is not first, recurrent states, scalars).
"""

from __future__ import annotations

import hashlib
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.device_side.shared import sha256_file
from toolkit.errors import UsageError
from toolkit.model.manifest import Preprocessing
from toolkit.model.tensors import TensorSpec
from toolkit.model.roles import OutputDeclaration

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
MIN_CALIBRATION_SAMPLES = 50  # below this, INT8 ranges are poorly estimated: warn

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class DataFile:
    """Arrays read from a calibration or eval path, keyed by model input name, before shape checks."""

    path: Path
    sha256: str
    arrays: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None
    preprocessing: Preprocessing | None = None
    task: str | None = None  # dataset.toml's task (an image folder only)
    outputs: tuple[OutputDeclaration, ...] = ()  # dataset.toml's [outputs.NAME] roles
    anchors: np.ndarray | None = None  # an .npz's ``anchors`` [N, 4]: SSD boxes decoded to match labels

    @property
    def count(self) -> int:
        return min((len(a) for a in self.arrays.values()), default=0)


@dataclass(frozen=True)
class SampleSet:
    """Validated per-sample feeds shaped exactly like the model's (resolved) inputs."""

    feeds: tuple[Feed, ...]
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.feeds)


def hash_path(path: Path) -> str:
    """sha256 of a file, or of a directory's files (names and contents, sorted)."""
    if not path.is_dir():
        return sha256_file(str(path))
    digest = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(child.relative_to(path)).encode())
        digest.update(child.read_bytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------- reading


def read_data(path: Path, inputs: Sequence[TensorSpec], *, what: str = "calibration data") -> DataFile:
    path = Path(path)
    if not path.exists():
        raise UsageError(f"The {what} {str(path)!r} does not exist.", hint="Pass a .npy, .npz or image folder.")
    names = [spec.name for spec in inputs]
    if path.is_dir():
        return _read_image_folder(path, inputs, what)
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            if len(names) != 1:
                raise UsageError(
                    f"The {what} {path} is a single .npy array, but the model has {len(names)} inputs "
                    f"({', '.join(names)}).",
                    hint="Use an .npz with one array per input name.",
                )
            array = np.load(path, allow_pickle=False)
            return DataFile(path, hash_path(path), {names[0]: array})
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                raw = {key: archive[key] for key in archive.files}
        else:
            raise UsageError(
                f"The {what} {path} is neither .npy, .npz nor an image folder.",
                hint="See calibration/README.md for the formats.",
            )
    except UsageError:
        raise
    except Exception as exc:  # numpy raises several types for a corrupt or pickled file
        raise UsageError(
            f"Cannot read the {what} {path}: {type(exc).__name__}: {exc}.",
            hint="Save the arrays with numpy.save / numpy.savez (no pickled objects).",
        ) from None
    labels = raw.pop("y", None)
    anchors = raw.pop("anchors", None) if "anchors" not in names else None  # an SSD detector's anchor table
    if len(names) == 1 and names[0] not in raw and "x" in raw:
        raw[names[0]] = raw.pop("x")
    missing = [n for n in names if n not in raw]
    if missing:
        raise UsageError(
            f"The {what} {path} has no array for input {missing[0]!r} (it has: {', '.join(sorted(raw)) or 'none'}).",
            hint=f"Key the arrays by the model's input names: {', '.join(names)}"
            + (" (or 'x' for a single-input model)." if len(names) == 1 else "."),
        )
    return DataFile(path, hash_path(path), {n: raw[n] for n in names}, labels=labels, anchors=anchors)


def _read_image_folder(path: Path, inputs: Sequence[TensorSpec], what: str) -> DataFile:
    config_path = path / "dataset.toml"
    if not config_path.is_file():
        raise UsageError(
            f"The {what} folder {path} has no dataset.toml.",
            hint="Add one with size, layout, color_order and mean/std or scale (see calibration/README.md).",
        )
    try:
        config = tomllib.loads(config_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{config_path} is not valid TOML: {exc}.") from None
    preprocessing = _preprocessing_from(config, config_path)  # the schema refuses unknown keys, did-you-mean
    target = config.get("input", inputs[0].name if len(inputs) == 1 else None)
    if target is None or target not in [s.name for s in inputs]:
        raise UsageError(
            f"{config_path}: say which input the images feed with input = \"NAME\" "
            f"(inputs: {', '.join(s.name for s in inputs)}).",
        )
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise UsageError(f"The {what} folder {path} holds no images ({', '.join(IMAGE_SUFFIXES)}).")
    try:
        from PIL import Image
    except ImportError:
        from toolkit.errors import MissingDependency

        raise MissingDependency("pillow", extra="all", purpose="Reading an image folder") from None
    mode = "L" if preprocessing.color_order == "GRAY" else "RGB"
    images = []
    for file in files:
        try:
            with Image.open(file) as opened:
                image = opened.convert(mode)
                if preprocessing.size is not None:
                    height, width = preprocessing.size
                    image = image.resize((width, height), Image.Resampling.BILINEAR)
                array = np.asarray(image, dtype=np.float32)
        except OSError as exc:
            raise UsageError(f"Cannot read the image {file}: {exc}.") from None
        if array.ndim == 2:
            array = array[..., None]
        if preprocessing.color_order == "BGR":
            array = array[..., ::-1]
        images.append(array)
    shapes = {a.shape for a in images}
    if len(shapes) != 1:
        raise UsageError(
            f"The images in {path} have different sizes ({', '.join(map(str, sorted(shapes)))}).",
            hint="Set size = [height, width] in dataset.toml to resize them.",
        )
    batch: np.ndarray = np.stack(images)
    for key, values in (("mean", preprocessing.mean), ("std", preprocessing.std)):
        if values is not None and len(values) not in (1, batch.shape[-1]):
            raise UsageError(
                f"{config_path}: {key} has {len(values)} values, but the images have {batch.shape[-1]} channels "
                f"(color_order {preprocessing.color_order}).",
                hint=f"Give one value, or one per channel: {key} = [{', '.join(['0.5'] * batch.shape[-1])}].",
            )
    if preprocessing.scale is not None:
        batch = batch * preprocessing.scale
    if preprocessing.mean is not None:
        batch = batch - np.asarray(preprocessing.mean, dtype=np.float32)
    if preprocessing.std is not None:
        batch = batch / np.asarray(preprocessing.std, dtype=np.float32)
    if preprocessing.layout == "NCHW":
        batch = batch.transpose(0, 3, 1, 2)
    batch = batch.astype(preprocessing.dtype or "float32")
    task = config.get("task")
    from toolkit.model.roles import dataset_outputs  # noqa: PLC0415 - with the other verification words

    return DataFile(path, hash_path(path), {target: batch}, preprocessing=preprocessing,
                    task=str(task) if task else None, outputs=dataset_outputs(config.get("outputs")))


def _preprocessing_from(config: Mapping[str, object], where: Path) -> Preprocessing:
    """``dataset.toml`` through its schema (toolkit.model.schemas.dataset) -> Preprocessing."""
    from toolkit.model.reading import read_file
    from toolkit.model.schemas.dataset import DOCS, Dataset

    dataset = read_file(Dataset, config, file=where, docs=DOCS)
    return Preprocessing(
        layout=dataset.layout,
        color_order=dataset.color_order,
        mean=dataset.mean,
        std=dataset.std,
        scale=dataset.scale,
        dtype=dataset.dtype,
        size=(dataset.size[0], dataset.size[1]) if dataset.size is not None else None,
    )


# --------------------------------------------------------------------------------------------- samples


def to_samples(
    data: DataFile,
    inputs: Sequence[TensorSpec],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    what: str = "calibration data",
) -> SampleSet:
    """Split ``data`` into per-sample feeds shaped like ``shapes``; refuse anything a converter would choke on."""
    per_input: dict[str, list[np.ndarray]] = {}
    for spec in inputs:
        array = np.asarray(data.arrays[spec.name])
        shape = shapes[spec.name]
        where = f"The {what} for input {spec.name!r}"
        if array.size == 0 or len(array) == 0:
            raise UsageError(f"{where} is empty.", hint="Give at least one sample (100-500 are typical).")
        _check_dtype(array, spec, where)
        if array.ndim == len(shape) + 1:
            if tuple(array.shape[1:]) != shape:
                raise UsageError(
                    f"{where} has shape {tuple(array.shape)}: expected (samples, {', '.join(map(str, shape))}).",
                    hint="Samples lie along the first axis.",
                )
            samples = [array[i] for i in range(len(array))]
        elif array.ndim == len(shape):
            batch = shape[0] if shape else 1
            if tuple(array.shape[1:]) != shape[1:] or len(array) % batch:
                raise UsageError(
                    f"{where} has shape {tuple(array.shape)}: expected (samples, "
                    f"{', '.join(map(str, shape[1:]))}) to match the input {tuple(shape)}.",
                    hint="Samples lie along the first axis; check the layout (NHWC vs NCHW) and size.",
                )
            samples = [array[i : i + batch] for i in range(0, len(array), batch)]
        else:
            raise UsageError(
                f"{where} has rank {array.ndim}, but the input {spec.name!r} has shape {tuple(shape)} "
                f"(rank {len(shape)}).",
                hint=f"Give an array of rank {len(shape)} (samples along the batch axis) or {len(shape) + 1} "
                "(a sample axis in front).",
            )
        if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise UsageError(
                f"{where} holds {bad} NaN or Inf value(s).", hint="Clean the data; converters crash on them."
            )
        per_input[spec.name] = [s.astype(_feed_dtype(spec, array.dtype)) for s in samples]
    counts = {name: len(s) for name, s in per_input.items()}
    if len(set(counts.values())) > 1:
        raise UsageError(
            f"The {what} has different sample counts per input: "
            + ", ".join(f"{k}={v}" for k, v in counts.items())
            + ".",
        )
    count = next(iter(counts.values()), 0)
    feeds = tuple({name: per_input[name][i] for name in per_input} for i in range(count))
    labels = data.labels
    if labels is not None and len(labels) != count:
        raise UsageError(f"The {what} has {len(labels)} labels under 'y' but {count} samples.")
    return SampleSet(feeds=feeds, labels=labels)


def _feed_dtype(spec: TensorSpec, data_dtype: np.dtype) -> str:
    """float32 for float and quantized inputs (sessions quantize them), else the input's own dtype."""
    if spec.dtype == "float16" or (spec.quantization is not None and np.issubdtype(data_dtype, np.floating)):
        return "float32"
    return spec.dtype


def _check_dtype(array: np.ndarray, spec: TensorSpec, where: str) -> None:
    want = np.dtype(spec.dtype)
    got = array.dtype
    if spec.quantization is not None and np.issubdtype(got, np.floating):
        return  # float data for a quantized integer input: quantized with the input's scale when fed
    ok = (np.issubdtype(want, np.floating) and np.issubdtype(got, np.floating)) or (
        np.issubdtype(want, np.integer) and np.issubdtype(got, np.integer)
    ) or (want == np.bool_ and got == np.bool_)
    if not ok:
        raise UsageError(
            f"{where} has dtype {got}, but the input takes {want}.",
            hint="Convert the data first (for images: scale to float as the model expects, or use an image "
            "folder with dataset.toml).",
        )


def subset(samples: SampleSet, count: int | None, *, seed: int = 0) -> SampleSet:
    """A deterministic subset of ``count`` samples (all when None or larger)."""
    if count is None or count >= len(samples):
        return samples
    if count < 1:
        raise UsageError("--calibration-samples must be at least 1.")
    order = np.sort(np.random.default_rng(seed).permutation(len(samples))[:count])
    labels = samples.labels[order] if samples.labels is not None else None
    return SampleSet(tuple(samples.feeds[i] for i in order), labels)


def split_heldout(samples: SampleSet, *, fraction: float = 0.2, seed: int = 0) -> tuple[SampleSet, SampleSet]:
    """(calibration, held-out): a deterministic held-out part that calibration never sees."""
    count = len(samples)
    held = max(1, int(round(count * fraction))) if count > 1 else 0
    order = np.random.default_rng(seed).permutation(count)
    held_idx, cal_idx = np.sort(order[:held]), np.sort(order[held:])
    if held == 0:
        cal_idx, held_idx = np.arange(count), np.arange(count)

    def pick(idx: np.ndarray) -> SampleSet:
        labels = samples.labels[idx] if samples.labels is not None else None
        return SampleSet(tuple(samples.feeds[i] for i in idx), labels)

    return pick(cal_idx), pick(held_idx)


def synthetic_samples(
    inputs: Sequence[TensorSpec], shapes: Mapping[str, tuple[int, ...]], *, count: int = 16, seed: int = 0
) -> SampleSet:
    """Random inputs for verifying float artifacts when the user gave no data (said so in the report)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        feed: Feed = {}
        for spec in inputs:
            shape = shapes[spec.name]
            dtype = np.dtype(spec.dtype)
            if np.issubdtype(dtype, np.integer):
                feed[spec.name] = rng.integers(0, 10, size=shape).astype(dtype)
            elif dtype == np.bool_:
                feed[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
            else:
                feed[spec.name] = rng.random(shape, dtype=np.float32)
        feeds.append(feed)
    return SampleSet(tuple(feeds))


def warn_if_few(samples: SampleSet, *, what: str = "calibration") -> None:
    if 0 < len(samples) < MIN_CALIBRATION_SAMPLES:
        print(
            f"warning: only {len(samples)} {what} samples; INT8 ranges need {MIN_CALIBRATION_SAMPLES}+ "
            "(100-500 are typical) to be reliable.",
            file=sys.stderr,
        )

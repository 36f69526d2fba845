"""The bundle directory: what ``convert`` writes and ``deploy`` pushes.

Layout (architecture.md)::

    <bundle>/manifest.json               the contract (toolkit.model.manifest.Manifest)
    <bundle>/model.<precision>.<ext>     the artifacts
    <bundle>/golden/inputs.npz           held-out inputs: key ``input_<i>`` (i = position in the artifact's
                                         inputs), shape ``(samples, *input_shape)``, float32, not quantized
    <bundle>/golden/<artifact>.npz       what that artifact returned for them on the host, dequantized to
                                         float32: key ``output_<i>``, shape ``(samples, *output_shape)``
    <bundle>/golden/reference.npz        what the float source model returned for them (same keys)
    <bundle>/model.<precision>.bpte      beside each .pte: its ExecuTorch bundled program (the device's
                                         self-check: a few held-out inputs and the float outputs)
    <bundle>/edgetk_runner.py            the on-device runner (stdlib + numpy + one runtime)

and, pushed only when a check asks (:mod:`toolkit.delivery.on_demand`)::

    <bundle>/eval/input_<i>.npy          convert --device-eval N: the first N held-out inputs
    <bundle>/eval/reference.npz          the float model's outputs for them; eval/labels.npy their labels
    <bundle>/layers/<artifact>.json      an INT8 artifact's layer-wise error table
    <bundle>/layers/<artifact>.probe.json  its layer probe (:func:`probe_name`), with .float.npz and, for
                                         ONNX, .debug.onnx beside it (:func:`float_name`, :func:`debug_name`)

These names are the bundle's contract: ``convert`` writes by them and ``deploy`` and ``check`` read by them, so
they are written here once and neither of the two imports the converter (tests/test_api.py checks that).

Keys are positional because tensor names (``serving_default_image:0``) are not safe file names inside an
``.npz``; every artifact of a bundle has the same inputs and outputs in the same order.

A bundle's *version* is the sha256 of its ``manifest.json`` (which holds every artifact's and the runner's
hash), so two different bundles never share a version. Writing goes to a temporary sibling directory that is
renamed into place at the end: a failed conversion leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from toolkit import device_side
from toolkit.device_side import RUNNER_FILE, shared
from toolkit.errors import UsageError
from toolkit.model.manifest import Manifest, RunnerRef, read_manifest

MANIFEST = "manifest.json"
GOLDEN_DIR = "golden"
GOLDEN_INPUTS = f"{GOLDEN_DIR}/inputs.npz"
GOLDEN_REFERENCE = f"{GOLDEN_DIR}/reference.npz"
EVAL_DIR = "eval"  # convert --device-eval: input_<i>.npy, reference.npz, labels.npy (toolkit.checks.device_eval)
EVAL_REFERENCE = f"{EVAL_DIR}/reference.npz"
EVAL_LABELS = f"{EVAL_DIR}/labels.npy"
LAYERS_DIR = "layers"  # an INT8 artifact's layer table (layers/<artifact file>.json) and its layer probe
PROBE_SAMPLES = 2  # golden samples a layer probe keeps (toolkit.checks.divergence runs as many on the device)
RUNNER_SOURCE = device_side.source_path(RUNNER_FILE)


_DIGESTS: dict[tuple[str, int, int, int, int, int], str] = {}
_DIGEST_MARGIN_NS = 2_000_000_000  # a file changed less than this before it was hashed is hashed again next time


def sha256_file(path: Path) -> str:
    """The file's sha256, hashed at most once per process while the file is unchanged.

    Reading a bundle verifies its artifacts and a deploy lists every file's hash: the second reuses the first.
    The digest is kept per path and stat (device, inode, size, mtime and ctime in ns), and only when the file's
    last change is 2 s older than the moment it was hashed, so a rewrite within one timestamp tick of the
    hashing cannot hide behind an equal stat (git's "racy clean" rule).
    """
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    cached = _DIGESTS.get(key)
    if cached is not None:
        return cached
    hashed_at = time.time_ns()
    value = shared.sha256_file(str(path))
    if max(st.st_mtime_ns, st.st_ctime_ns) < hashed_at - _DIGEST_MARGIN_NS:
        if len(_DIGESTS) > 4096:  # a long-lived process: keep the cache small
            _DIGESTS.clear()
        _DIGESTS[key] = value
    return value


def golden_outputs_name(artifact_file: str) -> str:
    return f"{GOLDEN_DIR}/{artifact_file}.npz"


def layer_table_name(artifact: str) -> str:
    """The artifact's layer-wise INT8 error table (bundle-relative)."""
    return f"{LAYERS_DIR}/{artifact}.json"


def probe_name(artifact: str) -> str:
    """The layer probe (bundle-relative): the layers in graph order, their tensors and the host's INT8 error there."""
    return f"{LAYERS_DIR}/{artifact}.probe.json"


def float_name(artifact: str) -> str:
    """The float model's values of the probed tensors (bundle-relative), float16, ``t_<j>``."""
    return f"{LAYERS_DIR}/{artifact}.float.npz"


def debug_name(artifact: str) -> str:
    """ONNX: the artifact with the probed tensors added as graph outputs (the device needs no onnx package)."""
    return f"{LAYERS_DIR}/{artifact}.debug.onnx"


def safe_relative(name: str, *, what: str = "file") -> PurePosixPath:
    """A bundle-relative path that cannot escape the bundle (no absolute paths, no ``..``)."""
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\\" in name or name.startswith("~"):
        raise UsageError(
            f"The bundle names the {what} {name!r}, which would escape the bundle directory.",
            hint="Rebuild the bundle with `edgetk convert`; never edit manifest paths by hand.",
        )
    return rel


@dataclass(frozen=True)
class BundleFile:
    """One file of a bundle, as deploy pushes and verifies it."""

    path: str  # relative, POSIX separators
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Bundle:
    """A bundle directory on this host, with its parsed manifest."""

    path: Path
    manifest: Manifest
    version: str  # sha256 of manifest.json

    @property
    def name(self) -> str:
        return self.manifest.name

    def files(self) -> tuple[BundleFile, ...]:
        """Every file deploy must push: artifacts, golden data, runner and manifest (manifest last)."""
        names: list[str] = [a.file for a in self.manifest.artifacts]
        if self.manifest.golden_inputs:
            names.append(self.manifest.golden_inputs)
        names.extend(a.golden.outputs for a in self.manifest.artifacts if a.golden)
        names.extend(a.pte.bundled for a in self.manifest.artifacts if a.pte and a.pte.bundled)
        if (self.path / GOLDEN_REFERENCE).is_file():
            names.append(GOLDEN_REFERENCE)
        if self.manifest.runner:
            names.append(self.manifest.runner.file)
        out = []
        for name in dict.fromkeys(names):
            rel = safe_relative(name)
            full = self.path / rel
            if full.is_symlink() or not full.is_file():
                raise UsageError(
                    f"The bundle {self.path} lists {name!r}, which is missing or not a regular file.",
                    hint="Rebuild the bundle with `edgetk convert`.",
                )
            out.append(BundleFile(str(rel), sha256_file(full), full.stat().st_size))
        manifest = self.path / MANIFEST
        out.append(BundleFile(MANIFEST, sha256_file(manifest), manifest.stat().st_size))
        return tuple(out)

    def verify(self) -> None:
        """Every artifact and the runner match the hashes in the manifest."""
        expected = {a.file: a.sha256 for a in self.manifest.artifacts}
        if self.manifest.runner:
            expected[self.manifest.runner.file] = self.manifest.runner.sha256
        for name, digest in expected.items():
            full = self.path / safe_relative(name)
            if not full.is_file():
                raise UsageError(f"The bundle {self.path} is missing {name}.", hint="Rebuild it with `edgetk convert`.")
            if sha256_file(full) != digest:
                raise UsageError(
                    f"{name} in the bundle {self.path} does not match its sha256 in manifest.json.",
                    hint="The file was changed after conversion: rebuild the bundle with `edgetk convert`.",
                )


def read_bundle(path: Path, *, verify: bool = True) -> Bundle:
    """Open a bundle directory; refuse one whose manifest is missing, malformed or not matching its files."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not path.is_dir() or not manifest_path.is_file():
        raise UsageError(
            f"{path} is not a bundle directory (no {MANIFEST} inside).",
            hint="Pass the directory written by `edgetk convert` (by default ./bundles/<name>/).",
        )
    raw = manifest_path.read_bytes()
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{manifest_path} is not valid JSON ({exc}).", hint="Rebuild the bundle.") from None

    manifest = read_manifest(data, where=str(manifest_path))
    for record in manifest.artifacts:
        safe_relative(record.file, what="artifact")
    bundle = Bundle(path=path, manifest=manifest, version=hashlib.sha256(raw).hexdigest())
    if verify:
        bundle.verify()
    return bundle


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Any: np.savez types **named against its own allow_pickle: bool
    named: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items()}
    with path.open("wb") as handle:
        np.savez(handle, **named)


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def install_runner(staging: Path) -> RunnerRef | None:
    """Copy the on-device runner into the bundle (None while the runner does not exist in this install)."""
    if not RUNNER_SOURCE.is_file():
        return None
    target = staging / RUNNER_FILE
    shutil.copyfile(RUNNER_SOURCE, target)
    return RunnerRef(file=RUNNER_FILE, sha256=sha256_file(target))


def write_manifest(staging: Path, manifest: Manifest) -> None:
    (staging / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=False) + "\n")


@contextmanager
def staging_dir(destination: Path, *, force: bool) -> Iterator[Path]:
    """A temporary directory beside ``destination``, renamed onto it when the block succeeds.

    An existing ``destination`` is replaced only with ``force``; on any error the staging directory is
    removed and ``destination`` is left as it was.
    """
    destination = Path(destination)
    if destination.exists() and not force:
        raise UsageError(
            f"{destination} already exists.",
            hint="Pass --force to replace it, or --out / --name for another location.",
        )
    parent = destination.parent
    created = [d for d in (parent, *parent.parents) if not d.exists()]  # removed again if we fail
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".partial", dir=parent))
    except OSError as exc:
        raise UsageError(
            f"Cannot write to {parent} ({exc.strerror or exc}).",
            hint="Choose a writable --out directory.",
        ) from None
    try:
        yield staging
        os.chmod(staging, 0o755)
        if destination.exists():
            old = destination.with_name(f".{destination.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            destination.rename(old)
            staging.rename(destination)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for made in created:  # deepest first: leave no empty ./bundles/ behind a failed conversion
            try:
                made.rmdir()
            except OSError:
                break
        raise

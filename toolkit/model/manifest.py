"""``manifest.json``: the contract between convert, deploy and check (architecture.md), and :func:`read_manifest`.

Stdlib only. The records below are the schema: each ``to_dict`` writes its JSON object, and
:func:`~toolkit.model.reading.read_record` reads it back against the same fields (docs/schemas/convert.md
describes them), refusing malformed input with a UsageError that names the file, the key and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from toolkit.errors import UsageError
from toolkit.model.reading import RecordProblem, read_record
from toolkit.model.artifact import ArtifactRecord, Attempt
from toolkit.model.policy import CheckPolicy
from toolkit.model.records import JsonDict, JsonObject, Record
from toolkit.model.vocabulary import Framework

MANIFEST_SCHEMA_VERSION = 4  # 2: attempts[].workaround, artifacts[].float_io and .batching; 3: on_demand (the
# eval set and layer probes, hashed); 4: a role per verified output (verification.outputs[].role, role_source,
# metrics); 1 to 3 still read


@dataclass(frozen=True)
class SourceRef(Record):
    path: str
    sha256: str
    framework: Framework


@dataclass(frozen=True)
class CalibrationRef(Record):
    path: str
    sha256: str
    samples: int


@dataclass(frozen=True)
class Preprocessing(Record):
    """How raw data becomes the model's input: ``x = (raw * scale - mean) / std`` in ``layout``/``color_order``."""

    layout: str | None = None  # "NHWC" | "NCHW"
    color_order: str | None = None  # "RGB" | "BGR" | "GRAY"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale: float | None = None
    dtype: str | None = None
    size: tuple[int, int] | None = None  # (height, width) images are resized to


@dataclass(frozen=True)
class BundleTarget(Record):
    """The profile a bundle was built for, and its arch (deploy refuses a device of another arch)."""

    name: str | None = None
    arch: str | None = None


@dataclass(frozen=True)
class RunnerRef(Record):
    file: str
    sha256: str


@dataclass(frozen=True)
class FileRef(Record):
    """A bundle file with its hash and size (``on_demand``: pushed only when a check asks, verified where read)."""

    file: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: the contract between convert, deploy and check (architecture.md)."""

    name: str
    created_at: str
    toolkit_version: str
    source: SourceRef
    artifacts: tuple[ArtifactRecord, ...]
    target: BundleTarget = BundleTarget()
    golden_inputs: str | None = None  # bundle-relative .npz keyed by input name, samples along axis 0
    preprocessing: Preprocessing | None = None
    labels: tuple[str, ...] | None = None
    calibration: CalibrationRef | None = None
    runner: RunnerRef | None = None
    attempts: tuple[Attempt, ...] = ()
    runtime_preferences: JsonObject = field(default_factory=dict)  # from the target profile
    config: JsonObject = field(default_factory=dict)  # the effective options, replayable
    schema_version: int = MANIFEST_SCHEMA_VERSION
    check_policy: CheckPolicy | None = None  # what check gates on (budget, regression, placement); None: old bundle
    on_demand: tuple[FileRef, ...] = ()  # eval/ and layers/: deploy leaves them out (toolkit.delivery.on_demand)

    def artifact(self, file: str) -> ArtifactRecord:
        for record in self.artifacts:
            if record.file == file:
                return record
        raise UsageError(f"The bundle {self.name!r} has no artifact {file!r}.")

    def to_dict(self) -> JsonDict:
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "created_at": self.created_at,
            "toolkit_version": self.toolkit_version,
            "source": self.source.to_dict(),
            "target": self.target.to_dict(),
            "preprocessing": self.preprocessing.to_dict() if self.preprocessing else None,
            "labels": list(self.labels) if self.labels is not None else None,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "golden_inputs": self.golden_inputs,
            "artifacts": [a.to_dict() for a in self.artifacts],
            "attempts": [a.to_dict() for a in self.attempts],
            "runtime_preferences": dict(self.runtime_preferences),
            "runner": self.runner.to_dict() if self.runner else None,
            "config": dict(self.config),
            "check_policy": self.check_policy.to_dict() if self.check_policy else None,
            "on_demand": [f.to_dict() for f in self.on_demand],
        }


DOCS = "docs/schemas/convert.md"
REBUILD = "Rebuild the bundle with `edgetk convert`"


def read_manifest(data: object, where: str = "manifest.json") -> Manifest:
    """``data`` (a parsed ``manifest.json``) as a :class:`Manifest`, or a UsageError naming ``where``, the key
    and the fix. A ``schema_version`` newer than this edgetk's is refused before anything else: its keys may be
    ones this edgetk does not know ("upgrade edge-toolkit"). Unknown keys are refused otherwise (a hand edit
    gone wrong); free-form tables (``recipe``, ``config``, ``metrics``, ...) are not checked inside."""
    version = data.get("schema_version") if isinstance(data, Mapping) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > MANIFEST_SCHEMA_VERSION:
        raise UsageError(
            f"{where}: schema_version {version} is newer than this edgetk understands "
            f"({MANIFEST_SCHEMA_VERSION}).",
            hint="Upgrade edge-toolkit, or rebuild the bundle with this version.",
        )
    try:
        return read_record(Manifest, data, docs=DOCS)
    except RecordProblem as exc:
        first = exc.problem
        if first.kind == "missing":
            fix = f"{REBUILD} ({DOCS} lists the keys)."
        elif first.kind == "extra_forbidden":
            fix = f"{first.fix} Or rebuild the bundle with `edgetk convert` (a newer edgetk's? upgrade)."
        else:
            fix = f"{first.fix} Or rebuild the bundle with `edgetk convert`."
        raise dataclasses.replace(first, fix=fix).error(where) from None

"""``manifest.json``: the contract between convert, deploy and check (architecture.md).

Stdlib only; ``toolkit.model.schemas.manifest.read_manifest`` reads one back through its schema (pydantic,
imported only when a bundle is read), refusing malformed input with a UsageError that names the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.errors import UsageError
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
    target: str | None
    artifacts: tuple[ArtifactRecord, ...]
    golden_inputs: str | None = None  # bundle-relative .npz keyed by input name, samples along axis 0
    preprocessing: Preprocessing | None = None
    labels: tuple[str, ...] | None = None
    calibration: CalibrationRef | None = None
    runner: RunnerRef | None = None
    attempts: tuple[Attempt, ...] = ()
    target_arch: str | None = None  # the profile's arch: deploy refuses a device of another arch
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
            "target": {"name": self.target, "arch": self.target_arch},
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

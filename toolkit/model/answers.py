"""What the device verbs answer: one frozen record per verb (``rollback``, ``status``, ``remove``, ``prune``,
``devices probe``, ``devices setup``, ``devices add-key``), each with the ``to_dict()`` that is the keys the verb
adds to its device's entry of the ``--json`` document (docs/schemas/deploy.md).

The answers the device helper prints (rollback, status, remove, prune) are read into these records once, where the
host receives them (:meth:`toolkit.delivery.deployment.Device.ask`, through :func:`toolkit.model.reading.read_record`),
so a malformed answer is one plain device error there and every reader after it reads typed fields. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from toolkit.model.records import JsonDict, JsonObject, Record


@dataclass(frozen=True)
class RollbackAnswer(Record):
    """``rollback``: the version now current, and the one it replaced."""

    current: str
    previous: str


@dataclass(frozen=True)
class RemoveAnswer(Record):
    """``remove``: the bundle whose every version is gone from the device."""

    removed: str


@dataclass(frozen=True)
class PruneAnswer(Record):
    """``prune``: the versions removed and kept (oldest first), the rollback target (always kept), and the free
    space gained where bundles live (files hard-linked into a kept version free nothing)."""

    current: str | None
    rollback_target: str | None
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    freed_bytes: int


@dataclass(frozen=True)
class Deployer(Record):
    """Who installed a version: the controller's host, process and login (the lock request's ``by``)."""

    host: str | None = None
    pid: int | None = None
    user: str | None = None


@dataclass(frozen=True)
class InstalledVersion(Record):
    version: str
    installed_at: str | None = None
    by: Deployer | None = None  # None: installed before edgetk recorded it


@dataclass(frozen=True)
class InstalledBundle(Record):
    """One bundle on a device: its current version, the device's ``selected.json`` (a selection document, whose
    ``version`` may be older than ``current``), and its installed versions, oldest first."""

    current: str | None
    selected: JsonObject | None
    versions: tuple[InstalledVersion, ...]

    @property
    def current_selection(self) -> JsonObject | None:
        """``selected`` when it is the current version's, else None (a rollback, a deploy without a check)."""
        chosen = self.selected
        return chosen if chosen is not None and chosen.get("version") == self.current else None


@dataclass(frozen=True)
class StatusAnswer(Record):
    """``status``: every bundle installed on the device, by name."""

    bundles: Mapping[str, InstalledBundle] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeAnswer(Record):
    """``devices probe``: the runner's probe document plus the host's findings (``profile``, ``home``, ``sftp``,
    ``notes``): docs/schemas/deploy.md. Free-form: its keys are the on-device runner's."""

    probe: JsonObject


@dataclass(frozen=True)
class SetupResult:
    """What ``devices setup`` did on one device: the venv's python (reused or created), the runtimes installed,
    and for ``--offline`` the wheels sent."""

    device: str
    mode: str
    python: str
    venv_reused: bool
    platform: str
    profile: str | None
    installed: dict[str, str | None]
    wheels_sent: int
    bytes_sent: int
    seconds: float
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> JsonDict:
        return {"mode": self.mode, "python": self.python, "venv_reused": self.venv_reused,
                "platform": self.platform, "profile": self.profile, "installed": dict(self.installed),
                "wheels_sent": self.wheels_sent, "bytes_sent": self.bytes_sent, "seconds": round(self.seconds, 2),
                "notes": list(self.notes)}


@dataclass(frozen=True)
class SetupAnswer:
    """``devices setup``: what it did on the device."""

    setup: SetupResult

    def to_dict(self) -> JsonDict:
        return {"setup": self.setup.to_dict()}


@dataclass(frozen=True)
class KeyInstall(Record):
    """The user's key on one device: its fingerprint and file, the authorized_keys files it was added to or
    already in, whether a key login then worked, and whether the password was needed (never the password)."""

    key: str
    key_file: str
    added: tuple[str, ...]
    present: tuple[str, ...]
    key_login: bool
    password_used: bool


@dataclass(frozen=True)
class AddKeyAnswer(Record):
    """``devices add-key``: the key's install on the device."""

    add_key: KeyInstall


DeviceAnswer = RollbackAnswer | StatusAnswer | RemoveAnswer | PruneAnswer | ProbeAnswer | SetupAnswer | AddKeyAnswer
"""The answer of one of the device verbs, as :class:`toolkit.api.DeviceResult` carries it."""

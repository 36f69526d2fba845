"""One exception tree. Each class carries the exit code of the CLI contract; ``toolkit.cli`` is the one place
that turns a :class:`ToolkitError` into a message and that code.

Exit codes (architecture.md): 0 ok; 1 a check or gate failed; 2 bad usage, config or input; 3 conversion
failed; 4 a device could not be reached, refused us, or could not take the bundle.
"""

from __future__ import annotations

import re


class ToolkitError(Exception):
    """Base of every error edgetk reports to a user: a plain message plus what to do about it."""

    exit_code: int = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class GateFailed(ToolkitError):
    """A check, gate, accuracy or regression threshold was not met (exit 1)."""

    exit_code = 1


class UsageError(ToolkitError):
    """Bad usage, configuration or input: a path, a flag, a profile, calibration data (exit 2)."""

    exit_code = 2


class ConversionError(ToolkitError):
    """A converter or quantizer failed on a valid request (exit 3)."""

    exit_code = 3


class ArtifactRefused(ConversionError):
    """An artifact was built, but its own runtime refuses to load or run it (exit 3). The convert stage retries
    it with the node the runtime names kept float (``runtime_retry``) instead of dropping it as a build failure."""


class ArtifactCrashed(ArtifactRefused):
    """The artifact's first load or run killed the runtime, in a child process (``crash_guard``) (exit 3)."""


class DeviceError(ToolkitError):
    """A device could not be reached, refused us, or could not take the bundle (exit 4).

    The subclasses below say which, so that the stages branch on the type and never on the message text.
    """

    exit_code = 4


class DeviceUnreachable(DeviceError):
    """No SSH session could be opened: unknown name, nothing listening, no answer, a proxy that failed."""


class HostKeyRefused(DeviceError):
    """The device's host key is unknown (and not to be trusted) or CHANGED: nothing was sent to it."""


class AuthRefused(DeviceError):
    """The device refused every way we could log in (the message says what it offered and what was tried)."""


class LinkDropped(DeviceError):
    """An open connection to the device broke mid-way; nothing more can be done on it (no clean-up either)."""


class DeviceStopped(LinkDropped):
    """The device stopped answering (a frozen userland, a hung SD card, an OOM-thrashing board) while its
    TCP link still looked alive: no reply to the SSH keepalives within their bounded number of misses."""


class DeviceTimeout(DeviceError):
    """A command on a device that still answers did not finish within its deadline."""


class DeviceDiskFull(DeviceError):
    """The device's disk (or quota) cannot take what is being written."""


class DeviceShellNoise(DeviceError):
    """The device user's login shell prints text on start-up, and it broke a reply that could not be framed."""


class MissingDependency(UsageError):
    """An optional framework is not installed; the hint names the extra to add."""

    def __init__(self, package: str, *, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the Python package {package!r}, which is not installed.",
            hint=f"Install it with: pip install 'edge-toolkit[{extra}]'",
        )
        self.package = package
        self.extra = extra


def worst_exit_code(codes: list[int]) -> int:
    """With several devices the worst wins: 4 if any device error, else 1 if any gate failed, else 0."""
    for code in (4, 3, 2, 1):
        if code in codes:
            return code
    return 0


_NOISE = ("File ", "Traceback", "^", "~", "<unknown>", "note:")  # traceback frames, MLIR locations and notes
_DIAGNOSTIC = re.compile(r"(?:^|[\s:])(error:)", re.IGNORECASE)  # an MLIR "loc(...): error: ..." line


def key_line(exc: BaseException) -> str:
    """The line of an exception's text that says what went wrong, for a one-line message (at most 400 chars).

    Converters and runtimes bury it: an MLIR dump puts it on an ``error:`` line (taken from there on);
    traceback frames and notes are skipped; a header ending in ':' (onnxruntime's "Load model failed:") is
    joined with the lines that follow it. Otherwise the first line; the exception's type when there is none."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if match := _DIAGNOSTIC.search(line):
            return line[match.start(1):][:400]
    useful = iter([line for line in lines if not line.startswith(_NOISE)])
    key = next(useful, type(exc).__name__)
    while key.endswith(":") and (more := next(useful, None)) is not None:
        key = f"{key} {more}"
    return key[:400]

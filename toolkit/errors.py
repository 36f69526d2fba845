"""One exception tree. Each class carries the exit code of the CLI contract; ``toolkit.cli`` is the one place
that turns a :class:`ToolkitError` into a message and that code.

Exit codes (architecture.md): 0 ok; 1 a check or gate failed; 2 bad usage, config or input; 3 conversion
failed; 4 a device could not be reached, refused us, or could not take the bundle.
"""

from __future__ import annotations

import re


class ToolkitError(Exception):
    """Base of every error edgetk reports to a user: a plain message plus what to do about it."""

    fix: str = (
        "Read the message and its hint: they name the problem and what to change. "
        "--debug adds the traceback."
    )

    exit_code: int = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class UsageError(ToolkitError):
    """Bad usage, configuration or input: a path, a flag, a profile, calibration data (exit 2)."""

    fix = (
        "Fix the path, flag, profile or file the message names; the hint gives the nearest valid value. "
        "`edgetk COMMAND --help` lists every option."
    )

    exit_code = 2


class ConversionError(ToolkitError):
    """A converter or quantizer failed on a valid request (exit 3)."""

    fix = (
        "Try another --format or --precision for this model (the manifest records every attempt and why it "
        "failed), or convert from the original framework's model; --debug shows the converter's own error."
    )

    exit_code = 3


class ArtifactRefused(ConversionError):
    """An artifact was built, but its own runtime refuses to load or run it (exit 3). The convert stage retries
    it with the node the runtime names kept float (``runtime_retry``) instead of dropping it as a build failure."""

    fix = (
        "Usually nothing: convert retries the artifact with the node the runtime names kept float, and drops "
        "only that artifact when the retry fails too. If no artifact is left, try another precision or "
        "format."
    )


class ArtifactCrashed(ArtifactRefused):
    """The artifact's first load or run killed the runtime, in a child process (``crash_guard``) (exit 3)."""

    fix = (
        "Usually nothing: the crash happened in a child process, and convert retries with the crashing op "
        "kept float; the other artifacts are kept either way."
    )


class DeviceError(ToolkitError):
    """A device could not be reached, refused us, or could not take the bundle (exit 4).

    The subclasses below say which, so that the stages branch on the type and never on the message text.
    """

    fix = (
        "Check that the device is on, reachable (`ssh SPEC`) and has room; `edgetk devices probe --device "
        "SPEC` shows what it has."
    )

    exit_code = 4


class DeviceUnreachable(DeviceError):
    """No SSH session could be opened: unknown name, nothing listening, no answer, a proxy that failed."""

    fix = (
        "Check the name, address and port (`ssh -v SPEC`), that an SSH server runs on the device and that "
        "nothing blocks the port; an ~/.ssh/config Host alias works as a SPEC."
    )


class HostKeyRefused(DeviceError):
    """The device's host key is unknown (and not to be trusted) or CHANGED: nothing was sent to it."""

    fix = (
        "An unknown key: re-run once with --trust-new-host (it is then recorded in known_hosts). A changed "
        "key: find out why first (a reinstalled device?), then remove the old entry with `ssh-keygen -R HOST`"
        " if you trust the new one."
    )


class AuthRefused(DeviceError):
    """The device refused every way we could log in (the message says what it offered and what was tried)."""

    fix = (
        "Give a key the device accepts (identity_file in the inventory, IdentityFile in ~/.ssh/config, or "
        "ssh-agent); a password-only device takes your key with `edgetk devices add-key --device SPEC`; a "
        "key's passphrase can come from EDGETK_SSH_PASSPHRASE."
    )


class LinkDropped(DeviceError):
    """An open connection to the device broke mid-way; nothing more can be done on it (no clean-up either)."""

    fix = (
        "Re-run the command once the link is back: the running version was not touched, and a push resumes "
        "after the part already sent and hash-checked."
    )


class DeviceStopped(LinkDropped):
    """The device stopped answering (a frozen userland, a hung SD card, an OOM-thrashing board) while its
    TCP link still looked alive: no reply to the SSH keepalives within their bounded number of misses."""

    fix = (
        "Let the device recover or power-cycle it (look at its memory, storage and temperature), then re-run:"
        " `current` was not touched and the push resumes."
    )


class DeviceTimeout(DeviceError):
    """A command on a device that still answers did not finish within its deadline."""

    fix = (
        "Re-run; if it times out again, look at what keeps the device busy (load, memory, swap) with `edgetk "
        "devices probe --device SPEC`."
    )


class DeviceDiskFull(DeviceError):
    """The device's disk (or quota) cannot take what is being written."""

    fix = (
        "Free space on the device: `edgetk prune NAME --device SPEC` removes old versions (never the current "
        "one or the rollback target), or re-run the deploy with --prune."
    )


class DeviceShellNoise(DeviceError):
    """The device user's login shell prints text on start-up, and it broke a reply that could not be framed."""

    fix = (
        "Make the device user's login shell quiet for non-interactive sessions: move what ~/.bashrc or "
        "~/.profile prints into an interactive-only branch."
    )


class VersionReplaced(DeviceError):
    """Another controller installed a newer version of the bundle while this one checked its own: this check's
    selection is not written (the newer version's check decides). Exit 4: this command's version is not what
    the device runs."""


class MissingRuntime(DeviceError):
    """The device's runtime cannot run the bundle's artifacts: a ``.pte`` exported by another executorch release
    than the device's (the version lock; the device's runner reports the same as ``missing_runtime``). The hint
    names the release to install."""

    fix = (
        "Install the runtime release the hint names on the device (`edgetk devices setup --device SPEC "
        "--runtime executorch` installs this machine's), or convert with the device's release."
    )


class MissingDependency(UsageError):
    """An optional framework is not installed; the hint names the extra to add."""

    fix = (
        "Install the extra the hint names, e.g. pip install 'edge-toolkit[tf]' (the Install page lists "
        "them)."
    )

    def __init__(self, package: str, *, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the Python package {package!r}, which is not installed.",
            hint=f"Install it with: pip install 'edge-toolkit[{extra}]'",
        )
        self.package = package
        self.extra = extra


class CompilerMissing(UsageError):
    """No compiler can build the native .pte runner for a device (neither this machine's nor the device's): the
    hint names the package to install on either side."""


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


def origin(exc: BaseException) -> str | None:
    """Where a third-party exception was raised: ``module.function`` of the innermost Python frame of its traceback
    outside this toolkit (a quantizer's own code, or the Python wrapper of the native call that raised); None when
    every frame is the toolkit's. A bare message ("The truth value of an array ... is ambiguous") says nothing of
    which tool failed; this does."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__") or "")
        if module and module.split(".")[0] not in ("toolkit", "__main__", "builtins"):
            found = f"{module}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return found

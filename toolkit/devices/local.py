"""The ``local`` device: this machine, no SSH. Same interface and same home-relative paths as an SSH device,
so the whole deploy/check path (and its tests) runs identically here; the base directory is ``~/.edgetk``."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from toolkit.devices.connection import Progress
from toolkit.devices.spec import DeviceSpec
from toolkit.errors import DeviceError, DeviceTimeout
from toolkit.model.device_records import CommandResult

_CHUNK = 1 << 20


class LocalConnection:
    """Runs commands as subprocesses (argv, no shell) with the home directory as working directory."""

    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.home = Path.home()

    def _path(self, remote: str) -> Path:
        return self.home / os.path.expanduser(remote) if not remote.startswith("/") else Path(remote)

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        try:
            proc = subprocess.run(
                [str(a) for a in argv], cwd=self.home, capture_output=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise DeviceTimeout(
                f"{self.name}: {os.path.basename(str(argv[0]))} did not finish within {timeout:.0f} s.",
                hint="Raise the timeout, or look at what hangs on the device.",
            ) from None
        except OSError as exc:
            return CommandResult(127, "", f"{argv[0]}: {exc.strerror or exc}")
        killed = None
        if proc.returncode < 0:
            try:
                killed = signal.Signals(-proc.returncode).name
            except ValueError:
                killed = f"signal {-proc.returncode}"
        return CommandResult(
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
            killed,
        )

    def put(self, local: Path, remote: str, *, progress: Progress | None = None, offset: int = 0) -> None:
        target = self._path(remote)
        total = Path(local).stat().st_size - offset
        sent = 0
        try:
            with open(local, "rb") as src, open(target, "r+b" if offset else "wb") as dst:
                os.fchmod(dst.fileno(), 0o644)
                if offset:
                    src.seek(offset)
                    dst.seek(offset)
                    dst.truncate()
                while block := src.read(_CHUNK):
                    dst.write(block)
                    sent += len(block)
                    if progress:
                        progress(sent, total)
        except OSError as exc:
            raise DeviceError(f"{self.name}: cannot write {remote} ({exc.strerror or exc}).") from exc

    def get(self, remote: str, local: Path) -> None:
        try:
            Path(local).write_bytes(self._path(remote).read_bytes())
        except OSError as exc:
            raise DeviceError(f"{self.name}: cannot read {remote} ({exc.strerror or exc}).") from None

    def exists(self, remote: str) -> bool:
        return os.path.lexists(self._path(remote))

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalConnection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

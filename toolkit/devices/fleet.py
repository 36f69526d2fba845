"""Run one task per device with bounded concurrency (threads: the work is network- and device-bound).

One failing device never stops the others: every device gets an outcome, ``.succeeded`` / ``.failed``, and the
exit code follows architecture.md (worst wins: 4 device error, else 2 usage, else 1 gate failed, else 0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from toolkit.devices.spec import DeviceSpec
from toolkit.errors import ToolkitError, worst_exit_code

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceOutcome(Generic[T]):
    """What happened on one device: a value, or the error that stopped it (and its exit code)."""

    device: str
    value: T | None = None
    error: str | None = None
    exit_code: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0


@dataclass(frozen=True)
class FleetResult(Generic[T]):
    outcomes: tuple[DeviceOutcome[T], ...]

    @property
    def succeeded(self) -> tuple[DeviceOutcome[T], ...]:
        return tuple(o for o in self.outcomes if o.ok)

    @property
    def failed(self) -> tuple[DeviceOutcome[T], ...]:
        return tuple(o for o in self.outcomes if not o.ok)

    @property
    def exit_code(self) -> int:
        return worst_exit_code([o.exit_code for o in self.outcomes])


def named_once(message: str, device: str) -> str:
    """``message`` with the device's name at its start at most once: the layers a device error passes through
    (the connection, the step, the fleet) each may name the device, and "pi-1: pi-1: ..." says nothing more."""
    prefix = f"{device}: "
    while message.startswith(prefix + prefix):
        message = message[len(prefix):]
    return message


def _one(task: Callable[[DeviceSpec], T], spec: DeviceSpec) -> DeviceOutcome[T]:
    try:
        return DeviceOutcome(spec.name, value=task(spec))
    except ToolkitError as exc:
        message = named_once(exc.message, spec.name)
        text = message if not exc.hint else f"{message} {exc.hint}"
        return DeviceOutcome(spec.name, error=text, exit_code=exc.exit_code)
    except Exception as exc:  # a bug or an unexpected failure on one device must not stop the fleet
        log.debug("unexpected error on %s", spec.name, exc_info=True)
        return DeviceOutcome(spec.name, error=f"unexpected {type(exc).__name__}: {exc}", exit_code=4)


def run_fleet(
    specs: Sequence[DeviceSpec], task: Callable[[DeviceSpec], T], *, parallel: int = 4
) -> FleetResult[T]:
    """``task(spec)`` for every device, at most ``parallel`` at once; outcomes in the order of ``specs``."""
    if len(specs) <= 1 or parallel <= 1:
        return FleetResult(tuple(_one(task, s) for s in specs))
    with ThreadPoolExecutor(max_workers=min(parallel, len(specs)), thread_name_prefix="edgetk-device") as pool:
        futures = [pool.submit(_one, task, s) for s in specs]
        return FleetResult(tuple(f.result() for f in futures))

"""One row per runtime: what format it runs, the package that is it, how to prove it loads, how to install it.

The rows are written once, as plain data, in ``toolkit/device_side/shared.py`` (``RUNTIME_ROWS``): the shipped
runner is a standalone file and carries them inlined (``toolkit.device_side.assemble``); here they become
:class:`RuntimeSpec` records with their vocabulary, which everything on the host that names a runtime's package
reads (device setup, :mod:`toolkit.delivery.provisioning`: what to install, what to import to prove it loads). A
new runtime is one row there, its name in :class:`toolkit.model.vocabulary.Runtime`, and its loader (a host session
in :mod:`toolkit.runtimes.execution`, the runner's loader on the device).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.device_side.shared import RUNTIME_ROWS
from toolkit.model.vocabulary import Format, Runtime


@dataclass(frozen=True)
class RuntimeSpec:
    """A runtime's facts: one row of ``RUNTIME_ROWS`` (each field is described there), its names members of the
    vocabulary."""

    runtime: Runtime
    format: Format
    distributions: tuple[str, ...]
    module: str
    verify_module: str
    install_hint: str
    requirements: tuple[str, ...] = ()
    without_deps: bool = False

    @property
    def distribution(self) -> str:
        """The distribution setup installs."""
        return self.distributions[0]


RUNTIME_SPECS: tuple[RuntimeSpec, ...] = tuple(
    RuntimeSpec(**{**row, "runtime": Runtime(row["runtime"]), "format": Format(row["format"])})
    for row in RUNTIME_ROWS)
SPECS: dict[Runtime, RuntimeSpec] = {spec.runtime: spec for spec in RUNTIME_SPECS}


def runtimes_for(fmt: Format) -> tuple[Runtime, ...]:
    """The runtimes that run ``fmt``, in the table's order (the runner tries them in this order)."""
    return tuple(spec.runtime for spec in RUNTIME_SPECS if spec.format == fmt)

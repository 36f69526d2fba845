"""What sources and host sessions share: the tensors a loaded model takes and gives (no runtime imported here)."""

from __future__ import annotations

from toolkit.model.tensors import TensorSpec


class TensorIO:
    """The inputs and outputs of a loaded model (a source) or artifact (a host session), read from it once by
    its loader."""

    _inputs: tuple[TensorSpec, ...]
    _outputs: tuple[TensorSpec, ...]

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

"""The layer table of the PyTorch routes (-> TFLite through litert-torch, -> ExecuTorch): PT2E's own
measurement (``layers.layer_rows``, with the route's quantizer: litert-torch's or XNNPACK's)."""

from __future__ import annotations

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.layers import LayerTable, ranked
from toolkit.model.vocabulary import Format


def pt2e_table(request: ConversionRequest, full: BuiltArtifact | None = None) -> LayerTable:
    """The PyTorch -> TFLite and -> ExecuTorch routes' table: PT2E's own measurement (``pt2e.layers.layer_rows``,
    with the route's quantizer: litert-torch's or XNNPACK's; ``full`` is not read)."""
    from toolkit.conversion.pt2e import layers as pt2e_layers

    rows, samples = pt2e_layers.layer_rows(request)
    return LayerTable(route=Format(request.recipe.format), method=pt2e_layers.TABLE_METHOD, samples=samples,
                      rows=ranked(rows))

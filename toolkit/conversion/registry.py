"""Building an artifact through its route (``routes.ROUTES``): refuse a pair or an A16W8 recipe the route does not
offer, else hand the request to the route's backend (``backend.backend_for``)."""

from __future__ import annotations

from pathlib import Path

from toolkit.conversion.backend import backend_for
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.routes import check_supported
from toolkit.errors import UsageError


def build(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """``request``'s artifact at ``output``, by its route's backend; a pair or an A16W8 recipe the route does not
    offer is refused (``UsageError``)."""
    framework, fmt = request.source.framework, request.recipe.format
    row = check_supported(framework, fmt)
    refusal = row.a16w8_refusal if request.recipe.a16w8 else None
    if refusal is not None:
        raise UsageError(refusal.message, hint=refusal.hint)
    return backend_for(framework, fmt).build(request, output)

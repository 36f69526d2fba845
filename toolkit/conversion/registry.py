"""Building an artifact through its route (``routes.ROUTES``): refuse a pair or precision that is not offered,
else hand the request to the route's backend (``backend.backend_for``)."""

from __future__ import annotations

from pathlib import Path

from toolkit.conversion.backend import backend_for
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.routes import Refusal, route
from toolkit.errors import UsageError


def supports(framework: str, fmt: str) -> Refusal | None:
    """None when a route exists; else why not and what to do."""
    row = route(framework, fmt)
    if row is None:
        return Refusal(f"There is no route from {framework} to {fmt}.", "Use another --format.")
    return row.refusal if row.backend is None else None


def supports_precision(framework: str, fmt: str, precision: str) -> bool:
    row = route(framework, fmt)
    return row is not None and row.backend is not None and precision not in row.unbuilt


def check_supported(framework: str, fmt: str) -> None:
    refusal = supports(framework, fmt)
    if refusal is not None:
        raise UsageError(refusal.message, hint=refusal.hint)


def build(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """``request``'s artifact at ``output``, by its route's backend; a pair or an A16W8 recipe the route does not
    offer is refused (``UsageError``)."""
    framework, fmt = request.source.framework, request.recipe.format
    check_supported(framework, fmt)
    row = route(framework, fmt)
    refusal = row.a16w8_refusal if row is not None and request.recipe.a16w8 else None
    if refusal is not None:
        raise UsageError(refusal.message, hint=refusal.hint)
    return backend_for(framework, fmt).build(request, output)

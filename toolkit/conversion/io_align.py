"""Which artifact tensor carries each source tensor: converters rename tensors (``image`` ->
``serving_default_image:0``) and may reorder them. Its own module, so that the verification child
(``measure_child``) aligns without importing the convert stage.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from toolkit.errors import ConversionError
from toolkit.model.tensors import TensorSpec


def align(source: Sequence[TensorSpec], artifact: Sequence[TensorSpec], *, what: str) -> list[int]:
    """For each source tensor, the index of the artifact tensor that carries it: converters rename tensors (``image``
    -> ``serving_default_image:0``) and may reorder them; match by name, then containment, then position."""
    if len(source) != len(artifact):
        extra = [a.name for a in artifact if a.name not in {s.name for s in source}]
        raise ConversionError(
            f"The artifact has {len(artifact)} {what}s but the source model has {len(source)}"
            + (f" (extra: {', '.join(extra[:4])})" if extra else "")
            + ": the converter changed the model's signature."  # the signature failure's workaround follows
        )
    order: list[int | None] = [None] * len(source)
    free = list(range(len(artifact)))
    for matcher in (
        lambda s, a: a.name == s.name,
        lambda s, a: bool(s.name) and re.search(rf"(^|[^A-Za-z0-9]){re.escape(s.name)}([^A-Za-z0-9]|$)", a.name)
        is not None,
    ):
        for i, spec in enumerate(source):
            if order[i] is None:
                hits = [j for j in free if matcher(spec, artifact[j])]
                if len(hits) == 1:
                    order[i] = hits[0]
                    free.remove(hits[0])
    for i in range(len(source)):
        if order[i] is None:
            order[i] = free.pop(0)
    return [int(j) for j in order if j is not None]

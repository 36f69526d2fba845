"""Schemas of the files users write (target profiles, the device inventory, ``dataset.toml``, ``run.toml``)
and of the bundle's ``manifest.json``, as pydantic 2 models with ``extra="forbid"``, at the file boundary only:
a file is parsed, validated here, and turned into the frozen dataclasses of :mod:`toolkit.model`; nothing past
the boundary sees pydantic. Every refusal goes through :mod:`.problems`, so each message names the file, the
key and the fix. pydantic is imported only when a file is read (``edgetk --help`` never loads it): import these
modules inside functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from toolkit.model.schemas.problems import Problem, closest, did_you_mean, problems

__all__ = ["Problem", "closest", "did_you_mean", "problems", "validate"]

if TYPE_CHECKING:  # pragma: no cover - pydantic loads only when a file is read
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")


def validate(model: type[M], data: object, *, file: object, docs: str, partial: bool = False,
             missing_context: str = "") -> M | None:
    """``data`` as a ``model``, or a UsageError for the first problem (unknown keys first).

    ``partial``: a key missing from a top-level table is not a problem yet (the file ``extends`` another, which
    may have it); returns None when that is all that is wrong. Keys missing inside an array of tables still
    are: arrays are replaced wholesale, never merged. ``missing_context`` is added to a missing key's message.
    """
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        found = problems(exc, model, docs=docs, missing_context=missing_context)
    if partial:
        found = [p for p in found if not (p.kind == "missing" and "[" not in p.key and not p.table)]
        if not found:
            return None
    raise found[0].error(file) from None

"""A raw detector head's layout, as declared (``--output-task NAME=detection-head,layout=n_5c,boxes=grid``) or
inferred (:mod:`toolkit.verification.detection_head`): the vocabulary only, stdlib only.

A raw head is one output holding, per anchor (grid cell), a box and its scores, before any NMS: YOLOv5 and
YOLOX export ``[N, 4+1+C]`` (box, objectness, class scores), YOLOv8 ``[4+C, N]`` (or transposed ``[N, 4+C]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from toolkit.errors import UsageError


class HeadLayout(StrEnum):
    N_5C = "n_5c"  # [N, 4+1+C]: box, objectness, C class scores per anchor (YOLOv5, YOLOX); score = obj x class
    N_4C = "n_4c"  # [N, 4+C]: box, C class scores per anchor (YOLOv8 transposed); score = class
    C4_N = "4c_n"  # [4+C, N]: YOLOv8's export, channels first

    @property
    def objectness(self) -> bool:
        return self is HeadLayout.N_5C

    @property
    def channels_first(self) -> bool:
        return self is HeadLayout.C4_N


class BoxEncoding(StrEnum):
    CXCYWH = "cxcywh"  # centre and size in the input's frame (Ultralytics and YOLOX after decoding)
    XYXY = "xyxy"  # corners in the input's frame
    GRID = "grid"  # raw: centre offset within the anchor's cell, log width and height in cells (YOLOX raw)


@dataclass(frozen=True)
class HeadSpec:
    """What the user declared of a raw head; a field left None is inferred from the float values."""

    layout: HeadLayout | None = None
    boxes: BoxEncoding | None = None

    def options(self) -> str:
        """The declaration's options as written after the role (``,layout=n_5c,boxes=grid``)."""
        return "".join(f",{key}={value.value}" for key, value in (("layout", self.layout), ("boxes", self.boxes))
                       if value is not None)


def parse_head(options: dict[str, str], where: str) -> HeadSpec:
    """``layout=`` and ``boxes=`` of a ``detection-head`` declaration, or a plain usage error."""
    layout = options.get("layout")
    boxes = options.get("boxes")
    try:
        return HeadSpec(HeadLayout(layout) if layout is not None else None,
                        BoxEncoding(boxes) if boxes is not None else None)
    except ValueError:
        raise UsageError(f"{where}: layout={layout!r}, boxes={boxes!r} is not a raw head layout.",
                         hint=f"Write layout={'|'.join(v.value for v in HeadLayout)} and boxes="
                              f"{'|'.join(v.value for v in BoxEncoding)}, e.g. NAME=detection-head,layout=n_5c,"
                              "boxes=grid.") from None

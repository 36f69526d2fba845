"""Which bytes of a bundle a push sends: gzip copies where they pay (``--compress``), and where a cut-short upload
resumes (its bytes on the device are a prefix of ours)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.delivery.bundle import Bundle

COMPRESS_LEVEL = 6  # zlib level: most of level 9's ratio on model files at a fraction of its CPU time
COMPRESS_MIN_SAVING = 0.10  # send compressed only when that saves at least 10% of the file
COMPRESS_MIN_BYTES = 4096  # smaller files: not worth a round of inflate


def compress_files(bundle: Bundle, rels: list[str], folder: Path) -> dict[str, Path]:
    """gzip each file (level ``COMPRESS_LEVEL``) into ``folder``; keep those where it saves enough."""
    import zlib

    packed: dict[str, Path] = {}
    for index, rel in enumerate(rels):
        source = bundle.path / rel
        size = source.stat().st_size
        if size < COMPRESS_MIN_BYTES:
            continue
        target = folder / f"{index}.gz"
        compressor = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)  # 31: gzip container
        with open(source, "rb") as src, open(target, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(compressor.compress(block))
            dst.write(compressor.flush())
        if target.stat().st_size <= size * (1.0 - COMPRESS_MIN_SAVING):
            packed[rel] = target
        else:
            target.unlink()
    return packed


def resume_offsets(bundle: Bundle, partial: dict[str, Any], sizes: dict[str, int]) -> dict[str, int]:
    """For each cut-short file on the device: resume at its size when its bytes are a prefix of ours."""
    import hashlib

    offsets: dict[str, int] = {}
    for rel, entry in partial.items():
        try:
            have, digest = int(entry[0]), str(entry[1])
        except (TypeError, ValueError, IndexError):
            continue
        if rel not in sizes or not 0 < have < sizes[rel]:
            continue
        prefix = hashlib.sha256()
        with open(bundle.path / rel, "rb") as handle:
            left = have
            while left > 0:
                block = handle.read(min(left, 1 << 20))
                if not block:
                    break
                prefix.update(block)
                left -= len(block)
        if prefix.hexdigest() == digest:
            offsets[rel] = have
    return offsets

"""Load a model behind one interface, whatever framework it comes from.

What a source is comes from its path and content (``detect``), never from a flag. Heavy frameworks are
imported inside the loader that needs them.
"""

from __future__ import annotations

from toolkit.sources.base import SourceModel
from toolkit.sources.detect import detect_framework, open_source

__all__ = ["SourceModel", "detect_framework", "open_source"]

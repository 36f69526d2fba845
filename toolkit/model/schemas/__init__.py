"""The field types of the files users write (target profiles, the device inventory, ``dataset.toml``,
``run.toml``) and the words every refusal is put in (:mod:`.problems`). Each file's shape is a frozen dataclass
read by the one engine for records, :mod:`toolkit.model.reading` (the manifest's records too), so every message
names the file, the table, the key and the fix in the same words. Stdlib only.
"""

from __future__ import annotations

from toolkit.model.schemas.problems import Problem, closest, did_you_mean

__all__ = ["Problem", "closest", "did_you_mean"]

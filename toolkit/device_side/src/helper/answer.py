"""The helper's answer: one JSON object between frame markers on stdout (the host reads only what is inside them,
``toolkit.delivery.deployment.unframe``), exit 0 when done, 3 for a refusal (``fail``: a kind from HelperRefusal's words
and a message the host turns into its plain one).
"""
import json
import sys
from typing import Any, Dict, NoReturn  # noqa: F401 (type comments)

# --- shipped from here (the lines above are for the host's type checker) ---

FRAME_BEGIN = "\x1eedgetk-json\n"  # the host reads the JSON from between these (toolkit.delivery.deployment.unframe)


FRAME_END = "\n\x1eedgetk-end\n"


def emit(obj, code=0):
    # type: (Dict[str, Any], int) -> NoReturn
    reply(obj)
    sys.exit(code)


def reply(obj):
    # type: (Dict[str, Any]) -> None
    """An answer the host reads while this run goes on (``push``: begin's plan before the files arrive)."""
    sys.stdout.write(FRAME_BEGIN + json.dumps(obj) + FRAME_END)
    sys.stdout.flush()


def fail(kind, message, **extra):
    # type: (str, str, **Any) -> NoReturn
    extra.update({"kind": kind, "error": message})
    emit(extra, 3)

"""Keep the native frameworks' log spam (absl/glog lines, oneDNN and CUDA notices, converter chatter written
straight to file descriptor 2) out of a user's terminal. ``--debug`` (EDGETK_DEBUG=1) shows it all."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


def debugging() -> bool:
    return os.environ.get("EDGETK_DEBUG") == "1"


@contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Redirect fd 2 to /dev/null for the block (Python-level exceptions still propagate)."""
    if debugging():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow_quietly() -> None:
    """Import tensorflow once with its start-up notices silenced."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules:
        return
    with native_stderr_silenced():
        import tensorflow  # noqa: F401

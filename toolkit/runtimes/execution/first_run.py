"""``python -m toolkit.runtimes.execution.first_run ARTIFACT FEEDS.npz [THREADS]``: load an artifact in its runtime
and run it once on the feeds (keyed by the artifact's input names), in a process of its own.

The convert stage runs this before it loads the artifact itself (``toolkit.conversion.crash_guard``): a runtime
that crashes on an artifact (a kernel's segfault or abort) ends this process, not the convert run. It prints
``loaded`` once the runtime holds the artifact and ``ran`` after the inference, so the parent knows which of the
two crashed. An ordinary error exits 1: the parent leaves it to its own load, which reports it in full.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import numpy as np

    from toolkit.runtimes.execution import open_session

    path, feeds = Path(argv[0]), np.load(argv[1])
    threads = int(argv[2]) if len(argv) > 2 else None
    session = open_session(path, threads=threads)
    print("loaded", flush=True)
    session.run({name: feeds[name] for name in feeds.files})
    print("ran", flush=True)
    session.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as exc:  # noqa: BLE001 - any ordinary error: the parent's own load reports it
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)

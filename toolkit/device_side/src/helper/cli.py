"""The helper's verbs: ``COMMANDS`` (a verb to its ``cmd_`` function, called with the verb's argv words) and
``main`` (an unknown verb or wrong arguments a ``usage`` refusal, an OS error ``disk_full`` or ``os_error``).
"""
import os
from typing import Callable, Dict, List  # noqa: F401 (type comments)
from .answer import fail
from .locks import cmd_lock, cmd_unlock
from .device import cmd_info
from .install import cmd_abort, cmd_finish, cmd_inflate, cmd_prepare, cmd_prune
from .push import cmd_begin, cmd_push, cmd_receive
from .bundles import cmd_remove, cmd_rollback, cmd_select, cmd_selected, cmd_status

# --- shipped from here (the lines above are for the host's type checker) ---

COMMANDS = {  # type: Dict[str, Callable[..., None]]
    "info": cmd_info, "prepare": cmd_prepare, "abort": cmd_abort, "finish": cmd_finish,
    "rollback": cmd_rollback, "status": cmd_status, "remove": cmd_remove, "lock": cmd_lock,
    "unlock": cmd_unlock, "inflate": cmd_inflate, "begin": cmd_begin, "receive": cmd_receive, "prune": cmd_prune,
    "push": cmd_push, "select": cmd_select, "selected": cmd_selected,
}


def main(argv):
    # type: (List[str]) -> None
    if not argv or argv[0] not in COMMANDS:
        fail("usage", "unknown helper command %r" % (argv[:1],))
    os.umask(0o022)
    try:
        COMMANDS[argv[0]](*argv[1:])
    except TypeError as exc:
        fail("usage", "bad arguments for %s: %s" % (argv[0], exc))
    except OSError as exc:
        kind = "disk_full" if exc.errno in (28, 122) else "os_error"
        fail(kind, "%s: %s" % (exc.strerror or exc, getattr(exc, "filename", "") or ""))

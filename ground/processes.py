"""Whether a process still runs, as Linux's ``/proc`` tells it: the one answer that the temp-file sweep,
the hang watchdog and the local executor share."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie has exited (``kill -0`` still succeeds on one, and a parent that
    has not reaped its child yet would otherwise wait on it forever). Where ``/proc`` hides the pid (another
    user's process under ``hidepid``), ``kill -0`` decides: a process that exists but is not ours runs."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the name in parentheses
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

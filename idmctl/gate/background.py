"""Run one check in a forked child while the parent does the rest of the preflight (its wall time).

Introspection imports the trainer's registries, i.e. torch: ~1.4 s of a cold ``idmctl preflight``, on
one core. Forked at the start of ``run_preflight``, the child pays that import on the second core while
the parent opens (and on a new home, creates) the store and runs the other checks. Fork rather than a
fresh interpreter: the child runs the very same check function on the very same in-memory spec (and
whatever a test patched), so its verdict cannot differ from running it in-process; the result comes
back pickled through a pipe.

If anything goes wrong with the child (no fork, it died, it said nothing, it overran its deadline),
``collect`` runs the check in-process instead: the background is only ever an optimisation.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from idmctl.core.checks import CheckResult

DEADLINE_S = 300.0
"""How long ``collect`` waits for the child before killing it and running the check itself (an import
that hangs in the child must not hang the preflight)."""


@dataclass
class Forked:
    pid: int
    fd: int
    reaped: bool = False


def start(check: Callable[[], CheckResult], heavy_module: str = "torch") -> Forked | None:
    """Fork a child that runs ``check`` and writes its pickled result; None when forking cannot help
    (``heavy_module`` already imported, so the check is cheap in-process) or is not available."""
    if heavy_module in sys.modules or not hasattr(os, "fork"):
        return None
    read_fd, write_fd = os.pipe()
    # Flush first: buffered output would otherwise be written twice, once by each process.
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid == 0:  # the child: never returns into the caller's code, never runs its atexit/finally blocks
        code = 1
        try:
            os.close(read_fd)
            payload = pickle.dumps(check())
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return Forked(pid, read_fd)


def _read_all(fd: int, deadline: float) -> bytes | None:
    """Everything the child writes until it closes the pipe; None past the deadline."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def cancel(forked: Forked | None, kill: bool = True) -> None:
    """Close the pipe and reap the child (killing it first unless ``kill`` is False); idempotent, so a
    caller's error path can always call it."""
    if forked is None or forked.reaped:
        return
    forked.reaped = True
    os.close(forked.fd)
    if kill:
        try:
            os.kill(forked.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.waitpid(forked.pid, 0)


def collect(forked: Forked | None, check: Callable[[], CheckResult], deadline_s: float = DEADLINE_S) -> CheckResult:
    """The child's result, or ``check()`` run here when there is no child or it gave no result."""
    if forked is None or forked.reaped:
        return check()
    payload = None
    try:
        payload = _read_all(forked.fd, time.monotonic() + deadline_s)
    finally:
        cancel(forked, kill=payload is None)  # None: past the deadline (or interrupted), the child may hang
    if payload:
        try:
            result = pickle.loads(payload)
        except Exception:  # a truncated pickle from a child that died mid-write
            result = None
        if isinstance(result, CheckResult):
            return result
    return check()

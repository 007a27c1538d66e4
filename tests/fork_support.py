"""Real processes forked from the test's own, with what the test already imported (torch, the builders, the
store's SQLAlchemy and Alembic, MLflow): the SIGKILL tests of the writers that must leave only whole files,
and the tests of many processes using one store at once. A fresh interpreter pays ~1 s of CPU (idmctl's
store) to ~5 s (torch + Fabric + MLflow) in imports before it does what the test is about; a fork starts in
milliseconds, and the processes still race each other for real (their own pids, file locks, connections)."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch


@dataclass(frozen=True)
class Forked:
    """A child of this process, started by :func:`start_forked`."""

    pid: int
    what: str
    output: Path | None
    """Where the child's stdout and stderr went (None: into the test's own captured output)."""


def start_forked(action: Callable[[], object], what: str, *, output: Path | None = None,
                 env: Mapping[str, str] | None = None) -> Forked:
    """Start ``action`` in a real process forked from this one and return at once; :func:`wait_forked` reaps it.

    The child exits with ``action``'s int result (0 for any other result, 1 on an exception, whose traceback
    it prints); it never returns into pytest. ``env`` updates its ``os.environ`` first; ``output`` takes its
    stdout and stderr. Whatever ``action`` patches (``os.fsync``) stays in the child. The child runs on one
    CPU and one torch thread: GNU OpenMP's thread pool does not survive a fork, and a child that computes on
    it can hang (builders size their threads from the CPUs they may use)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if output is not None:
                fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
            os.environ.update(env or {})
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
            torch.set_num_threads(1)
            result = action()
            code = result if isinstance(result, int) else 0
        except BaseException:
            traceback.print_exc()  # into ``output``, or this test's captured stderr
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return Forked(pid, what, output)


def wait_forked(child: Forked, deadline_s: float = 300.0) -> int:
    """``child``'s exit status as ``subprocess`` reports one (-9 when it was SIGKILLed); a child still running
    at the deadline is killed and the test fails, naming what it waited for."""
    deadline = time.monotonic() + deadline_s
    while True:
        done, status = os.waitpid(child.pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(child.pid, signal.SIGKILL)
            os.waitpid(child.pid, 0)
            pytest.fail(f"timed out after {deadline_s:.0f} s waiting for {child.what} to end")
        time.sleep(0.01)


def run_forked(action: Callable[[], object], what: str, deadline_s: float = 300.0) -> int:
    """Run ``action`` in a forked child (:func:`start_forked`) and return its exit status (:func:`wait_forked`)."""
    return wait_forked(start_forked(action, what), deadline_s)


def failures_of(children: list[Forked], deadline_s: float = 300.0) -> list[str]:
    """Reap every child; for each one that did not exit 0, its description, status and the end of its output."""
    failed = []
    for child in children:
        code = wait_forked(child, deadline_s)
        if code != 0:
            text = child.output.read_text(errors="replace") if child.output and child.output.exists() else ""
            failed.append(f"{child.what} exited {code}:\n{text[-3000:]}")
    return failed


def sigkill_at_fsync_of(marker: str) -> None:
    """From now on this process SIGKILLs itself in the ``os.fsync`` of a file whose path holds ``marker``
    (``".demo_1.safetensors.tmp"``: that file's bytes written, not yet renamed). Only inside a forked action."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if marker in os.readlink(f"/proc/self/fd/{fd}"):
            os.kill(os.getpid(), signal.SIGKILL)
        real_fsync(fd)

    os.fsync = fsync


def sigkill_at_fsync(nth: int) -> None:
    """From now on this process SIGKILLs itself in its ``nth`` ``os.fsync``: a writer's bytes are all written
    and not yet renamed into place, the worst moment to die. Call it only inside ``run_forked``'s action."""
    calls, real_fsync = [], os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        real_fsync(fd)

    os.fsync = fsync

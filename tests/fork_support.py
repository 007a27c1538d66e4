"""A real process forked from the test's own (torch and the builders already imported), killed where a test
wants it: the SIGKILL tests of the writers that must leave only whole files."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

import pytest
import torch


def run_forked(action: Callable[[], object], what: str, deadline_s: float = 300.0) -> int:
    """Run ``action`` in a real process forked from this one (torch and the builders already imported, so
    it starts in milliseconds, not the seconds a fresh interpreter takes) and return its exit status as
    ``subprocess`` reports one: -9 when it was SIGKILLed. Whatever ``action`` patches (``os.fsync``) stays in
    the child. The child runs on one CPU and one torch thread: GNU OpenMP's thread pool does not survive a
    fork, and a child that computes on it can hang (builders size their threads from the CPUs they may use)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: it never returns into pytest
        code = 1
        try:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
            torch.set_num_threads(1)
            result = action()
            code = result if isinstance(result, int) else 0
        except BaseException:
            traceback.print_exc()  # into this test's captured stderr
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + deadline_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"timed out after {deadline_s:.0f} s waiting for {what} to end")
        time.sleep(0.01)


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

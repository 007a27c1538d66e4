"""A daemon that scripts/slurm/up.sh or scripts/postgres/up.sh starts inherits none of the caller's open files.

Run as ``flock /tmp/idmctl-slurm.lock scripts/test.sh``, munged inherited the lock's descriptor from the
flock that started the suite and held the lock for as long as it ran; every later ``flock`` waited on it.
Both up scripts source scripts/daemon_fds.sh first."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from ground.paths import REPO_ROOT

SNIPPET = REPO_ROOT / "scripts" / "daemon_fds.sh"


def _start_under_flock(lock: Path, prelude: str) -> int:
    """``flock LOCK bash -c '<prelude>; sleep &'``: the pid of the background sleep (a stand-in daemon)."""
    done = subprocess.run(["flock", str(lock), "bash", "-c", f"{prelude}setsid sleep 60 >/dev/null 2>&1 & echo $!"],
                          capture_output=True, text=True, timeout=30, check=True)
    return int(done.stdout.strip())


def _lock_is_free(lock: Path) -> bool:
    return subprocess.run(["flock", "-n", str(lock), "true"], timeout=30).returncode == 0


def test_a_daemon_started_after_the_snippet_does_not_hold_the_callers_lock(tmp_path: Path) -> None:
    lock = tmp_path / "cluster.lock"
    without = _start_under_flock(lock, "")
    try:  # the failure the snippet prevents: the stand-in daemon holds the caller's lock
        assert not _lock_is_free(lock)
    finally:
        os.kill(without, signal.SIGKILL)
    with_snippet = _start_under_flock(lock, f"source {SNIPPET}; ")
    try:
        assert _lock_is_free(lock)
    finally:
        os.kill(with_snippet, signal.SIGKILL)


def test_both_up_scripts_source_the_snippet_before_starting_anything() -> None:
    for script in ("slurm/up.sh", "postgres/up.sh"):
        lines = (REPO_ROOT / "scripts" / script).read_text().splitlines()
        sourced = lines.index('source "$HERE/../daemon_fds.sh"')  # ValueError: the script does not source it
        assert lines[sourced - 1].startswith("HERE=") and sourced < 20, (script, sourced)  # before any daemon starts

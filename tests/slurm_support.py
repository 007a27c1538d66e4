"""Helpers for tests on the local Slurm cluster (scripts/slurm/up.sh).

Outside CI a missing cluster skips the test; in CI (``$CI`` set) it fails: the cluster must be up.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

ENV_FILE = Path(os.environ.get("IDMCTL_SLURM_ROOT", "/tmp/idmctl-slurm")) / "env"


def slurm_conf() -> str:
    conf = os.environ.get("SLURM_CONF")
    if not conf and ENV_FILE.exists():
        for line in ENV_FILE.read_text().splitlines():
            if line.startswith("export SLURM_CONF="):
                conf = line.split("=", 1)[1]
    if not conf or not Path(conf).exists():
        if os.environ.get("CI"):
            pytest.fail("CI needs the local Slurm cluster: SLURM_CONF is not set (scripts/test.sh brings it up)")
        pytest.skip("no local Slurm cluster (run scripts/slurm/up.sh)")
    return conf


def sh(*args: str, check: bool = True) -> str:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} → {result.returncode}: {result.stderr}")
    return result.stdout


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def text_so_far(path: Path) -> str:
    """A job log as far as it is written: Slurm creates ``--output`` only when the job starts, so a wait
    on a log must read a file that does not exist yet as empty, not crash on it."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def sacct_state(job_id: str) -> str:
    lines = sh("sacct", "-n", "-P", "-X", "-j", job_id, "--format=State", check=False).split()
    return lines[-1] if lines else ""


def squeue_state(job_id: str) -> str:
    return sh("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False).strip()

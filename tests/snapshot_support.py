"""A copy of the project to change "the live tree" in, and its CLI run from it (tests of code snapshots)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ground import code_snapshot as snap
from ground import contract
from idmctl.core.job_state import is_terminal
from idmctl.ops.executors.local import LocalExecutor
from slurm_support import slurm_conf, wait_until

REPO = Path(__file__).resolve().parent.parent
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
BREAKS_THE_TRAINER = 'raise RuntimeError("the live tree was edited after submit")\n'


@pytest.fixture
def home() -> Iterator[Path]:
    # Jobs outlive a test's assertions by seconds: a directory of the test's own, not pytest's tmp_path.
    path = Path(tempfile.mkdtemp(prefix="idmctl-snapshot-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def project(home: Path) -> Path:
    return make_project(home)


def make_project(home: Path) -> Path:
    """The project's code files (what a snapshot of it holds) in a git repository of the test's own."""
    copy = home / "project"
    for item in snap.tree(REPO).files:
        target = copy / item.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / item.path, target, follow_symlinks=False)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "copy"]):
        subprocess.run(["git", "-C", str(copy), *args], check=True, capture_output=True, env={**os.environ, **GIT_ENV})
    return copy


def idmctl(project: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI of the copy, run from it (its modules come before the editable install's)."""
    full = {**os.environ, contract.ENV_HOME: str(home), **env}
    if full.get(contract.ENV_CLUSTER, "local-slurm") == "local-slurm":
        from slurm_support import slurm_conf

        full.update({"SLURM_CONF": slurm_conf(), contract.ENV_CLUSTER: "local-slurm"})
    if "PYTHONPATH" not in env:  # the suite's own PYTHONPATH, if any, would put the suite's tree first
        full.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "idmctl", *args], cwd=project, capture_output=True, text=True,
                          env=full, timeout=300)


def submitted(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def job_row(home: Path, job_id: int) -> dict:
    with sqlite3.connect(home / "idmctl.sqlite") as db:
        db.row_factory = sqlite3.Row
        return dict(db.execute("SELECT * FROM job WHERE id = ?", (job_id,)).fetchone())


def chain_rows(home: Path, chain_id: int) -> list[dict]:
    with sqlite3.connect(home / "idmctl.sqlite") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM job WHERE chain_id = ? ORDER BY attempt", (chain_id,))]


def chain_status(home: Path, chain_id: int) -> str:
    with sqlite3.connect(home / "idmctl.sqlite") as db:
        return db.execute("SELECT status FROM chain WHERE id = ?", (chain_id,)).fetchone()[0]


def sync_until_chain_ends(project: Path, home: Path, chain_id: int, timeout_s: float) -> str:
    def ended() -> str | None:
        done = idmctl(project, home, "sync")
        assert done.returncode == 0, done.stdout + done.stderr
        status = chain_status(home, chain_id)
        return status if status != "ACTIVE" else None

    return wait_until(ended, timeout_s, f"chain {chain_id} to end (synced every 2 s)", poll_s=2.0)


def attempt_in_flight(home: Path, chain_id: int) -> bool:
    """Whether the chain's latest attempt is still queued or running, as its scheduler says: a read of the
    local executor's state file, or one ``squeue`` (a C binary, milliseconds), not a CLI process."""
    rows = chain_rows(home, chain_id)
    if not rows or rows[-1]["scheduler_id"] is None or is_terminal(rows[-1]["state"]):
        return False
    scheduler_id = rows[-1]["scheduler_id"]
    if scheduler_id.startswith("local-"):  # the local executor's own reading of its state file, in that home
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(contract.ENV_HOME, str(home))
            status = LocalExecutor().status([scheduler_id]).get(scheduler_id)
        return status is not None and not is_terminal(status.state)
    queued = subprocess.run(["squeue", "-h", "-j", scheduler_id, "-o", "%T"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "SLURM_CONF": slurm_conf()})
    return queued.returncode == 0 and bool(queued.stdout.strip())  # squeue lists unfinished jobs only


def sync_as_attempts_end(project: Path, home: Path, chain_id: int, timeout_s: float) -> str:
    """``sync_until_chain_ends`` with the copy's ``idmctl sync`` (a CLI process, ~1.7 CPU s) run only
    when the chain's latest attempt has left the queue: while it runs, a sync would change nothing."""
    def ended() -> str | None:
        if attempt_in_flight(home, chain_id):
            return None
        done = idmctl(project, home, "sync")
        assert done.returncode == 0, done.stdout + done.stderr
        status = chain_status(home, chain_id)
        return status if status != "ACTIVE" else None

    return wait_until(ended, timeout_s, f"chain {chain_id} to end (synced as each attempt left the queue)",
                      poll_s=1.0)

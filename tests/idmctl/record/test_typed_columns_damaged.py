"""A job's typed JSON column holding valid JSON of the wrong shape (a list or a number where an object
belongs, objects where ``runs`` holds a list): ``jobs show`` and ``ledger`` go on with one warning line
naming the job and the column, never a traceback, and write nothing back. Run as real processes, so
the warning is what a terminal shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from ground.paths import REPO_ROOT

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
DAMAGED = {"efficiency": [1, 2], "code": 7, "admitted": ["x"], "controller": "58", "committed_step": 3.5,
           "runs": {"state": "COMPLETED"}}


def _add(**columns: object) -> int:
    from idmctl.record.db import session
    from idmctl.record.models import Chain, Job

    with session() as db:
        chain = Chain(experiment="x", spec_hash="h", retries_budget=0)
        db.add(chain)
        db.flush()
        job = Job(chain_id=chain.id, attempt=1, experiment="x", spec_hash="h", code_version="0", executor="slurm",
                  scheduler_id="57", state="COMPLETED", qos="share", gpus=1, created_at=T0, submitted_at=T0,
                  started_at=T0, ended_at=T0 + timedelta(hours=1), **columns)
        db.add(job)
        db.flush()
        return int(job.id)


def _idmctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idmctl", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT, env=dict(os.environ))


def _stored(job: int) -> dict:
    from idmctl.record.db import session
    from idmctl.record.models import Job

    with session() as db:
        row = db.get(Job, job)
        return {name: getattr(row, name) for name in DAMAGED}


@pytest.mark.parametrize("column", sorted(DAMAGED))
def test_jobs_show_reads_a_damaged_column_as_not_recorded_with_one_warning(column: str) -> None:
    job = _add(**{column: DAMAGED[column]})
    before = _stored(job)
    result = _idmctl("jobs", "show", str(job))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    if column in ("efficiency", "code", "admitted", "controller"):  # the columns `jobs show` reads
        assert result.stderr.splitlines() == [
            f"warning: job {job}: its stored {column} is damaged (a {type(DAMAGED[column]).__name__}, not an object); "
            "read as not recorded (restore the store from a backup, or correct that row)"]
    assert result.stdout.startswith(f"job {job} (slurm 57)")
    shown = _idmctl("jobs", "show", str(job), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["job"] == job, shown.stderr
    assert _stored(job) == before  # nothing written back


def test_the_ledger_counts_a_job_whose_runs_are_damaged_from_its_row_with_one_warning() -> None:
    job = _add(runs=DAMAGED["runs"])
    _add(runs=[{"state": "COMPLETED", "seconds": 60, "ended_at": str(T0)}, 3])
    result = _idmctl("ledger", "--json")
    assert result.returncode == 0, result.stderr
    warnings = result.stderr.splitlines()
    assert warnings == [
        f"warning: job {job}: its stored runs is damaged (a dict, not a list of objects); read as not recorded "
        "(restore the store from a backup, or correct that row)",
        f"warning: job {job + 1}: its stored runs is damaged (a list, not a list of objects); read as not recorded "
        "(restore the store from a backup, or correct that row)"]
    total = json.loads(result.stdout)["total"]
    assert total["runs"] == 2 and total["charged_gpu_h"] == 2.0  # each counted from its row: 1 GPU × 1 h

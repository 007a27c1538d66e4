"""Syncing 1,000 recorded jobs makes a bounded number of Slurm calls: counted by a shim directory
first on PATH that logs each call and execs the real binary (bench/sync_jobs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import select

from bench.sync_jobs import count_calls, known_job_ids, make_counting_shim, populate
from idmctl.record.db import session
from idmctl.record.models import Job

pytestmark = pytest.mark.slurm


@pytest.mark.cluster_reader
def test_sync_of_1000_jobs_makes_at_most_two_slurm_calls(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          local_slurm: str) -> None:
    real_ids = known_job_ids(50)
    assert real_ids, "the cluster's accounting holds no job yet"
    populate(1000, real_ids)
    log = make_counting_shim(tmp_path / "shim")
    monkeypatch.setenv("PATH", f"{log.parent}:{__import__('os').environ['PATH']}")
    result = cli("sync", "--no-retry", "--json")
    assert result.exit_code == 0, result.stderr
    calls = count_calls(log)
    # One sacct for all 1,000 ids; one squeue for the ids sacct does not know (as when it lags).
    assert calls == {"sacct": 1, "squeue": 1}, calls
    with session() as db:
        jobs = db.exec(select(Job)).all()
    by_id = {job.scheduler_id: job for job in jobs}
    assert len(by_id) == 1000
    updated = [by_id[i] for i in real_ids]
    assert all(job.state != "RUNNING" or job.started_at is not None for job in updated)
    assert sum(job.submitted_at is not None for job in updated) == len(real_ids)
    # A second sync touches only what is still unfinished, again in at most two calls.
    log.write_text("")
    assert cli("sync", "--no-retry").exit_code == 0
    assert sum(count_calls(log).values()) <= 2

"""Slurm outages never corrupt the job record, on the real local cluster.

- slurmdbd really stopped (slurm_support.slurmdbd_stopped: a few seconds, restarted in a finally,
  sacct answering again before the test ends) while a requeued job runs: sync and watch name
  slurmdbd, exit 1 and change no row; after the restart sync records REQUEUED → COMPLETED with the
  restart count and exit code sacct reports.
- slurmctld unreachable: a copy of slurm.conf whose controller port has nothing listening
  (conf_with_unreachable), so the real clients fail as against a stopped slurmctld without stopping
  the controller other engineers' jobs are using.
- sacct lagging behind squeue: a `sacct` shim first on PATH runs the real sacct and drops one job's
  lines, which makes sacct's ~1 s lag behind squeue deterministic. The job becomes UNCONFIRMED, is
  never finalised from squeue, and the next sync with the real sacct confirms it.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from typing import Any

import pytest

from idmctl.core.job_state import is_terminal
from idmctl.record.db import session
from idmctl.record.models import Job
from slurm_support import (conf_with_unreachable, release_requeued, sh, slurmdbd_stopped, squeue_state,
                           text_so_far, wait_until)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_home")]


def _submit(cli, *args: str) -> dict[str, Any]:
    result = cli("submit", "quickstart", "--force", "--reason", "outage test", "--json", "--entry", "tests.jobs_entry",
                 "--mem", "300MB", *args)
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _row(job_id: int) -> dict[str, Any]:
    with session() as db:
        job = db.get(Job, job_id)
        assert job is not None
        return job.model_dump()


def _sync_ok(cli) -> None:
    result = cli("sync", "--no-retry")
    assert result.exit_code == 0, result.output + result.stderr


def _one_line(result) -> str:  # type: ignore[no-untyped-def]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output + result.stderr
    return lines[0]


@pytest.mark.slow
def test_slurmdbd_outage_during_a_requeued_job_changes_no_row_and_sync_confirms_after(cli, monkeypatch) -> None:
    # Long enough (~30 s after the restart) that the requeued run is still RUNNING when the outage starts.
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:120:0.25")
    sub = _submit(cli, "-J", "outage")
    slurm_id, log = sub["scheduler_id"], Path(sub["log"])
    wait_until(lambda: "entry: step 2" in text_so_far(log), 90, f"job {slurm_id} to run 2 steps")
    sh("scontrol", "requeue", slurm_id)

    def released_and_restarted() -> bool:
        release_requeued(slurm_id)
        return "restart 1" in text_so_far(log)

    wait_until(released_and_restarted, 90, f"job {slurm_id} to restart after the requeue")

    def restart_recorded() -> bool:
        _sync_ok(cli)
        row = _row(sub["job"])
        return row["restarts"] == 1 and row["state"] == "RUNNING"

    wait_until(restart_recorded, 60, "sync to record restarts 1 and the second run RUNNING from sacct")
    before = _row(sub["job"])
    assert before["exit_code"] is not None and before["state"] == "RUNNING", before
    with slurmdbd_stopped():
        synced = cli("sync")
        watched = cli("watch", "--count", "1", "--interval", "1")
        during = _row(sub["job"])
    assert synced.exit_code == 1, synced.output
    assert "slurmdbd did not answer `sacct`" in _one_line(synced)
    assert "no job record changed" in _one_line(synced)
    assert watched.exit_code == 1 and "slurmdbd did not answer" in _one_line(watched)
    assert during == before  # not one field moved: restarts, exit code, state, runs

    def confirmed() -> dict[str, Any] | None:
        _sync_ok(cli)
        row = _row(sub["job"])
        return row if is_terminal(row["state"]) else None

    final = wait_until(confirmed, 180, f"sync to record job {slurm_id}'s end from sacct")
    assert final["state"] == "COMPLETED" and final["exit_code"] == "0:0", final
    assert final["restarts"] == 1
    runs = final["runs"]
    assert [r["state"] for r in runs] == ["REQUEUED", "COMPLETED"], runs
    # The queue wait is submit → first start: not the requeue's submit, not the second run's start.
    first = datetime.fromisoformat(runs[0]["started_at"])
    assert final["started_at"].replace(tzinfo=timezone.utc) == first, (final, runs)
    assert final["submitted_at"].replace(tzinfo=timezone.utc) <= first


@pytest.mark.cluster_reader
def test_unreachable_controller_is_named_exit_1_and_no_row_changes(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:2:0.1")
    sub = _submit(cli)
    _sync_ok(cli)
    before = _row(sub["job"])
    monkeypatch.setenv("SLURM_CONF", str(conf_with_unreachable(tmp_path / "ctl", controller=True)))
    synced = cli("sync")
    assert synced.exit_code == 1
    assert "slurmctld did not answer `scontrol ping`: Slurmctld(primary) at vm is DOWN" in _one_line(synced)
    watched = cli("watch", "--count", "1", "--interval", "1")
    assert watched.exit_code == 1 and "slurmctld did not answer" in _one_line(watched)
    assert _row(sub["job"]) == before


@pytest.mark.cluster_reader
def test_both_daemons_unreachable_names_slurmdbd_first_and_changes_nothing(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:2:0.1")
    sub = _submit(cli)
    before = _row(sub["job"])
    monkeypatch.setenv("SLURM_CONF", str(conf_with_unreachable(tmp_path / "both", controller=True, accounting=True)))
    synced = cli("sync", "--json")
    assert synced.exit_code == 1 and synced.stdout == ""
    assert "slurmdbd did not answer `sacct`: sacct: error: Problem talking to the database" in _one_line(synced)
    assert _row(sub["job"]) == before


def _lagging_sacct(directory: Path, hidden_id: str) -> Path:
    """`sacct` first on PATH: the real one, minus the lines of one job (sacct lagging behind squeue)."""
    directory.mkdir(parents=True, exist_ok=True)
    real = shutil.which("sacct")
    shim = directory / "sacct"
    shim.write_text(f'#!/bin/sh\n{real} "$@" | grep -v "^{hidden_id}[|.]"\nexit 0\n')
    shim.chmod(0o755)
    return directory


def test_a_job_squeue_shows_ended_is_unconfirmed_until_sacct_records_it(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.1")
    sub = _submit(cli)
    slurm_id = sub["scheduler_id"]
    wait_until(lambda: squeue_state(slurm_id) == "COMPLETED", 90, f"squeue to show job {slurm_id} COMPLETED")
    real_path = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{_lagging_sacct(tmp_path / 'lag', slurm_id)}:{real_path}")
    result = cli("sync")
    assert result.exit_code == 0, result.output + result.stderr
    assert "1 unconfirmed (squeue says ended; sacct has not recorded it yet)" in result.stdout
    row = _row(sub["job"])
    assert row["state"] == "UNCONFIRMED" and row["reason"].startswith("squeue says COMPLETED"), row
    assert row["exit_code"] is None and row["ended_at"] is None  # nothing taken from squeue about the end
    again = cli("sync", "--json")
    assert json.loads(again.stdout)["unconfirmed"] == [sub["job"]]  # asked again, still not final
    monkeypatch.setenv("PATH", real_path)

    def confirmed() -> dict[str, Any] | None:
        _sync_ok(cli)
        row = _row(sub["job"])
        return row if is_terminal(row["state"]) else None

    final = wait_until(confirmed, 60, f"the real sacct to confirm job {slurm_id}")
    assert final["state"] == "COMPLETED" and final["exit_code"] == "0:0" and final["ended_at"] is not None

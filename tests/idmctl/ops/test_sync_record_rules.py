"""What sync writes from each kind of answer, on the real store with sacct/squeue text
in the 22.05 formats idmctl asks for (tests/idmctl/ops/test_slurm_outage.py drives the same rules on the cluster):
a restart count never goes down, an exit code sacct reported is never cleared, and squeue's word on
an end makes a job UNCONFIRMED, never final."""

from __future__ import annotations

from dataclasses import asdict, replace

from idmctl.core.executor import UNCONFIRMED, JobStatus
from idmctl.core.job_state import JobState, is_terminal
from idmctl.ops.executors.slurm import parse_sacct, parse_squeue
from idmctl.ops.sync import observe
from idmctl.record.records import JobRecord

REQUEUED_THEN_RUNNING = (
    "57|REQUEUED|0:0||2026-11-30T10:00:00|2026-11-30T10:00:01|2026-11-30T10:01:00|n1\n"
    "57.batch|CANCELLED|0:15|||||n1\n"
    "57|RUNNING|0:0||2026-11-30T10:01:05|2026-11-30T10:01:06|Unknown|n2\n"
)
# The same job while slurmdbd still lacks the first run's record (after an outage): one run, no exit yet.
ONE_RUN_NO_EXIT = "57|RUNNING|||2026-11-30T10:01:05|2026-11-30T10:01:06|Unknown|n2\n"
SQUEUE_COMPLETED = "57|COMPLETED|None|2026-11-30T10:01:05|2026-11-30T10:01:06|2026-11-30T10:02:00|n2\n"
SQUEUE_RUNNING = "57|RUNNING|None|2026-11-30T10:01:05|2026-11-30T10:01:06|2026-11-30T11:01:06|n2\n"


def _job() -> JobRecord:
    return JobRecord(id=1, experiment="x", scheduler_id="57", state=JobState.PENDING, state_text="PENDING")


def _apply(job: JobRecord, status: JobStatus) -> JobRecord:
    """The record as sync's ``observed`` leaves it (the store writes the observation as it is)."""
    return replace(job, **asdict(observe(job, status)))


def test_restarts_never_go_down_and_an_exit_code_is_never_cleared() -> None:
    job = _apply(_job(), parse_sacct(REQUEUED_THEN_RUNNING)["57"])
    assert (job.state, job.restarts, job.exit_code) == ("RUNNING", 1, "0:0")
    job = _apply(job, parse_sacct(ONE_RUN_NO_EXIT)["57"])
    assert (job.state, job.restarts, job.exit_code) == ("RUNNING", 1, "0:0")


def test_squeue_never_finalises_and_never_touches_the_record() -> None:
    job = _apply(_job(), parse_sacct(REQUEUED_THEN_RUNNING)["57"])
    recorded = (job.restarts, job.exit_code, job.ended_at, job.runs, job.submitted_at)
    job = _apply(job, parse_squeue(SQUEUE_COMPLETED)["57"])
    assert job.state == UNCONFIRMED and not is_terminal(job.state)
    assert job.reason == "squeue says COMPLETED; waiting for sacct to record how it ended"
    assert (job.restarts, job.exit_code, job.ended_at, job.runs, job.submitted_at) == recorded
    job = _apply(job, parse_squeue(SQUEUE_RUNNING)["57"])
    assert job.state == "RUNNING" and job.restarts == 1 and job.exit_code == "0:0"

"""The executor protocol (submitit style): submit a script, report states, cancel.

States are Slurm's words (:class:`idmctl.core.job_state.JobState`) whichever executor ran the job, so sync, retries and the failure
classifier treat both alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from ground.errors import CheckFailed
from idmctl.core.job_state import JobState

@dataclass
class RunRecord:
    """One run of a job (a requeued job has several): what sacct -D lists per line."""

    state: str
    exit_code: str | None = None
    reason: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    node_list: str | None = None
    steps: list[tuple[str, str, str]] = field(default_factory=list)
    """(step id, state, exit code) of this run's steps."""
    usage: dict[str, str] = field(default_factory=dict)
    """sacct's usage fields of the allocation line (Elapsed, TotalCPU, AllocCPUS, ReqMem, Timelimit...), as printed."""
    step_usage: dict[str, dict[str, str]] = field(default_factory=dict)
    """The same per step id: MaxRSS and NTasks live on the steps."""


@dataclass
class JobStatus:
    """What the scheduler says about one job now; ``runs`` oldest first, the last is current."""

    scheduler_id: str
    state: str
    exit_code: str | None = None
    reason: str | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    node_list: str | None = None
    restarts: int = 0
    runs: list[RunRecord] = field(default_factory=list)
    confirmed: bool = True
    """False when the status comes from a live view (squeue) rather than the record (sacct): it may say a
    job is running, never how it ended, how often it restarted or its exit code."""


UNCONFIRMED = JobState.UNCONFIRMED
"""Stored state of a job that the live view (squeue) shows ended but that sacct has not recorded yet:
not final, so every sync asks again until sacct confirms how it ended."""


class SchedulerUnreachable(CheckFailed):
    """A scheduler daemon did not answer: the caller records nothing (half a picture corrupts the record)."""

    def __init__(self, daemon: str, command: str, detail: str):
        self.daemon = daemon
        self.command = command
        self.detail = detail
        super().__init__(f"{daemon} did not answer `{command}`: {detail}")


class SchedulerRefusal(CheckFailed):
    """The scheduler said no to a script it was asked about (``sbatch --test-only``, ``bash -n``):
    ``words`` are its own, on one line."""

    def __init__(self, command: str, words: str):
        self.command = command
        self.words = words
        super().__init__(f"{command} refused the script: {words}")


def one_line(text: str) -> str:
    """A tool's several stderr lines as one (``; ``-joined), so a refusal stays one line."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


class Executor(Protocol):
    name: str

    def submit(self, script_path: Path, log_path: str) -> str:
        """Start the script; return the scheduler's job id. ``log_path`` may contain ``%j``."""

    def test_only(self, script_path: Path) -> str:
        """Ask the scheduler whether it would accept the script, submitting nothing: its words when it
        would, :class:`SchedulerRefusal` when it would not."""

    def status(self, scheduler_ids: list[str], submitted: dict[str, datetime] | None = None) -> dict[str, JobStatus]:
        """States of many jobs with a bounded number of scheduler calls (ids it does not know are left out);
        ``submitted`` (id → when the store saw it submitted) tells a reused id's older job apart."""

    def cancel(self, scheduler_id: str) -> None:
        """Stop the job."""

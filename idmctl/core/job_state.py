"""A job's state in Slurm's own words: what sacct and squeue print, and what the local executor writes,
so sync, retries, the ledger and the failure classifier treat both executors alike.

A stored state may carry more words (``CANCELLED by 0``) or be idmctl's own (``SUBMITTING``,
``SUBMIT_FAILED``, ``UNCONFIRMED``: members too, so a typed job record holds every stored state):
:meth:`JobState.of` reads the first word and knows only Slurm's; :meth:`JobState.stored` knows idmctl's too.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    RESIZING = "RESIZING"
    REQUEUED = "REQUEUED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"
    # Flags job_state_string prints before the base state (Slurm 20.11-25.11 source, see
    # tests/idmctl/ops/slurm_drift/fixtures/releases): the job is held, signalled or staging, not over.
    STAGE_OUT = "STAGE_OUT"
    EXPEDITING = "EXPEDITING"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUED_CRON = "REQUEUED_CRON"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STOPPED = "STOPPED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    SIGNALING = "SIGNALING"
    # idmctl's own words, never a scheduler's.
    SUBMITTING = "SUBMITTING"
    """The row is written and the script is being handed to the executor (no scheduler id yet)."""
    SUBMIT_FAILED = "SUBMIT_FAILED"
    """The executor (or the resubmission's checks) refused it: it never ran."""
    UNCONFIRMED = "UNCONFIRMED"
    """squeue shows it ended, sacct has not recorded how yet: every sync asks again."""

    @classmethod
    def of(cls, text: str | None) -> JobState | None:
        """The state a stored or printed state names (``CANCELLED by 0`` is CANCELLED); None for a word
        that is not Slurm's (idmctl's own ``SUBMIT_FAILED``, ``UNCONFIRMED``) or no word at all."""
        state = cls._value2member_map_.get(first_word(text))
        return None if state in IDMCTL_OWN else state  # type: ignore[return-value]

    @classmethod
    def stored(cls, text: str | None) -> JobState | None:
        """:meth:`of`, idmctl's own words included: what a stored job's state column holds."""
        return cls._value2member_map_.get(first_word(text))  # type: ignore[return-value]

    @property
    def is_terminal(self) -> bool:
        """The job will not change again (SUBMITTING and UNCONFIRMED will: the executor or sacct has yet to answer)."""
        return self not in UNFINISHED and self not in (JobState.SUBMITTING, JobState.UNCONFIRMED)

    @property
    def is_failed(self) -> bool:
        """It ended without completing."""
        return self.is_terminal and self is not JobState.COMPLETED


IDMCTL_OWN = frozenset({JobState.SUBMITTING, JobState.SUBMIT_FAILED, JobState.UNCONFIRMED})
"""The states idmctl writes itself; no scheduler prints them (:meth:`JobState.of` does not read them)."""
UNFINISHED = frozenset({JobState.PENDING, JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING,
                        JobState.SUSPENDED, JobState.RESIZING, JobState.REQUEUED, JobState.STAGE_OUT,
                        JobState.EXPEDITING, JobState.REQUEUE_FED, JobState.REQUEUE_HOLD, JobState.REQUEUED_CRON,
                        JobState.SPECIAL_EXIT, JobState.STOPPED, JobState.RESV_DEL_HOLD, JobState.SIGNALING})
"""Slurm may still change these: the job waits, starts, runs, or (requeued, held after a requeue, stopped)
comes back. A held job (REQUEUE_HOLD, SPECIAL_EXIT) was classified as failed before these were known."""


def first_word(text: str | None) -> str:
    return (text or "").strip().split(" ")[0].upper()


def is_terminal(text: str | None) -> bool:
    """A stored state that will not change again (``UNCONFIRMED`` is not: sacct has yet to say how it ended)."""
    state = JobState.of(text)
    return state is not None and state.is_terminal


def is_failed(text: str | None) -> bool:
    """A state that gets classified: any word but COMPLETED and the unfinished ones (idmctl's own
    ``SUBMIT_FAILED`` too: the job never ran)."""
    word = first_word(text)
    return bool(word) and word != JobState.COMPLETED and word not in UNFINISHED

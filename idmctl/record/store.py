"""The store's one face: reads that return typed records, and the job's life as named transitions.

Every floor above ``record/`` talks to the store through :class:`JobStore` (``store()`` hands out the
configured one): it never sees a row, a session or a connection. Each transition is one transaction that
checks the state it starts from and refuses a move that state forbids, in the shape of SkyPilot's
``sky/jobs/state.py`` (``UPDATE … WHERE status IN (…)``): a terminal job or chain is never left, and
the times the store knows (``updated_at``, the end claim's, a notice's, a failure's ``classified_at``)
are stamped by the store, not passed in.

A job's life, as the transitions name it::

    open_chain ─▶ submitting ─▶ submitted ─▶ observed* ─▶ ended (claims the end, with its failures)
                        └──────▶ refused (SUBMIT_FAILED; the chain FAILED)
    ended ─▶ decided (close the chain · spend a retry · exclude nodes) ─▶ submitting (the next attempt)

Two implementations stand behind it: ``idmctl.record.sql_store.SqlStore`` (SQLite under ``$IDMCTL_HOME``
or the team's PostgreSQL at ``IDMCTL_DB_URL``; a SQLite store at head is read and written with plain
sqlite3, the submit path's speed) and ``idmctl.record.memory_store.MemoryStore`` (dicts, the same rules:
unit tests that do not test storage use it). ``tests/idmctl/record/test_job_store.py`` runs every
behaviour against both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

# The face's vocabulary, re-exported: callers import the store's words from here.
from idmctl.record.moves import (COMMITTED_STEP, CONTROLLER, FACTS, Decision, ImportedJob, NewJob,  # noqa: F401
                                 Observation, RowRefused, SpecVersionRecord, TransitionRefused, UnknownRecord,
                                 claimant, merged)
from idmctl.record.records import (ChainRecord, ChainStatus, EvalLink, FailureRecord, FixRecord, JobRecord, NewFailure,
                                   NodeExclusionRecord)


class JobStore(Protocol):
    """The store: typed records out, named transitions in."""

    # --- reads -------------------------------------------------------------------------------------------
    def job(self, job_id: int) -> JobRecord | None:
        """The job with this id, or None."""

    def chain(self, chain_id: int) -> ChainRecord | None:
        """The chain with this id, or None."""

    def attempts(self, chain_id: int, before: int | None = None) -> list[JobRecord]:
        """The chain's jobs, oldest attempt first (only attempts numbered below ``before``, when given)."""

    def unfinished(self, chain_id: int | None = None, user: str | None = None) -> list[JobRecord]:
        """Every submitted job whose state may still change (of one chain, of one user, when given): what
        sync asks the scheduler about. UNCONFIRMED is among them; SUBMITTING and SUBMIT_FAILED have no
        scheduler id and are not."""

    def eval_jobs(self, chain_id: int) -> list[JobRecord]:
        """Every evaluation job of training chain ``chain_id``, oldest first."""

    def failures(self, job_ids: Sequence[int]) -> list[FailureRecord]:
        """Every recorded failure of these jobs, in the order they were written."""

    def exclusions(self, reason: str | None = None) -> list[NodeExclusionRecord]:
        """Node exclusions (with exactly this reason, when given), expired ones too."""

    def with_scheduler_id(self, scheduler_id: str) -> list[JobRecord]:
        """The jobs with this scheduler id (a reused id names several), oldest first."""

    def to_classify(self) -> list[JobRecord]:
        """Jobs that can hold a failed run not classified since their record last changed: not completed, or
        requeued at least once, with no failure classified at or after their last change."""

    def failure_table(self, experiment: str | None = None, cause: str | None = None, user: str | None = None,
                      newest: int | None = None) -> tuple[list[tuple[FailureRecord, JobRecord, FixRecord | None]], int]:
        """Every recorded failure with its job and fix (or the ``newest`` N by the job's end, else submit,
        else creation), filtered by the job's experiment and user and the cause; and how many there are."""

    # --- transitions (each one transaction) -----------------------------------------------------------
    def open_chain(self, experiment: str, spec_hash: str, retries: int,
                   spec: SpecVersionRecord | None = None) -> ChainRecord:
        """A new ACTIVE chain with ``retries`` resubmissions to spend (registering ``spec`` first, once)."""

    def withdrawn(self, chain_id: int) -> bool:
        """Remove a chain opened for a submission refused before any attempt of it was recorded (a refusal
        leaves nothing behind); a chain with an attempt stays. True when it was removed."""

    def resumed(self, chain_id: int) -> ChainRecord:
        """A person resumes a chain by hand (``submit --resume``): ACTIVE again, whatever closed it, for the
        attempt that follows; refused while an attempt of it is submitted and unfinished."""

    def submitting(self, job: NewJob) -> JobRecord:
        """A new SUBMITTING job in an ACTIVE chain; refused for a chain that is over."""

    def submitted(self, job_id: int, scheduler_id: str, log_path: str | None, at: datetime) -> JobRecord:
        """SUBMITTING → PENDING with the scheduler's id; refused from any other state."""

    def refused(self, job_id: int, reason: str) -> JobRecord:
        """SUBMITTING → SUBMIT_FAILED (the reason kept, 500 characters), and its chain ACTIVE → FAILED."""

    def observed(self, job_id: int, seen: Observation) -> JobRecord:
        """A submitted job's new scheduler status; refused for a terminal job, and for a terminal state
        (an end goes through :meth:`ended`, which claims it)."""

    def claim_end(self, job_id: int) -> bool:
        """Claim the right to record and decide the job's end: True for the first caller, False after."""

    def ended(self, job_id: int, seen: Observation, failures: Sequence[NewFailure] = (),
              facts: Mapping[str, object] | None = None) -> JobRecord | None:
        """The job's end in one transaction: its end claimed (None when another sync holds it: nothing
        written), its final status, ``facts`` (``efficiency``, ``committed_step``) and its failures (one
        per run; a run already recorded is reclassified in place). Refused for a job already terminal."""

    def record_failure(self, job_id: int, failure: NewFailure) -> FailureRecord:
        """A failure seen while the job still runs (a hang), before its end is recorded."""

    def classified(self, job_id: int, failures: Sequence[NewFailure]) -> list[FailureRecord]:
        """A job's failed runs (re)classified in one transaction: a run already recorded is replaced in
        place (its fix kept), a new one added; ``classified_at`` stamped now."""

    def fixed(self, job_ids: Sequence[int], note: str, commit: str | None) -> FixRecord:
        """One fix attached to every recorded failure of these jobs."""

    def decided(self, chain_id: int, decision: Decision) -> ChainRecord:
        """What the policy decided after an attempt ended: close the chain, spend a retry, exclude nodes.
        Refused for a chain that is over (a closed chain never reopens or spends)."""

    def exclude_nodes(self, exclusions: Sequence[NodeExclusionRecord]) -> None:
        """Leave these nodes out of later submissions (a requeued job's failed node, while it runs on)."""

    def cancelling(self, job_id: int) -> tuple[JobRecord, ChainRecord | None]:
        """A person cancels a submitted, unfinished job: its chain ACTIVE → CANCELLED first, so no sync between
        this mark and the scheduler's cancel retries it. Returns the job and its chain as it was before (None
        when it has none). Refused for an unsubmitted or ended job; :class:`RowRefused` where the team store's
        row-level security keeps the chain its owner's (nothing written)."""

    def cancel_refused(self, chain_id: int, previous: ChainStatus) -> ChainRecord | None:
        """The scheduler refused the cancel :meth:`cancelling` announced: the chain goes back from CANCELLED
        to ``previous`` (the one move out of a terminal status: undoing a mark no scheduler acted on). A chain
        no longer CANCELLED is left as it is. Returns the chain (None when unknown)."""

    def note(self, job_id: int, key: str, value: object) -> JobRecord:
        """Record a fact (:data:`FACTS`) on the job; a dict merges into what is there."""

    def relinked(self, job_id: int, link: EvalLink) -> JobRecord:
        """An eval job's link replaced: it now waits on another attempt (``after``), or another eval job
        stands in for it (``moved_to``); refused for a job that is not an eval job, or a link to another chain."""

    def note_chain_run(self, chain_id: int, mlflow_run_id: str) -> ChainRecord:
        """The chain's MLflow run, kept once (a run already noted stays)."""

    def imported(self, jobs: Sequence[ImportedJob],
                 classify: Callable[[JobRecord], Sequence[NewFailure]]) -> list[tuple[JobRecord, list[FailureRecord]]]:
        """Jobs pulled from sacct, in one transaction: one whose scheduler id the store already holds is
        left out, each new one stored with the failures ``classify`` finds in its record. Returns the new
        records with their failures, in order."""

    def claim_notice(self, job_id: int, event: str) -> bool:
        """True for the first claim of ``event`` on the job (its message is sent once), False after."""


def store() -> JobStore:
    """The configured store: the team's PostgreSQL (``IDMCTL_DB_URL``) or SQLite under ``$IDMCTL_HOME``."""
    from idmctl.record.sql_store import SqlStore  # start-up: its SQL driver loads only when a store is used

    return SqlStore()

"""What the store's transitions take (a new job, an observation, a decision), their refusals, and the
small rules both stores share; :mod:`idmctl.record.store` is the face that names the transitions."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ground.errors import CheckFailed
from idmctl.core.job_state import JobState
from idmctl.record.records import (ChainStatus, EndClaim, EvalLink, FailureRecord, JobRecord, JsonObject,
                                   NodeExclusionRecord)

COMMITTED_STEP = "committed_step"
CONTROLLER = "controller"
FACTS = (COMMITTED_STEP, CONTROLLER)
"""The facts :meth:`JobStore.note` records on a job after it was submitted (a dict merges into what is there)."""


def merged(old: object, value: object) -> object:
    """``value`` merged into ``old`` when both are objects (a controller's last run joins its id), else ``value``."""
    return {**old, **value} if isinstance(old, Mapping) and isinstance(value, Mapping) else value


def claimant() -> EndClaim:
    """This process as the claimant of a job's end (``host:pid``), stamped now."""
    return EndClaim(by=f"{socket.gethostname()}:{os.getpid()}",
                    at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


class TransitionRefused(CheckFailed):
    """A transition its starting state forbids (a terminal job or chain is never left); nothing was written."""


class RowRefused(TransitionRefused):
    """A write the store matched to no row: in a team's store with one role per member, row-level security
    keeps a colleague's job and chain rows theirs (runbook: One role per member); else the row went meanwhile."""


class UnknownRecord(CheckFailed):
    """A transition named a job or chain the store does not hold; nothing was written."""


@dataclass(frozen=True)
class SpecVersionRecord:
    """One exact resolved spec, registered (idempotently) when a chain is opened for it."""

    hash: str
    """Its canonical content hash."""
    experiment: str
    """The spec's name."""
    source_path: str
    """The YAML it was resolved from."""
    resolved_json: str
    """The canonical JSON of the resolved spec."""


@dataclass(frozen=True)
class NewJob:
    """What ``submitting`` writes: the attempt as it is handed to the executor."""

    chain_id: int
    """Its chain (open, ACTIVE)."""
    attempt: int
    """1 for a chain's first submission, +1 per resubmission."""
    experiment: str
    """The spec's name."""
    executor: str
    """``slurm`` or ``local``."""
    spec_hash: str | None = None
    """The resolved spec's hash."""
    code_version: str | None = None
    """The code version the gate passed."""
    preflight_id: int | None = None
    """The preflight run that unlocked it."""
    qos: str | None = None
    """The QoS it asks for."""
    gpus: int | None = None
    """GPUs in all."""
    routing_n: int | None = None
    """The spec's ``data.routing_n``."""
    script_path: str | None = None
    """Its job script (None: an attempt refused before a script was written)."""
    options: JsonObject = field(default_factory=dict)
    """The request (``JobOptions`` fields plus ``rollback``)."""
    admitted: JsonObject | None = None
    """Its admission and the effective job."""
    code: JsonObject | None = None
    """The code snapshot it runs."""
    eval_link: EvalLink | None = None
    """The training chain an eval job scores."""
    forced_reason: str | None = None
    """Who forced it past a failed check, and why."""


@dataclass(frozen=True)
class Observation:
    """What the scheduler says of a job now, as the job's columns (sync merges the status into the record
    it read: the merge rules are sync's, the store writes what it is given)."""

    state: JobState
    """Its new state."""
    state_text: str
    """The state's words as the scheduler printed them (``CANCELLED by 0``)."""
    reason: str | None = None
    exit_code: str | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    node_list: str | None = None
    restarts: int = 0
    runs: tuple[JsonObject, ...] = ()
    """Each Slurm run (sacct -D), oldest first."""
    log_tail: str | None = None
    """The log's last lines."""


@dataclass(frozen=True)
class Decision:
    """What ``decided`` writes after an attempt ended and the policy spoke."""

    close: ChainStatus | None = None
    """End the chain so (COMPLETED, FAILED); None: it goes on (a retry)."""
    spend_retry: bool = False
    """One of the chain's retries is spent on the resubmission."""
    exclude: Sequence[NodeExclusionRecord] = ()
    """Nodes left out of later submissions."""


@dataclass(frozen=True)
class ImportedJob:
    """A job ``jobs import`` pulled from sacct (idmctl did not submit it)."""

    scheduler_id: str
    """Slurm's job id."""
    experiment: str
    """Its job name (the experiment, when it is one of ours)."""
    state_text: str
    """Its state as sacct printed it."""
    reason: str | None = None
    exit_code: str | None = None
    derived_exit_code: str | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    node_list: str | None = None
    restarts: int = 0
    qos: str | None = None
    gpus: int | None = None
    log_path: str | None = None
    """Slurm's default output file, when it is still there."""
    log_tail: str | None = None
    user: str | None = None
    """Who submitted it (the row's ``user``; None: whoever imports it)."""


def ended_or_known(job: JobRecord) -> datetime:
    """When a job counts as having happened: its end, else its submission, else its row's creation."""
    return job.ended_at or job.submitted_at or job.created_at or datetime.min.replace(tzinfo=timezone.utc)


def newest_first(pairs: list[tuple[FailureRecord, JobRecord]], newest: int) -> list[tuple[FailureRecord, JobRecord]]:
    """The ``newest`` failures by their job's :func:`ended_or_known` (then the job's id), newest first."""
    return sorted(pairs, key=lambda pair: (ended_or_known(pair[1]), pair[1].id), reverse=True)[:newest]

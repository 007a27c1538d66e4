"""What the store hands out: a job, a chain and a classified failure as frozen, typed records.

Every other floor reads these (never an ORM row, a ``sqlite3.Row`` or a session): ``idmctl.record.store``'s
:class:`~idmctl.record.store.JobStore` returns them from its reads and its transitions. Plain dataclasses
with no SQL library behind them, so the CLI imports them at no start-up cost.

A JSON column's value keeps its stored shape (``Mapping``/``tuple`` of plain values, documented per field)
where its shape is owned by a floor above this one (an efficiency report is ``plan.efficiency``'s), and is
a typed sub-record where the store owns it (the eval link, the controller facts, the end claim, the
committed step). Times are UTC-aware ``datetime``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from idmctl.core.job_state import JobState

JsonObject = Mapping[str, object]
"""One stored JSON object, read-only by convention (records are frozen; a transition writes a new value)."""


class ChainStatus(StrEnum):
    """Where a chain (every attempt of one logical run) stands; stored as its name."""

    ACTIVE = "ACTIVE"
    """Attempts may still run or be resubmitted."""
    COMPLETED = "COMPLETED"
    """Its last attempt completed."""
    FAILED = "FAILED"
    """It stopped: a cause the policy does not retry, no retries left, or a refused (re)submission."""
    CANCELLED = "CANCELLED"
    """A person cancelled it (``idmctl cancel``): not retried."""

    def is_terminal(self) -> bool:
        """The chain is over: no attempt of it is resubmitted again (the store never reopens one)."""
        return self is not ChainStatus.ACTIVE


@dataclass(frozen=True)
class EvalLink:
    """An evaluation job's link to the training chain it scores (the job's ``eval_*`` columns)."""

    of_chain: int
    """The training chain's id."""
    step: int | None = None
    """The checkpoint step it evaluates."""
    after: str | None = None
    """The training job's scheduler id it waits on (afterok)."""
    choice: str | None = None
    """The ``--eval`` value it was submitted with (``last``, ``each`` or a step)."""
    replaces: int | None = None
    """The eval job it stands in for (Slurm killed that one when its attempt did not end OK)."""
    moved_to: int | None = None
    """The eval job that stands in for this one."""

    def as_dict(self) -> dict[str, object]:
        """As ``stored_json.eval_link`` has always shown it: ``replaces``/``moved_to`` only when set."""
        found: dict[str, object] = {"of_chain": self.of_chain, "step": self.step, "after": self.after,
                                    "choice": self.choice}
        for name in ("replaces", "moved_to"):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        return found


@dataclass(frozen=True)
class EndClaim:
    """Which sync claimed a job's end: it alone classified, recorded and decided it."""

    by: str
    """``host:pid`` of that sync."""
    at: str
    """When, ISO 8601 UTC to the second (stamped by the store)."""


@dataclass(frozen=True)
class JobRecord:
    """One scheduler job (one sbatch, or one local subprocess) as stored. Requeues of it are counted in
    ``restarts``, its runs listed in ``runs``."""

    id: int
    """The store's id (``#12``)."""
    experiment: str
    """The spec's name."""
    state: JobState
    """Its state: Slurm's word, or idmctl's own (SUBMITTING, SUBMIT_FAILED, UNCONFIRMED)."""
    state_text: str
    """The state as stored, all its words (``CANCELLED by 0``): what the tables print."""
    chain_id: int | None = None
    """Its chain (None: a job ``jobs import`` pulled from sacct)."""
    attempt: int = 1
    """1 for a chain's first submission, +1 per resubmission."""
    spec_hash: str | None = None
    """The resolved spec's canonical hash it was submitted with."""
    code_version: str | None = None
    """The code version the gate passed (the snapshot's digest)."""
    preflight_id: int | None = None
    """The preflight run that unlocked it."""
    executor: str = "slurm"
    """``slurm`` or ``local``."""
    scheduler_id: str | None = None
    """Slurm's job id, or the local executor's; None until submitted."""
    reason: str | None = None
    """The scheduler's reason, or idmctl's (a refusal's verdict, UNCONFIRMED's wait)."""
    exit_code: str | None = None
    """``code:signal`` as sacct prints it."""
    submitted_at: datetime | None = None
    """When the scheduler says it was submitted (its clock)."""
    started_at: datetime | None = None
    """When its first run reached a node."""
    ended_at: datetime | None = None
    """When its last run ended (the scheduler's End)."""
    node_list: str | None = None
    """Nodes of its latest run."""
    restarts: int = 0
    """Requeues Slurm did (runs − 1); only grows."""
    qos: str | None = None
    """The QoS it asked for."""
    gpus: int | None = None
    """GPUs in all (per node × nodes)."""
    routing_n: int | None = None
    """The spec's ``data.routing_n`` (the ledger groups by it)."""
    script_path: str | None = None
    """Its job script; the run directory is the script's folder."""
    log_path: str | None = None
    """Its log, ``%j`` filled in."""
    log_tail: str | None = None
    """The log's last lines as sync last read them."""
    options: JsonObject = field(default_factory=dict)
    """The submission request: every field of ``core.job_options.JobOptions`` plus ``rollback``."""
    admitted: JsonObject | None = None
    """Submit's admission and the effective job (``{"admission": {...}, "flags", "cluster", ...}``)."""
    code: JsonObject | None = None
    """The code snapshot it runs (``job.code.JobCode.as_dict``); None: the live tree."""
    runs: tuple[JsonObject, ...] = ()
    """Each Slurm run as sync recorded it from sacct -D (state, exit_code, reason, started_at, ended_at as
    ISO text, node_list, steps, usage, step_usage), oldest first."""
    efficiency: JsonObject | None = None
    """``plan.efficiency.EfficiencyReport.as_dict`` of its last run, once it ended."""
    derived_exit_code: str | None = None
    """sacct's DerivedExitCode (imported jobs)."""
    committed_step: JsonObject | None = None
    """``{"step", "source", "last_step"}``: the run directory's newest checkpoint when the attempt ended."""
    controller: JsonObject | None = None
    """``{"scheduler_id", "submitted_at", "after", "last_run"}`` of the controller job that follows it."""
    end_claim: EndClaim | None = None
    """The sync that claimed its end (None: not ended, or ended before claims existed)."""
    notified: Mapping[str, str] = field(default_factory=dict)
    """Event name → when its notification was claimed."""
    eval_link: EvalLink | None = None
    """The training chain an evaluation job scores; None for every other job."""
    forced_reason: str | None = None
    """Who forced it past a failed check, and why."""
    imported: bool = False
    """Pulled from sacct by ``jobs import``."""
    user: str | None = None
    """Who wrote the row (the team's store: everyone's rows meet)."""
    host: str | None = None
    """From which host."""
    created_at: datetime | None = None
    """When the row was written."""
    updated_at: datetime | None = None
    """When a transition last changed it (stamped by the store)."""

    @property
    def is_terminal(self) -> bool:
        """It will not change again: the store refuses to move it."""
        return self.state.is_terminal

    def options_json(self) -> str:
        """The request as the ``options_json`` column holds it."""
        return json.dumps(dict(self.options))


@dataclass(frozen=True)
class ChainRecord:
    """Every attempt of one logical run (requeues and resubmissions) shares one chain and one MLflow run."""

    id: int
    """The store's id."""
    experiment: str
    """The spec's name."""
    spec_hash: str
    """The resolved spec's hash the chain started with."""
    status: ChainStatus
    """Where it stands."""
    retries_budget: int = 0
    """Resubmissions it may spend (``--retries``)."""
    retries_used: int = 0
    """Resubmissions it spent."""
    mlflow_run_id: str | None = None
    """Its MLflow run (the trainer writes it into the run directory; sync keeps it here)."""
    user: str | None = None
    """Who wrote the row."""
    host: str | None = None
    """From which host."""
    created_at: datetime | None = None
    """When it was opened."""

    @property
    def retries_left(self) -> int:
        """What the budget still allows (never below 0)."""
        return max(0, self.retries_budget - self.retries_used)


@dataclass(frozen=True)
class FailureRecord:
    """The classified cause of one run of a job that did not complete, with its evidence."""

    id: int
    """The store's id."""
    job_id: int
    """The job it belongs to."""
    cause: str
    """A cause of ``ops/failures/taxonomy.yaml``."""
    evidence: str = ""
    """The lines that prove it, one a line."""
    detail: JsonObject = field(default_factory=dict)
    """The classifier's detail: ``run`` (1-based), ``final`` (the job's last run), and the cause's figures."""
    fix_id: int | None = None
    """The fix recorded for it."""
    classified_at: datetime | None = None
    """When it was (re)classified (stamped by the store)."""
    user: str | None = None
    """Who wrote the row."""

    @property
    def run(self) -> int:
        """Which run of the job it classifies (1 when the detail does not say)."""
        value = self.detail.get("run", 1)
        return value if isinstance(value, int) else int(str(value))

    @property
    def final(self) -> bool:
        """It classifies the run the job ended with (the one its retry decision reads)."""
        return bool(self.detail.get("final"))


@dataclass(frozen=True)
class FixRecord:
    """A recorded fix; one fix may cover the failures of several jobs (6054/6108/6158 share one)."""

    id: int
    """The store's id."""
    note: str
    """What was changed."""
    commit: str | None = None
    """The commit that fixed it."""
    created_at: datetime | None = None
    """When it was recorded (stamped by the store)."""


@dataclass(frozen=True)
class NewFailure:
    """A failure to record (``ended`` with its failures, or a hang seen while the job runs)."""

    cause: str
    """A cause of the taxonomy."""
    evidence: str
    """The lines that prove it."""
    detail: JsonObject
    """Its detail, ``run`` and ``final`` included."""


@dataclass(frozen=True)
class NodeExclusionRecord:
    """A node left out of later submissions until ``until``."""

    node: str
    """The node's name."""
    until: datetime
    """When the exclusion expires."""
    reason: str = ""
    """Why (``node_fail under job 6054``)."""

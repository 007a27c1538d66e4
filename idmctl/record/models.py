"""Tables. Every change here needs an Alembic migration in ``migrations/versions``: users' job
history must survive upgrades (``tests/idmctl/record/test_store.py`` checks the models and migrations agree)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlmodel import Field, SQLModel

from ground.errors import UserError
from idmctl.core.job_state import JobState
from idmctl.record.records import ChainStatus
from idmctl.record.url import writer


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _user() -> str:
    return writer()[0]


def _host() -> str:
    return writer()[1]


class StoredJSON(sa.types.TypeDecorator):
    """JSON whose Python None is SQL NULL (a claim's ``IS NULL`` test and the fast path's reads see "never
    recorded", not the JSON text ``null``), and whose damaged text is one line, not a traceback: SQLite
    stores any text a hand edit or a bad restore leaves, and SQLAlchemy's JSON read raised JSONDecodeError
    out of ``idmctl failures`` and ``ledger``. The row is not known while a value is decoded, so the line
    names the column and how to find the row."""

    impl = sa.JSON
    cache_ok = True

    def __init__(self, column: str) -> None:
        super().__init__(none_as_null=True)
        self.column = column

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[object], object] | None:
        decode = super().result_processor(dialect, coltype)
        if decode is None:  # the driver decodes (PostgreSQL's json type refuses damaged text on write)
            return None
        column = self.column

        def checked(value: object) -> object:
            if isinstance(value, (int, float)):  # a bare JSON number: SQLite's NUMERIC affinity stored it as one
                return value
            try:
                return decode(value)
            except (ValueError, RecursionError):
                raise UserError(f"a job's stored record is damaged ({column} is not JSON)", field="store",
                                hint=f"find it with SELECT id FROM job WHERE json_valid({column}) = 0; restore "
                                     "the store from a backup, or delete that job's row") from None
        return checked


def _json_column(column: str) -> Any:
    return sa.Column(column, StoredJSON(column), nullable=True)


class Written(SQLModel):
    """Who wrote the row, from where: in the team's shared store (IDMCTL_DB_URL) everyone's rows meet,
    and ``--user`` filters on this. NULL on rows written before migration 0002."""

    user: str | None = Field(default_factory=_user, index=True)
    host: str | None = Field(default_factory=_host)


class SpecVersion(Written, table=True):
    """One exact resolved spec, named by its canonical content hash."""

    __tablename__ = "spec_version"
    hash: str = Field(primary_key=True)
    experiment: str = Field(index=True)
    source_path: str
    resolved_json: str
    registered_at: datetime = Field(default_factory=utcnow)


class PreflightRun(Written, table=True):
    """One preflight of (spec hash, code version, cluster profile hash)."""

    __tablename__ = "preflight_run"
    id: int | None = Field(default=None, primary_key=True)
    experiment: str = Field(index=True)
    spec_hash: str = Field(index=True)
    code_version: str
    profile_hash: str
    profile_name: str
    with_smoke: bool
    passed: bool
    """No check FAILed (and the smoke ran: a static-only preflight cannot unlock submit)."""
    started_at: datetime = Field(default_factory=utcnow)
    seconds: float = 0.0
    result_json: str = "{}"


class PreflightCheck(SQLModel, table=True):
    __tablename__ = "preflight_check"
    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="preflight_run.id", index=True)
    name: str
    status: str
    """PASS, WARN or FAIL."""
    summary: str
    numbers_json: str = "{}"
    fix: str = ""


class Chain(Written, table=True):
    """All attempts of one logical run (requeues and resubmissions) share one chain and one MLflow run."""

    __tablename__ = "chain"
    id: int | None = Field(default=None, primary_key=True)
    experiment: str = Field(index=True)
    spec_hash: str
    mlflow_run_id: str | None = None
    retries_budget: int = 0
    retries_used: int = 0
    status: str = ChainStatus.ACTIVE.value
    created_at: datetime = Field(default_factory=utcnow)


class Job(Written, table=True):
    """One scheduler job (one sbatch / one local subprocess). Requeues of it are counted in ``restarts``."""

    __tablename__ = "job"
    id: int | None = Field(default=None, primary_key=True)
    chain_id: int | None = Field(default=None, foreign_key="chain.id", index=True)
    attempt: int = 1
    experiment: str = Field(index=True)
    spec_hash: str | None = None
    code_version: str | None = None
    preflight_id: int | None = None
    executor: str = "slurm"
    scheduler_id: str | None = Field(default=None, index=True)
    """Slurm job id, or the local executor's pid-based id."""
    state: str = Field(default=JobState.PENDING.value, index=True)
    reason: str | None = None
    exit_code: str | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    node_list: str | None = None
    restarts: int = 0
    qos: str | None = None
    gpus: int | None = None
    routing_n: int | None = None
    script_path: str | None = None
    log_path: str | None = None
    log_tail: str | None = None
    options_json: str = "{}"
    """The submission request only: every field of ``core.job_options.JobOptions`` after flags overrode
    the spec's defaults, plus ``rollback`` (a resubmission that starts from the previous checkpoint)."""
    admitted: dict[str, Any] | None = Field(default=None, sa_column=_json_column("admitted"))
    """Submit's admission and the effective job's record: ``{"admission": {"failed": [...], ...}, "flags",
    "smoke_flags", "spec_hash", "effective_spec_hash", "changed", "exclusions", "cluster", ...}``."""
    code: dict[str, Any] | None = Field(default=None, sa_column=_json_column("code"))
    """The code snapshot the job runs (``job.code.JobCode.as_dict``); None: it ran the live tree."""
    runs: list[dict[str, Any]] | None = Field(default=None, sa_column=_json_column("runs"))
    """Sync's view of every Slurm run of the job (sacct -D): state, exit code, reason, times, nodes, steps
    and sacct's usage."""
    efficiency: dict[str, Any] | None = Field(default=None, sa_column=_json_column("efficiency"))
    """``plan.efficiency.EfficiencyReport.as_dict`` of the job's last run, written by the sync that saw it end."""
    derived_exit_code: str | None = None
    """sacct's DerivedExitCode, for jobs ``jobs import`` pulled from sacct (idmctl did not submit them)."""
    committed_step: dict[str, Any] | None = Field(default=None, sa_column=_json_column("committed_step"))
    """``{"step": N | None, "source", "last_step"}``: the newest checkpoint the chain's run directory held
    when the attempt ended (the crash-loop rule compares consecutive attempts)."""
    controller: dict[str, Any] | None = Field(default=None, sa_column=_json_column("controller"))
    """``{"scheduler_id", "submitted_at", "after"}``: the controller job that follows the attempt
    (``idmctl.ops.controller``), and after its run ``last_run``: ``{"at", "result", "ok", "scheduler_id"}``."""
    end_recorded: dict[str, Any] | None = Field(default=None, sa_column=_json_column("end_recorded"))
    """``{"by": "host:pid", "at"}``: the sync that claimed the job's end; it alone classified, recorded and
    decided it (``idmctl.record.claims``: a compare-and-set on this column being NULL)."""
    notified: dict[str, Any] | None = Field(default=None, sa_column=_json_column("notified"))
    """Event name → when its notification was claimed (``JobStore.claim_notice``): one message per event."""
    eval_of_chain: int | None = Field(default=None, index=True)
    """An evaluation job's training chain (None for every other job)."""
    eval_step: int | None = None
    """The checkpoint step the eval job evaluates."""
    eval_after: str | None = None
    """The training job's scheduler id the eval job waits on (afterok)."""
    eval_choice: str | None = None
    """The ``--eval`` value it was submitted with (``last``, ``each`` or a step)."""
    eval_replaces: int | None = None
    """The eval job this one stands in for (Slurm killed that one when its attempt did not end OK)."""
    eval_moved_to: int | None = None
    """The eval job that stands in for this one."""
    forced_reason: str | None = None
    """Set when submitted with --force: who and why."""
    imported: bool = False
    """Pulled from sacct by ``jobs import`` (not submitted by idmctl)."""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Failure(Written, table=True):
    """The classified cause of a job that did not complete, with its evidence."""

    __tablename__ = "failure"
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    cause: str = Field(index=True)
    evidence: str = ""
    detail_json: str = "{}"
    fix_id: int | None = Field(default=None, foreign_key="fix.id")
    classified_at: datetime = Field(default_factory=utcnow, index=True)


class Fix(Written, table=True):
    """A recorded fix; one fix may cover several failures (6054/6108/6158 share one)."""

    __tablename__ = "fix"
    id: int | None = Field(default=None, primary_key=True)
    note: str
    commit: str | None = None
    created_at: datetime = Field(default_factory=utcnow)


class NodeExclusion(Written, table=True):
    """A node that caused a hardware failure, avoided by later submissions until ``until``."""

    __tablename__ = "node_exclusion"
    id: int | None = Field(default=None, primary_key=True)
    node: str = Field(index=True)
    until: datetime
    reason: str = ""

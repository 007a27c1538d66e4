"""Jobs and chains in the store: the queries the listing, the ETAs, the queue check, the code snapshots'
collector and ``cancel`` read, and the rows submit, resubmission and sync write and read. Each reads
with plain sqlite3 (``idmctl.record.fast``) where the CLI's start-up time needs it and the store is at
head, else through the ORM (which migrates an older store, and is the only path to the team's
PostgreSQL store)."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.errors import CheckFailed, UserError
from idmctl.core.job_state import JobState, is_terminal
from idmctl.record.fast import connect, db_time, from_db_time, insert, rows

if TYPE_CHECKING:
    from idmctl.record.models import Job

JOB_COLUMNS = ("id", "chain_id", "attempt", "experiment", "executor", "scheduler_id", "state", "reason", "exit_code",
               "restarts", "qos", "node_list", "submitted_at", "started_at", "ended_at", "forced_reason",
               "options_json", "controller", "eval_of_chain", "eval_step", "eval_after", "eval_choice",
               "eval_replaces", "eval_moved_to", "script_path", "user", "host")
"""What ``idmctl jobs`` shows of a job (its ETA reads ``script_path`` and the stored options)."""
CHAIN_COLUMNS = ("id", "mlflow_run_id", "retries_budget", "retries_used")
_DATES = ("submitted_at", "started_at", "ended_at")


def read_jobs_fast(db: Path, limit: int, user: str | None = None) -> tuple[list[Any], dict[int, Any]] | None:
    """The newest ``limit`` jobs (of ``user`` only, when given) and their chains, as attribute rows like
    the ORM's, read with sqlite3; None where only the ORM can read the store."""
    try:
        with connect(db) as fast:
            if fast is None:
                return None
            mine = ' WHERE "user" = ?' if user else ""
            columns = ", ".join(f'"{name}"' for name in JOB_COLUMNS)
            jobs = rows(fast, f"SELECT {columns} FROM job{mine} ORDER BY id DESC LIMIT ?",
                        (user, limit) if user else (limit,))
            chain_ids = sorted({job.chain_id for job in jobs if job.chain_id is not None})
            chains = rows(fast, f"SELECT {', '.join(CHAIN_COLUMNS)} FROM chain WHERE id IN "
                                f"({', '.join('?' * len(chain_ids))})", tuple(chain_ids)) if chain_ids else []
    except sqlite3.Error:
        return None
    for job in jobs:  # the ORM hands datetimes back UTC-aware
        for name in _DATES:
            setattr(job, name, from_db_time(getattr(job, name)))
    return jobs, {chain.id: chain for chain in chains}


def newest_jobs(db: Path, limit: int, user: str | None = None) -> tuple[list[Any], dict[int, Any]]:
    """The newest ``limit`` jobs (of ``user`` only, when given), newest first, and their chains by id."""
    fast = read_jobs_fast(db, limit, user)
    if fast is not None:
        return fast
    from sqlmodel import select  # start-up: SQLAlchemy only for a store not at head or the shared one

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above
    from idmctl.record.models import Chain, Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        query = select(Job) if user is None else select(Job).where(Job.user == user)
        jobs = orm.exec(query.order_by(Job.id.desc()).limit(limit)).all()  # type: ignore[union-attr]
        chain_ids = {j.chain_id for j in jobs if j.chain_id is not None}
        chains = {c.id: c for c in orm.exec(select(Chain).where(Chain.id.in_(chain_ids)))}  # type: ignore[union-attr]
    return list(jobs), chains


def job_by_id(job_id: int) -> Any:
    """The job row with this store id, or None. Read with sqlite3 when the store is at head (its datetimes
    then stay text, as ``jobs show`` prints them), else through the ORM (no store yet, or one to migrate)."""
    with connect() as fast:
        if fast is not None:
            found = rows(fast, "SELECT * FROM job WHERE id = ?", (job_id,))
            return found[0] if found else None
    from idmctl.record.db import session  # start-up: SQLAlchemy only for a store not at head or the shared one
    from idmctl.record.models import Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        return orm.get(Job, job_id)


def running_jobs() -> tuple[list[Any], dict[int, Any]]:
    """The jobs recorded RUNNING and their chains by id."""
    from sqlmodel import select  # start-up: SQLAlchemy; only `watch` asks, after a sync loaded it anyway

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above
    from idmctl.record.models import Chain, Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        running = orm.exec(select(Job).where(Job.state == JobState.RUNNING.value)).all()
        chains = {c.id: c for c in orm.exec(select(Chain).where(Chain.id.in_({j.chain_id for j in running})))}  # type: ignore[union-attr]
    return list(running), chains


def submitted_with_gpus(gpus: int) -> list[Any]:
    """Every submitted job with this GPU count (all QoS tiers), datetimes UTC-aware: the queue history."""
    with connect() as fast:
        if fast is not None:  # plain sqlite3: submit re-runs the queue check without importing the ORM
            found = rows(fast, "SELECT id, scheduler_id, qos, state, submitted_at, started_at, ended_at FROM job "
                               "WHERE gpus = ? AND submitted_at IS NOT NULL", (gpus,))
            for row in found:
                row.submitted_at, row.started_at, row.ended_at = (from_db_time(row.submitted_at),
                                                                  from_db_time(row.started_at), from_db_time(row.ended_at))
            return found
    from sqlmodel import select  # start-up: SQLAlchemy only for a store not at head or the shared one

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above
    from idmctl.record.models import Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        return list(orm.exec(select(Job).where(Job.gpus == gpus, Job.submitted_at != None)).all())  # noqa: E711


def unfinished_job_codes() -> list[dict[str, Any]]:
    """The code snapshot records (``Job.code``) of every job not ended and of every job of an ACTIVE chain
    (what a resubmission may still run from): the code snapshots' collector keeps what these name."""
    from sqlmodel import select  # start-up: SQLAlchemy; only `gc` asks

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above
    from idmctl.record.models import Chain, Job  # start-up: SQLAlchemy, as above

    found = []
    with session() as orm:
        active = {c.id for c in orm.exec(select(Chain).where(Chain.status == "ACTIVE")).all()}
        for job in orm.exec(select(Job)).all():
            if is_terminal(job.state) and job.chain_id not in active:
                continue
            if job.code is not None:
                found.append(job.code)
    return found


def unfinished_job_rows() -> list[str]:
    """Every column of every job not ended and of every job of an ACTIVE chain, each row as one text
    (JSON of its raw values, a damaged column's text as it is): the code store's collector keeps every
    snapshot any field of these names, the fields known today and any added later."""
    import json

    import sqlalchemy as sa  # start-up: SQLAlchemy; only `gc` asks

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above

    found = []
    with session() as orm:
        connection = orm.connection()
        active = {row[0] for row in connection.execute(sa.text("SELECT id FROM chain WHERE status = 'ACTIVE'"))}
        for row in connection.execute(sa.text("SELECT * FROM job")).mappings():
            if is_terminal(row["state"]) and row["chain_id"] not in active:
                continue
            found.append(json.dumps(dict(row), default=str, ensure_ascii=False))
    return found


def stop_chain_of(job_id: int) -> "Job":
    """Mark the chain of a submitted, unfinished job CANCELLED (so it is not retried) and return the job;
    UserError for an unknown or never-submitted job, CheckFailed for one already ended."""
    from idmctl.record.db import session  # start-up: SQLAlchemy; only `cancel` asks
    from idmctl.record.models import Chain, Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        row = orm.get(Job, job_id)
        if row is None or row.scheduler_id is None:
            raise UserError(f"no submitted job {job_id}", field="JOB", hint="see `idmctl jobs`")
        if is_terminal(row.state):
            raise CheckFailed(f"job {job_id} already ended {row.state}")
        chain = orm.get(Chain, row.chain_id) if row.chain_id else None
        if chain is not None:
            chain.status = "CANCELLED"
            orm.add(chain)
    return row


def unfinished_jobs(chain_id: int | None = None, user: str | None = None) -> list["Job"]:
    """Every submitted job not in a final state (of chain ``chain_id`` only, when given; submitted by
    ``user`` only, when given): what sync asks the scheduler about."""
    from sqlmodel import select  # start-up: SQLAlchemy; only sync and watch ask, which write through it

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above
    from idmctl.record.models import Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        query = select(Job).where(Job.scheduler_id.is_not(None))  # type: ignore[union-attr]
        if chain_id is not None:
            query = query.where(Job.chain_id == chain_id)
        if user is not None:
            query = query.where(Job.user == user)
        return [job for job in orm.exec(query).all() if not is_terminal(job.state)]


def open_chain(experiment: str, spec_hash: str, retries: int) -> int:
    """An ACTIVE chain of an already registered spec version (an eval job's own chain: the training
    chain's spec hash, ``retries`` 0); returns its id."""
    with connect() as fast:
        if fast is not None:  # plain sqlite3: the submit path imports no ORM
            return _insert_chain(fast, experiment, spec_hash, retries)
    from idmctl.record.db import session  # start-up: SQLAlchemy only for a store not at head or the shared one
    from idmctl.record.models import Chain  # start-up: SQLAlchemy, as above

    with session() as orm:
        chain = Chain(experiment=experiment, spec_hash=spec_hash, retries_budget=retries)
        orm.add(chain)
        orm.flush()
        return int(chain.id or 0)


def withdraw_chain(chain_id: int) -> bool:
    """Remove a chain opened for a submission the scheduler then refused before any attempt was recorded,
    so a refusal leaves nothing behind; a chain with an attempt is kept. True when it was removed."""
    with connect() as fast:
        if fast is not None:  # plain sqlite3: the submit path imports no ORM
            return fast.execute("DELETE FROM chain WHERE id = ? AND NOT EXISTS (SELECT 1 FROM job WHERE chain_id = ?)",
                                (chain_id, chain_id)).rowcount == 1
    from sqlmodel import select  # start-up: SQLAlchemy only for a store not at head or the shared one

    from idmctl.record.db import session  # start-up: as above
    from idmctl.record.models import Chain, Job  # start-up: as above

    with session() as orm:
        chain = orm.get(Chain, chain_id)
        if chain is None or orm.exec(select(Job.id).where(Job.chain_id == chain_id)).first() is not None:
            return False
        orm.delete(chain)
        return True


def _insert_chain(fast: Any, experiment: str, spec_hash: str, retries: int) -> int:
    return insert(fast, "chain", {"experiment": experiment, "spec_hash": spec_hash, "mlflow_run_id": None,
                                  "retries_budget": retries, "retries_used": 0, "status": "ACTIVE",
                                  "created_at": db_time()})


def insert_job(values: dict[str, Any]) -> int:
    """A new job row with these columns; returns its id."""
    with connect() as fast:
        if fast is not None:  # plain sqlite3: the submit path imports no ORM
            now = db_time()
            return insert(fast, "job", {"restarts": 0, "imported": 0, "created_at": now, "updated_at": now, **values})
    from idmctl.record.db import session  # start-up: SQLAlchemy only for a store not at head or the shared one
    from idmctl.record.models import Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        job = Job(**values)
        orm.add(job)
        orm.flush()
        return int(job.id or 0)


def update_chain(chain_id: int, values: dict[str, Any]) -> None:
    """Set these columns of the chain (nothing for an unknown chain)."""
    from idmctl.record.db import session  # start-up: SQLAlchemy; only `submit --resume` asks
    from idmctl.record.models import Chain  # start-up: SQLAlchemy, as above

    with session() as orm:
        chain = orm.get(Chain, chain_id)
        if chain is not None:
            for key, value in values.items():
                setattr(chain, key, value)
            orm.add(chain)


def chain_and_attempts(chain_id: int) -> tuple[Any, list[Any]]:
    """The chain (None when unknown) and its job rows, oldest attempt first."""
    from sqlmodel import select  # start-up: SQLAlchemy; only `submit --resume` asks

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above
    from idmctl.record.models import Chain, Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        chain = orm.get(Chain, chain_id)
        attempts = list(orm.exec(select(Job).where(Job.chain_id == chain_id).order_by(Job.attempt)).all()) if chain else []
    return chain, attempts


def take_for_resubmission(job_id: int, spends_retry: bool) -> tuple[dict[str, Any], Any]:
    """What a resubmission of job ``job_id`` starts from (its chain, attempt, preflight, forced reason, spec
    hash, executor, code version, stored options, admission, code snapshot, script path) and the preflight
    row it passed (detached; None without one), spending one of the chain's retries when ``spends_retry``.
    UserError for a job that is not in a chain."""
    from idmctl.record.db import session  # start-up: SQLAlchemy; only a resubmitting sync asks
    from idmctl.record.models import Chain, Job, PreflightRun  # start-up: SQLAlchemy, as above

    with session() as orm:
        old = orm.get(Job, job_id)
        if old is None or old.chain_id is None:
            raise UserError(f"no job {job_id}", field="JOB")
        chain = orm.get(Chain, old.chain_id)
        assert chain is not None
        if spends_retry:
            chain.retries_used += 1
            orm.add(chain)
        preflight = orm.get(PreflightRun, old.preflight_id) if old.preflight_id else None
        if preflight is not None:
            orm.expunge(preflight)
        return {"chain_id": old.chain_id, "attempt": old.attempt, "preflight_id": old.preflight_id,
                "forced": old.forced_reason, "spec_hash": old.spec_hash, "executor": old.executor,
                "code_version": old.code_version, "options_json": old.options_json, "admitted": old.admitted,
                "code": old.code,
                "script_path": old.script_path}, preflight

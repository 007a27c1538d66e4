"""Jobs and chains in the store: the queries the listing, the ETAs, the queue check, the code snapshots'
collector and ``cancel`` read, and the rows submit, resubmission and sync write and read. Each reads
with plain sqlite3 (``idmctl.record.fast``) where the CLI's start-up time needs it and the store is at
head, else through the ORM (which migrates an older store, and is the only path to the team's
PostgreSQL store)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, TypeAlias

from idmctl.core.job_state import JobState, is_terminal
from idmctl.record.fast import connect, from_db_time, rows

if TYPE_CHECKING:
    from idmctl.record.models import Chain, Job

JobRow: TypeAlias = "Job | SimpleNamespace"
"""A job's row as a listing reads it: the ORM's, or plain sqlite3's attribute row with the same column names."""
ChainRow: TypeAlias = "Chain | SimpleNamespace"
"""A chain's row, likewise."""

JOB_COLUMNS = ("id", "chain_id", "attempt", "experiment", "executor", "scheduler_id", "state", "reason", "exit_code",
               "restarts", "qos", "node_list", "submitted_at", "started_at", "ended_at", "forced_reason",
               "options_json", "controller", "eval_of_chain", "eval_step", "eval_after", "eval_choice",
               "eval_replaces", "eval_moved_to", "script_path", "user", "host")
"""What ``idmctl jobs`` shows of a job (its ETA reads ``script_path`` and the stored options)."""
CHAIN_COLUMNS = ("id", "mlflow_run_id", "retries_budget", "retries_used")
_DATES = ("submitted_at", "started_at", "ended_at")


def read_jobs_fast(db: Path, limit: int, user: str | None = None) -> tuple[list[SimpleNamespace], dict[int, SimpleNamespace]] | None:
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


def newest_jobs(db: Path, limit: int, user: str | None = None) -> tuple[list[JobRow], dict[int, ChainRow]]:
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


def job_by_id(job_id: int) -> JobRow | None:
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


def running_jobs() -> tuple[list["Job"], dict[int, "Chain"]]:
    """The jobs recorded RUNNING and their chains by id."""
    from sqlmodel import select  # start-up: SQLAlchemy; only `watch` asks, after a sync loaded it anyway

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above
    from idmctl.record.models import Chain, Job  # start-up: SQLAlchemy, as above

    with session() as orm:
        running = orm.exec(select(Job).where(Job.state == JobState.RUNNING.value)).all()
        chains = {c.id: c for c in orm.exec(select(Chain).where(Chain.id.in_({j.chain_id for j in running})))}  # type: ignore[union-attr]
    return list(running), chains


def submitted_with_gpus(gpus: int) -> list[JobRow]:
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

"""Failures, fixes and the jobs they belong to, in the store: what ``failures``, ``failures fix``,
``jobs import``, the ledger and sync's classify → record step read and look up.

The ``*_fast`` reads use plain sqlite3, read-only, and return None where the store's face must serve
instead (no store, another schema revision, jobs that still need classifying, or the team's PostgreSQL
store): ``idmctl failures`` and ``idmctl ledger`` then never import the ORM (~0.45 s of a 0.8 s command).
Classifying, recording failures and fixes go through ``idmctl.record.store``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from idmctl.core.job_state import is_failed
from idmctl.record.fast import stored_json_value
from idmctl.record.stored_json import typed
from idmctl.record.head import HEAD_REVISION  # the schema the fast reads understand
from idmctl.record.url import shared_url

if TYPE_CHECKING:
    from idmctl.record.db import Session
    from idmctl.record.models import Failure, Job

def open_classified(db: Path) -> sqlite3.Connection | None:
    """A read-only sqlite3 connection to the store (rows as ``sqlite3.Row``), or None when the ORM path
    must run instead: no store, another schema revision, jobs that still need classifying, or the team's
    PostgreSQL store (``IDMCTL_DB_URL``)."""
    if shared_url() or not db.exists():
        return None
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    connection.row_factory = sqlite3.Row
    try:
        revision = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        # The same candidates as JobStore.to_classify: anything that may hold an unclassified failed run.
        unclassified = [] if revision is None or revision[0] != HEAD_REVISION else connection.execute(
            "SELECT state, restarts FROM job WHERE (state != 'COMPLETED' OR restarts > 0) AND NOT EXISTS "
            "(SELECT 1 FROM failure f WHERE f.job_id = job.id AND f.classified_at >= job.updated_at)").fetchall()
    except sqlite3.Error:
        connection.close()
        return None
    if revision is None or revision[0] != HEAD_REVISION or any(
            is_failed(row["state"]) or row["restarts"] > 0 for row in unclassified):
        connection.close()
        return None
    return connection


def failure_rows_fast(db: Path, experiment: str | None, cause: str | None, newest: int | None,
                      user: str | None = None) -> tuple[list[tuple[SimpleNamespace, SimpleNamespace, SimpleNamespace | None]], int] | None:
    """(failure, job, fix or None) of the ``newest`` failed runs (None: all), newest first, as attribute
    rows like the ORM's (the job's ``ended_at`` and ``submitted_at``/``created_at`` stay text), and the count
    of failed runs; None where the ORM path must run (:func:`open_classified`)."""
    connection = open_classified(db)
    if connection is None:
        return None
    try:
        where, params = ["f.job_id = j.id"], []
        if experiment:
            where.append("j.experiment = ?")
            params.append(experiment)
        if cause:
            where.append("f.cause = ?")
            params.append(cause)
        if user:
            where.append('j."user" = ?')
            params.append(user)
        clause = " AND ".join(where)
        total = connection.execute(f"SELECT count(f.id) FROM failure f, job j WHERE {clause}", params).fetchone()[0]
        selected = connection.execute(
            "SELECT f.cause, f.evidence, f.detail_json, f.fix_id, j.id, j.chain_id, j.experiment, j.state, j.gpus, "
            "j.qos, j.routing_n, j.scheduler_id, j.restarts, j.imported, j.ended_at, j.submitted_at, j.created_at, "
            "j.\"user\", x.note, x.\"commit\" FROM failure f, job j LEFT JOIN fix x ON x.id = f.fix_id "
            f"WHERE {clause} ORDER BY coalesce(j.ended_at, j.submitted_at, j.created_at) DESC, j.id DESC LIMIT ?",
            [*params, -1 if newest is None else newest]).fetchall()  # LIMIT -1: no limit
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    found = []
    for row in selected:
        failure = SimpleNamespace(cause=row["cause"], evidence=row["evidence"], detail_json=row["detail_json"],
                                  fix_id=row["fix_id"])
        job = SimpleNamespace(id=row["id"], chain_id=row["chain_id"], experiment=row["experiment"], state=row["state"],
                              gpus=row["gpus"], qos=row["qos"], routing_n=row["routing_n"],
                              scheduler_id=row["scheduler_id"], restarts=row["restarts"], imported=row["imported"],
                              ended_at=row["ended_at"], submitted_at=row["submitted_at"],
                              created_at=row["created_at"], user=row["user"])
        fix = SimpleNamespace(note=row["note"], commit=row["commit"]) if row["fix_id"] else None
        found.append((failure, job, fix))
    return found, total


LedgerJob = tuple[Any, ...]
"""(id, chain_id, attempt, experiment, qos, gpus, state, exit_code, ended_at as text, script_path,
run seconds, sync's run list (``Job.runs``) or None): what the ledger costs per job."""


def _causes(found: Any) -> dict[tuple[int, int], str]:
    causes: dict[tuple[int, int], str] = {}
    for job_id, cause, detail in found:
        causes[(job_id, json.loads(detail).get("run", 1) if detail else 1)] = cause
    return causes


def ledger_inputs_fast(db: Path, user: str | None = None) -> tuple[list[LedgerJob], dict[tuple[int, int], str]] | None:
    """Every started job (of ``user`` only, when given) as a :data:`LedgerJob`, and each (job id, run)'s
    recorded cause, read with sqlite3; None where the ORM path must run (:func:`open_classified`)."""
    connection = open_classified(db)
    if connection is None:
        return None
    try:
        # Run times come from SQLite (julianday) for the usual one-run job; the ledger walks the run list
        # of the jobs sync recorded one for.
        jobs = connection.execute(
            "SELECT id, chain_id, attempt, experiment, qos, gpus, state, exit_code, ended_at, script_path, "
            "round((julianday(ended_at) - julianday(started_at)) * 86400.0, 3) AS seconds, "
            "runs "
            "FROM job WHERE started_at IS NOT NULL" + (' AND "user" = ?' if user else ""),
            (user,) if user else ()).fetchall()
        causes = _causes(connection.execute("SELECT job_id, cause, detail_json FROM failure"))
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    return [(*tuple(job)[:-1], typed(stored_json_value(job["runs"], job["id"], "runs"), "runs", job["id"]))
            for job in jobs], causes


def ledger_inputs(db: "Session", user: str | None = None) -> tuple[list[LedgerJob], dict[tuple[int, int], str]]:
    """:func:`ledger_inputs_fast` through the ORM session ``db``: any backend (the PostgreSQL store's only path)."""
    from sqlmodel import select  # start-up: SQLAlchemy; the caller's session loaded it already

    from idmctl.record.models import Failure, Job  # start-up: SQLAlchemy, as above

    query = select(Job.id, Job.chain_id, Job.attempt, Job.experiment, Job.qos, Job.gpus, Job.state, Job.exit_code,
                   Job.ended_at, Job.script_path, Job.started_at, Job.runs).where(Job.started_at.is_not(None))  # type: ignore[union-attr]
    if user:
        query = query.where(Job.user == user)
    jobs = []
    for *head, ended_at, script, started_at, runs in db.exec(query).all():
        seconds = None if ended_at is None else round(max(0.0, (ended_at - started_at).total_seconds()), 3)
        jobs.append((*head, None if ended_at is None else str(ended_at), script, seconds,
                     typed(runs, "runs", head[0])))
    return jobs, _causes(db.exec(select(Failure.job_id, Failure.cause, Failure.detail_json)).all())


def stored_ledger_inputs(user: str | None = None) -> tuple[list[LedgerJob], dict[tuple[int, int], str]]:
    """:func:`ledger_inputs` in a read transaction of its own: for callers that hold no session."""
    from idmctl.record import session  # start-up: record's session loads SQLAlchemy on first use

    with session() as db:
        return ledger_inputs(db, user)

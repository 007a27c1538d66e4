"""``idmctl jobs`` rows read with plain sqlite3 (``idmctl.record.fast``): the listing and its ETAs never
import the ORM, which was most of the command's time. The ORM path still runs when the store is not
at head (none yet, or another revision: the ORM migrates it)."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

JOB_COLUMNS = ("id", "chain_id", "attempt", "experiment", "executor", "scheduler_id", "state", "reason", "exit_code",
               "restarts", "qos", "node_list", "submitted_at", "started_at", "ended_at", "forced_reason",
               "options_json", "script_path", "user", "host")
CHAIN_COLUMNS = ("id", "mlflow_run_id", "retries_budget", "retries_used")
_DATES = ("submitted_at", "started_at", "ended_at")


def read_jobs(db: Path, limit: int, user: str | None = None) -> tuple[list[Any], dict[int, Any]] | None:
    """The newest ``limit`` jobs (of ``user`` only, when given) and their chains, as attribute rows like
    the ORM's; None → use the ORM."""
    from idmctl.record.fast import connect, from_db_time, rows

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


def queue_wait_seconds(job: Any) -> float | None:
    """Start − submit: how long the job waited in the queue (None until it started)."""
    if job.started_at is None or job.submitted_at is None:
        return None
    return (aware(job.started_at) - aware(job.submitted_at)).total_seconds()


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

"""``idmctl jobs`` rows read with plain sqlite3: the listing (and its ETAs) never imports the ORM, which is
most of the command's time (sqlmodel ~0.3–0.45 s). The ORM path still runs when there is no store yet
(it creates and migrates one) or the read fails (a schema this read does not know)."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

JOB_COLUMNS = ("id", "chain_id", "attempt", "experiment", "executor", "scheduler_id", "state", "reason", "exit_code",
               "restarts", "qos", "node_list", "submitted_at", "started_at", "ended_at", "forced_reason",
               "options_json", "script_path")
CHAIN_COLUMNS = ("id", "mlflow_run_id", "retries_budget", "retries_used")
_DATES = ("submitted_at", "started_at", "ended_at")


def _date(text: str | None) -> datetime | None:
    # Stored as UTC "YYYY-MM-DD HH:MM:SS.ffffff"; the ORM's column type hands it back UTC-aware.
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def read_jobs(db: Path, limit: int) -> tuple[list[Any], dict[int, Any]] | None:
    """The newest ``limit`` jobs and their chains, as attribute rows like the ORM's; None → use the ORM."""
    if not db.exists():
        return None
    try:
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error:
        return None
    connection.row_factory = sqlite3.Row
    try:
        rows = connection.execute(f"SELECT {', '.join(JOB_COLUMNS)} FROM job ORDER BY id DESC LIMIT ?",
                                  (limit,)).fetchall()
        chain_ids = sorted({row["chain_id"] for row in rows if row["chain_id"] is not None})
        chains = connection.execute(
            f"SELECT {', '.join(CHAIN_COLUMNS)} FROM chain WHERE id IN ({', '.join('?' * len(chain_ids))})",
            chain_ids).fetchall() if chain_ids else []
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    jobs = [SimpleNamespace(**{k: (_date(row[k]) if k in _DATES else row[k]) for k in JOB_COLUMNS}) for row in rows]
    return jobs, {row["id"]: SimpleNamespace(**dict(row)) for row in chains}


def queue_wait_seconds(job: Any) -> float | None:
    """Start − submit: how long the job waited in the queue (None until it started)."""
    if job.started_at is None or job.submitted_at is None:
        return None
    return (aware(job.started_at) - aware(job.submitted_at)).total_seconds()


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

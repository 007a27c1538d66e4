"""Where an evaluation job's link to its training chain is stored: the ``eval`` key of the job's stored
options (``Job.options_json``), one place to read it and one query over it, so the facts can move to
columns later without touching the callers."""

from __future__ import annotations

import json
from typing import Any

from sqlmodel import Session, select

from idmctl.record.db import session
from idmctl.record.models import Job

EVAL_KEY = "eval"
"""``{"of_chain": training chain id, "step": checkpoint step, "after": the training job's scheduler id
it waits on, "choice": the --eval value, "replaces": the eval job id it stands in for (or absent)}``."""


def eval_link(options_json: str | None) -> dict[str, Any] | None:
    """The job's link to the training chain it evaluates; None for any other job."""
    try:
        link = json.loads(options_json or "{}").get(EVAL_KEY)
    except ValueError:
        return None
    return link if isinstance(link, dict) and "of_chain" in link else None


def eval_jobs_of(db: Session, chain_id: int) -> list[Job]:
    """Every evaluation job recorded for training chain ``chain_id``, oldest first."""
    candidates = db.exec(select(Job).where(Job.options_json.contains(f'"{EVAL_KEY}"'))  # type: ignore[union-attr]
                         .order_by(Job.id)).all()
    return [job for job in candidates if (eval_link(job.options_json) or {}).get("of_chain") == chain_id]


def store_eval_link(job_id: int, link: dict[str, Any]) -> None:
    """Replace the job's link (it now waits on another attempt, or another eval job stands in for it)."""
    with session() as db:
        row = db.get(Job, job_id)
        if row is not None:
            stored = json.loads(row.options_json or "{}")
            stored[EVAL_KEY] = link
            row.options_json = json.dumps(stored)
            db.add(row)

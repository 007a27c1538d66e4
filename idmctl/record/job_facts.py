"""Facts about one job that have no column yet, kept under a named key of its stored options
(``Job.options_json``): the one place that writes them, so a later migration moves each key to a column
by changing this module only.

The keys in use:

- ``committed_step``: ``{"step": N | None, "source": ...}``, the newest checkpoint the chain's run
  directory held when the attempt ended (the crash-loop rule compares consecutive attempts);
- ``controller``: ``{"scheduler_id", "submitted_at", "after"}``, the controller job that follows the
  attempt (``idmctl.ops.controller``), and after its run ``last_run``: ``{"at", "result", "ok",
  "scheduler_id"}``;
- ``end_recorded``: ``{"by": "host:pid", "at"}``, the sync that claimed the job's end: it alone classified,
  recorded and decided it (``idmctl.record.claims``).
"""

from __future__ import annotations

import json
from typing import Any

from idmctl.record.fast import connect, rows, update
from idmctl.record.stored_json import job_options

COMMITTED_STEP = "committed_step"
CONTROLLER = "controller"
END_RECORDED = "end_recorded"
FACTS = (COMMITTED_STEP, CONTROLLER, END_RECORDED)


def with_fact(options_json: str | None, key: str, value: Any, job: object = "?") -> str:
    """``options_json`` with ``key`` set to ``value`` (a dict value is merged into what is there)."""
    if key not in FACTS:
        raise KeyError(f"{key!r} is not a job fact ({', '.join(FACTS)})")
    options = job_options(options_json, job)
    old = options.get(key)
    options[key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    return json.dumps(options)


def fact(options_json: str | None, key: str, job: object = "?") -> Any:
    """The stored value of ``key`` (None when it was never recorded)."""
    return job_options(options_json, job).get(key)


def record_fact(job_id: int, key: str, value: Any) -> None:
    """Set ``key`` on the stored job ``job_id``: plain sqlite3 on a store at head (the submit path imports
    no ORM), else the ORM (PostgreSQL, a store to migrate)."""
    with connect() as db:
        if db is not None:
            found = rows(db, "SELECT options_json FROM job WHERE id = ?", (job_id,))
            if found:
                update(db, "job", job_id, {"options_json": with_fact(found[0].options_json, key, value, job_id)})
            return
    from idmctl.record.db import session  # the ORM only where the fast path cannot serve
    from idmctl.record.models import Job  # start-up: the models pull SQLModel, as the session does

    with session() as orm:
        job = orm.get(Job, job_id)
        if job is not None:
            job.options_json = with_fact(job.options_json, key, value, job_id)
            orm.add(job)

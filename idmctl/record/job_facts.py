"""Facts recorded on a job after it was submitted, each in its own column of ``job`` (their shapes are
in ``models.Job``'s field docstrings): the one place that merges a fact into a stored row from outside
an ORM session (a controller job noting its run, submit noting the controller it sent).

A caller holding the row reads the column itself (``job.controller``, ``job.committed_step``); the
end claim and the notices have their own compare-and-set (``idmctl.record.claims``, ``.notices``).
"""

from __future__ import annotations

from typing import Any

from idmctl.record.fast import connect, rows, update
from idmctl.record.moves import merged

COMMITTED_STEP = "committed_step"
CONTROLLER = "controller"
FACTS = (COMMITTED_STEP, CONTROLLER)


def record_fact(job_id: int, key: str, value: Any) -> None:
    """Set the fact ``key`` (a dict is merged into what is there) on the stored job ``job_id``: plain
    sqlite3 on a store at head (the submit path imports no ORM), else the ORM (PostgreSQL, a store to
    migrate)."""
    if key not in FACTS:
        raise KeyError(f"{key!r} is not a job fact ({', '.join(FACTS)})")
    with connect() as db:
        if db is not None:
            found = rows(db, f'SELECT id, "{key}" FROM job WHERE id = ?', (job_id,))
            if found:
                update(db, "job", job_id, {key: merged(getattr(found[0], key), value)})
            return
    from idmctl.record.db import session  # the ORM only where the fast path cannot serve
    from idmctl.record.models import Job  # start-up: the models pull SQLModel, as the session does

    with session() as orm:
        job = orm.get(Job, job_id)
        if job is not None:
            setattr(job, key, merged(getattr(job, key), value))
            orm.add(job)

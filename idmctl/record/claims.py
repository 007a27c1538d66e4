"""Claims that make one ended job's end recorded and decided exactly once, whoever syncs.

A chain's controller job runs ``idmctl sync --chain`` after every attempt, and a person's ``sync`` or
``watch`` (or a second controller after a requeue) can look at the same ended attempt at the same
moment. Both would classify it, write its Failure rows and resubmit it: two attempts where one was due.
The sync that claims the job's end does all of that; the other leaves the job alone and says so.

The claim is a compare-and-set of the job's stored options (``Job.options_json``) inside the caller's
transaction: the options are read, and rewritten with the ``end_recorded`` fact only where they are
still exactly what was read. SQLite lets one writer in at a time (the second waits its busy timeout,
then sees the first's commit); PostgreSQL's UPDATE waits on the first's row lock and re-reads the row
once it commits. Either way the loser's UPDATE matches nothing.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone

from sqlalchemy import select, update
from sqlmodel import Session

from idmctl.record.job_facts import END_RECORDED, fact, with_fact
from idmctl.record.models import Job

CLAIM_TRIES = 5
"""Rewrites of the options between our read and our write that are not a claim (a controller noting
its run) make us read again; a claim seen ends the tries at once."""


def claim_end(db: Session, job_id: int) -> bool:
    """True when this transaction now holds the end of job ``job_id`` (it records and decides it); False
    when another sync claimed it first. Call before changing the job's row in this session, then
    ``db.refresh`` the row to read the claim back."""
    table = Job.__table__  # type: ignore[attr-defined]
    connection = db.connection()
    claim = {"by": f"{socket.gethostname()}:{os.getpid()}", "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    for _ in range(CLAIM_TRIES):
        current = connection.execute(select(table.c.options_json).where(table.c.id == job_id)).scalar_one_or_none()
        if fact(current, END_RECORDED, job_id) is not None:
            return False
        marked = with_fact(current, END_RECORDED, claim, job_id)
        same = table.c.options_json.is_(None) if current is None else table.c.options_json == current
        if connection.execute(update(table).where(table.c.id == job_id, same).values(options_json=marked)).rowcount == 1:
            return True
    return False

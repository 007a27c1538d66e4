"""Claims that make one ended job's end recorded and decided exactly once, whoever syncs.

A chain's controller job runs ``idmctl sync --chain`` after every attempt, and a person's ``sync`` or
``watch`` (or a second controller after a requeue) can look at the same ended attempt at the same
moment. Both would classify it, write its Failure rows and resubmit it: two attempts where one was due.
The sync that claims the job's end does all of that; the other leaves the job alone and says so.

The claim is a compare-and-set on the job's ``end_recorded`` column inside the caller's transaction:
``UPDATE job SET end_recorded = … WHERE id = ? AND end_recorded IS NULL``. SQLite lets one writer in at
a time (the second waits its busy timeout, then sees the first's commit); PostgreSQL's UPDATE waits on
the first's row lock and re-reads the row once it commits. Either way the loser's UPDATE matches nothing.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone

from sqlalchemy import update
from sqlmodel import Session

from idmctl.record.models import Job


def claim_end(db: Session, job_id: int) -> bool:
    """True when this transaction now holds the end of job ``job_id`` (it records and decides it); False
    when another sync claimed it first. Call before changing the job's row in this session, then
    ``db.refresh`` the row to read the claim back."""
    table = Job.__table__  # type: ignore[attr-defined]
    claim = {"by": f"{socket.gethostname()}:{os.getpid()}", "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    marked = db.connection().execute(update(table).where(table.c.id == job_id, table.c.end_recorded.is_(None))
                                     .values(end_recorded=claim))
    return marked.rowcount == 1

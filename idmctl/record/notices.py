"""Which notifications a job's events have had: at most one message per event, however many syncs see it
(a manual ``idmctl sync`` racing the chain's controller job included).

Kept in the job's ``notified`` column (event name → when it was claimed); :func:`claim_notice` is the
one place that reads or writes it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from sqlalchemy import String, cast, update
from sqlmodel import Session, select

from idmctl.record.models import Failure, Job


def claim_notice(db: Session, job_id: int, event: str) -> bool:
    """True when this call is the first to claim ``event`` for the job (the caller then sends it); False
    when it was claimed before. A compare-and-set on the row's ``notified`` column: of two syncs deciding
    the same job at once, exactly one update matches the value both read, so exactly one sends."""
    table = Job.__table__  # type: ignore[attr-defined]
    connection = db.connection()
    found = connection.execute(select(table.c.notified).where(table.c.id == job_id)).one_or_none()
    if found is None:
        return False
    notified = found[0] or {}
    if event in notified:
        return False
    claimed_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    # The JSON value compares as its text: what this transaction read back, serialized as it was written.
    same = table.c.notified.is_(None) if found[0] is None else cast(table.c.notified, String) == json.dumps(found[0])
    claimed = connection.execute(update(table).where(table.c.id == job_id, same)
                                 .values(notified={**notified, event: claimed_at}))
    db.commit()
    return claimed.rowcount == 1


def final_failure(db: Session, job_id: int) -> Failure | None:
    """The Failure row of the job's final run (the one its retry decision read), or None."""
    final = [(json.loads(row.detail_json or "{}"), row) for row in db.exec(select(Failure).where(Failure.job_id == job_id))]
    final = [(int(detail.get("run", 1)), row.id or 0, row) for detail, row in final if detail.get("final")]
    return max(final, key=lambda item: item[:2])[2] if final else None

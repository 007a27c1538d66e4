"""Which notifications a job's events have had: at most one message per event, however many syncs see it
(a manual ``idmctl sync`` racing the chain's controller job included).

Kept under the ``notified`` key of the job's stored options (event name → when it was claimed) until the
store has a column for it; :func:`claim_notice` is the one place that reads or writes it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from sqlmodel import Session, col, select, update

from idmctl.record.models import Failure, Job
from idmctl.record.stored_json import job_options

NOTIFIED_KEY = "notified"


def claim_notice(db: Session, job_id: int, event: str) -> bool:
    """True when this call is the first to claim ``event`` for the job (the caller then sends it); False
    when it was claimed before. A compare-and-set on the row's options: of two syncs deciding the same
    job at once, exactly one update matches the text both read, so exactly one sends."""
    job = db.get(Job, job_id)
    if job is None:
        return False
    before = job.options_json
    options = job_options(before, job_id)
    notified = options.get(NOTIFIED_KEY) or {}
    if event in notified:
        return False
    options[NOTIFIED_KEY] = {**notified, event: datetime.now(timezone.utc).isoformat(timespec="seconds")}
    claimed = db.exec(update(Job).where(col(Job.id) == job_id, col(Job.options_json) == before)  # type: ignore[call-overload]
                      .values(options_json=json.dumps(options)))
    db.commit()
    return claimed.rowcount == 1


def final_failure(db: Session, job_id: int) -> Failure | None:
    """The Failure row of the job's final run (the one its retry decision read), or None."""
    final = [(json.loads(row.detail_json or "{}"), row) for row in db.exec(select(Failure).where(Failure.job_id == job_id))]
    final = [(int(detail.get("run", 1)), row.id or 0, row) for detail, row in final if detail.get("final")]
    return max(final, key=lambda item: item[:2])[2] if final else None

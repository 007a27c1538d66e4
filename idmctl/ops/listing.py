"""What ``idmctl jobs`` derives from a job row: its queue wait (the rows come from
``idmctl.record.jobs``, read with plain sqlite3 so the listing never imports the ORM)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def queue_wait_seconds(job: Any) -> float | None:
    """Start − submit: how long the job waited in the queue (None until it started)."""
    if job.started_at is None or job.submitted_at is None:
        return None
    return (aware(job.started_at) - aware(job.submitted_at)).total_seconds()


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

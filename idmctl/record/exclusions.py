"""Node exclusions in the store: the nodes ``sync`` took out of later submissions after a node failure."""

from __future__ import annotations

from datetime import datetime, timezone

from ground.paths import db_path
from idmctl.record.fast import connect, from_db_time, rows


def active_exclusions() -> list[str]:
    """Nodes excluded by ``sync`` (node failures) whose exclusion has not expired, sorted."""
    if not db_path().exists():  # no store, no exclusions; and a dry run or a refused submit creates none
        return []
    now = datetime.now(timezone.utc)
    with connect() as fast:
        if fast is not None:  # the store is at head: no ORM import on the submit path
            found = rows(fast, "SELECT node, until FROM node_exclusion")
            return sorted({row.node for row in found if (from_db_time(row.until) or now) > now})
    from sqlmodel import select  # start-up: SQLAlchemy only for a store not at head or the shared one

    from idmctl.record.db import session  # start-up: SQLAlchemy, as above
    from idmctl.record.models import NodeExclusion  # start-up: SQLAlchemy, as above

    with session() as db:
        exclusions = db.exec(select(NodeExclusion)).all()
    return sorted({row.node for row in exclusions
                   if (row.until if row.until.tzinfo else row.until.replace(tzinfo=timezone.utc)) > now})

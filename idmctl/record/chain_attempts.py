"""A chain's attempts as the store holds them (the crash-loop rule and the controller read them)."""

from __future__ import annotations

from sqlmodel import Session, select

from idmctl.record.models import Job


def attempts_of(db: Session, chain_id: int, before: int | None = None) -> list[Job]:
    """The chain's job rows, oldest attempt first (only attempts numbered below ``before``, when given)."""
    query = select(Job).where(Job.chain_id == chain_id)
    if before is not None:
        query = query.where(Job.attempt < before)
    return list(db.exec(query.order_by(Job.attempt, Job.id)).all())

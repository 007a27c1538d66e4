"""Where an evaluation job's link to its training chain is stored: the ``eval_*`` columns of its job row
(``eval_of_chain`` indexed, so a chain's eval jobs are one WHERE); ``stored_json.eval_link`` reads them
as one dict (without the ORM: ``idmctl jobs`` shows it)."""

from __future__ import annotations

from sqlmodel import Session, select

from idmctl.core.job_state import JobState
from idmctl.record.db import session
from idmctl.record.models import Job

def eval_jobs_of(db: Session, chain_id: int) -> list[Job]:
    """Every evaluation job recorded for training chain ``chain_id``, oldest first."""
    return list(db.exec(select(Job).where(Job.eval_of_chain == chain_id).order_by(Job.id)).all())


def completed_evals(chain_id: int) -> dict[int, int]:
    """Checkpoint step → the id of the chain's eval job that scored it (COMPLETED; the newest if several)."""
    with session() as db:
        return {int(job.eval_step): int(job.id) for job in eval_jobs_of(db, chain_id)
                if job.state == JobState.COMPLETED and job.eval_step is not None}


def measured_eval(experiment: str, spec_hash: str) -> tuple[int, float] | None:
    """(job id, seconds it ran: ended − started) of the newest COMPLETED eval job of this experiment at this
    spec hash (same evaluations, episodes and model), or None where no eval job of it ran to the end."""
    with session() as db:
        rows = db.exec(select(Job).where(Job.experiment == experiment, Job.spec_hash == spec_hash,
                                         Job.eval_of_chain.is_not(None),  # type: ignore[union-attr]
                                         Job.state == JobState.COMPLETED.value).order_by(Job.id.desc())).all()  # type: ignore[union-attr]
        for job in rows:
            if job.started_at is not None and job.ended_at is not None:
                return int(job.id or 0), max(0.0, (job.ended_at - job.started_at).total_seconds())
    return None

"""The store reads ``idmctl report`` needs: an experiment's jobs, and its newest preflight with its checks."""

from __future__ import annotations

from sqlmodel import col, select

from idmctl.record.db import session
from idmctl.record.models import Job, PreflightCheck, PreflightRun
from idmctl.record.records import JobRecord
from idmctl.record.sql_store import job_record


def jobs_of(experiments: list[str]) -> list[JobRecord]:
    """Every job of these experiments, oldest submission first."""
    with session() as db:
        jobs = [job_record(row.model_dump()) for row in db.exec(select(Job).where(col(Job.experiment).in_(experiments)))]
    return sorted(jobs, key=lambda j: (j.submitted_at is None, j.submitted_at, j.id))


def newest_preflight(experiment: str) -> tuple[PreflightRun, list[PreflightCheck]] | None:
    """The experiment's newest preflight run and its checks (detached); None when it has none."""
    with session() as db:
        run = db.exec(select(PreflightRun).where(PreflightRun.experiment == experiment)
                      .order_by(col(PreflightRun.id).desc())).first()
        if run is None:
            return None
        checks = list(db.exec(select(PreflightCheck).where(PreflightCheck.run_id == run.id).order_by(col(PreflightCheck.id))))
        db.expunge_all()
    return run, checks


def ended_jobs() -> list[JobRecord]:
    """Every job that has ended, of any experiment (the history a forecast stands on)."""
    with session() as db:
        return [job_record(row.model_dump()) for row in db.exec(select(Job).where(col(Job.ended_at).is_not(None)))]

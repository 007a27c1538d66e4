"""The postmortem log: classify failed jobs into ``Failure`` rows, record fixes, build card A's table.

``record_failures`` is idempotent and cheap, so ``sync`` can call it after every poll and
``idmctl failures`` calls it before reporting: a job is (re)classified when it has no Failure yet or
its record changed since (a fix already recorded stays attached).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import exists, func, or_
from sqlmodel import Session, select

from ground.errors import UserError
from idmctl.core.job_state import JobState, is_failed
from idmctl.ops.failures.classify import Classification, classify, get_cause
from idmctl.ops.failures.progress import crash_loop, with_resume_events
from idmctl.ops.failures.rows import (PostmortemRow, _naive_utc, build_row, is_since, parse_since,  # noqa: F401 (re-exported)
                                  setting_of)
from idmctl.core.notice import warn
from idmctl.record.models import Chain, Failure, Fix, Job

LOG_TAIL_BYTES = 64_000
"""How much of a job log's end is read when the store has no tail: a traceback fits easily."""


def read_log_tail(path: str | None, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a job log ('' when it is missing)."""
    if not path:
        return ""
    log = Path(path)
    try:
        with open(log, "rb") as handle:
            size = log.stat().st_size
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def waited_seconds(job: Job) -> float | None:
    """Seconds between submit and start (or end, for a job that never started)."""
    submitted = _naive_utc(job.submitted_at)
    until = _naive_utc(job.started_at or job.ended_at)
    if submitted is None or until is None:
        return None
    return max(0.0, (until - submitted).total_seconds())


def ran_seconds(job: Job) -> float | None:
    """Seconds between start and end (the last run's, for a requeued job)."""
    started, ended = _naive_utc(job.started_at), _naive_utc(job.ended_at)
    if started is None or ended is None:
        return None
    return max(0.0, (ended - started).total_seconds())


@dataclass(frozen=True)
class FailedRun:
    """One run of a job that ended without completing: a requeued job's earlier runs count too
    (Slurm requeues a preempted job under the same id, so its three preemptions are three runs)."""

    run: int
    """1-based run number (``restarts + 1`` for the job's current run)."""
    final: bool
    state: str
    exit_code: str | None
    reason: str | None
    started: bool
    ran_seconds: float | None


def failed_runs(job: Job) -> list[FailedRun]:
    runs = json.loads(job.options_json or "{}").get("runs") or []
    found: list[FailedRun] = []
    for index, run in enumerate(runs[:-1], start=1):
        if is_failed(run["state"]) or JobState.of(run["state"]) is JobState.REQUEUED:
            started, ended = _parse_iso(run.get("started_at")), _parse_iso(run.get("ended_at"))
            ran = (ended - started).total_seconds() if started and ended else None
            found.append(FailedRun(index, False, run["state"], run.get("exit_code"), run.get("reason"),
                                   started is not None, ran))
    if is_failed(job.state):
        found.append(FailedRun(len(runs) if runs else job.restarts + 1, True, job.state, job.exit_code, job.reason,
                               job.started_at is not None, ran_seconds(job)))
    return found


def _parse_iso(text: str | None) -> datetime | None:
    return _naive_utc(datetime.fromisoformat(text)) if text else None


def classify_job(job: Job, failed: FailedRun | None = None) -> Classification:
    """Classify one stored job (its current run, or an earlier ``failed`` run) from Slurm's record and the log."""
    options = json.loads(job.options_json or "{}")
    if failed is not None and not failed.final:
        # An earlier run: its own Slurm record decides; the log tail belongs to the last run.
        return classify(failed.state, reason=failed.reason, exit_code=failed.exit_code, started=failed.started,
                        ran_seconds=failed.ran_seconds, restarts=failed.run - 1)
    log = read_log_tail(job.log_path) or job.log_tail or ""  # the file holds more than the stored tail
    return classify(job.state, reason=job.reason, exit_code=job.exit_code,
                    derived_exit_code=options.get("derived_exit_code"), log_tail=log,
                    waited_seconds=waited_seconds(job), restarts=job.restarts, started=job.started_at is not None,
                    ran_seconds=ran_seconds(job))


def record_failures(db: Session, jobs: list[Job] | None = None, mark_mlflow: bool = True) -> list[Failure]:
    """Classify every failed run of every job (or those given) that is new or changed; returns the rows written."""
    if jobs is None:
        # Only jobs that can hold a failed run: not completed, or requeued at least once. A store of
        # 10,000 mostly-completed jobs must not be walked row by row on every `idmctl failures`.
        # A job whose record has not changed since it was classified is skipped in SQL.
        classified_since_update = exists().where(Failure.job_id == Job.id, Failure.classified_at >= Job.updated_at)
        jobs = list(db.exec(select(Job).where(or_(Job.state != JobState.COMPLETED.value, Job.restarts > 0),
                                              ~classified_since_update)))
    candidates = [(job, runs) for job in jobs if (runs := failed_runs(job))]
    by_job: dict[int, list[Failure]] = {}
    job_ids = [job.id for job, _ in candidates]
    for start in range(0, len(job_ids), 500):  # SQLite caps bound parameters per statement
        for failure in db.exec(select(Failure).where(Failure.job_id.in_(job_ids[start:start + 500]))):
            by_job.setdefault(failure.job_id, []).append(failure)
    written: list[Failure] = []
    for job, runs in candidates:
        existing = {json.loads(f.detail_json or "{}").get("run", 1): f for f in by_job.get(job.id, [])}
        fresh = existing and all(_naive_utc(f.classified_at) >= _naive_utc(job.updated_at) for f in existing.values())
        if fresh and {run.run for run in runs} <= set(existing):
            continue
        for run in runs:
            found = classify_job(job, run)
            if run.final:  # what resume noticed, and the chain's verdict on a loop, belong to the attempt's end
                found = crash_loop(db, job, with_resume_events(found, read_log_tail(job.log_path)), recorded_causes)
            failure = existing.get(run.run) or Failure(job_id=job.id, cause=found.cause)
            failure.cause = found.cause
            failure.evidence = "\n".join(found.evidence)
            failure.detail_json = json.dumps({**found.detail, "run": run.run, "final": run.final}, sort_keys=True)
            failure.classified_at = datetime.now(timezone.utc)
            db.add(failure)
            written.append(failure)
            if mark_mlflow and run.final:
                _mark_chain_run(db, job, found.cause)
    db.flush()
    return written


def recorded_causes(db: Session, jobs: list[Job]) -> dict[int, str]:
    """Each job's recorded cause of how it ended: the Failure row of its final run (the latest run that
    ``record_failures`` wrote as ``final``). A job with no such row is absent: it has not been classified."""
    ids = [job.id for job in jobs if job.id is not None]
    found: dict[int, tuple[int, str]] = {}
    for start in range(0, len(ids), 500):  # SQLite caps bound parameters per statement
        for failure in db.exec(select(Failure).where(Failure.job_id.in_(ids[start:start + 500]))):
            detail = json.loads(failure.detail_json or "{}")
            run = int(detail.get("run", 1))
            if detail.get("final") and run >= found.get(failure.job_id, (0, ""))[0]:
                found[failure.job_id] = (run, failure.cause)
    return {job_id: cause for job_id, (_, cause) in found.items()}


def _mark_chain_run(db: Session, job: Job, cause: str) -> None:
    chain = db.get(Chain, job.chain_id) if job.chain_id is not None else None
    if chain is None or not chain.mlflow_run_id:
        return
    from mlflow.exceptions import MlflowException

    from idmctl.ops.failures.mlflow_status import mark_run_failed

    try:
        mark_run_failed(chain.mlflow_run_id, cause=cause, slurm_state=job.state)
    except MlflowException as exc:  # the record in our store matters more than the MLflow tag
        warn(f"warning: could not mark MLflow run {chain.mlflow_run_id}: {exc}")


def find_jobs(db: Session, job_ids: list[str]) -> list[Job]:
    """Jobs by Slurm id (``6054``) or store id (``#12``); a missing one is a UserError."""
    found: list[Job] = []
    for text in job_ids:
        if text.startswith("#") and text[1:].isdigit():
            job = db.get(Job, int(text[1:]))
            matches = [job] if job else []
        else:
            matches = list(db.exec(select(Job).where(Job.scheduler_id == text)))
        if not matches:
            raise UserError(f"no job {text} in the store", field="JOB",
                            hint="run `idmctl sync`, or `idmctl jobs import --since D` for jobs not submitted by idmctl")
        found += matches
    return found


def record_fix(db: Session, job_ids: list[str], note: str, commit: str | None = None) -> tuple[Fix, list[Job]]:
    """One Fix attached to the failures of every job given (6054/6108/6158 share one)."""
    if not note.strip():
        raise UserError("the fix note is empty", field="--note", hint='say what changed, e.g. --note "use core-own"')
    jobs = find_jobs(db, job_ids)
    not_failed = [job for job in jobs if not is_failed(job.state)]
    if not_failed:
        job = not_failed[0]
        raise UserError(f"job {job.scheduler_id} is {job.state}, not a failure", field="JOB",
                        hint="only jobs that did not complete take a fix")
    record_failures(db, jobs)
    fix = Fix(note=note.strip(), commit=commit)
    db.add(fix)
    db.flush()
    for job in jobs:
        for failure in db.exec(select(Failure).where(Failure.job_id == job.id)):
            failure.fix_id = fix.id
            db.add(failure)
    db.flush()
    return fix, jobs


def postmortem_rows(db: Session, experiment: str | None = None, since: datetime | None = None,
                    cause: str | None = None, newest: int | None = None, user: str | None = None) -> list[PostmortemRow]:
    """Every classified failure (or the ``newest`` N), oldest first, filtered by experiment, time, cause and
    the job's user."""
    if cause is not None:
        get_cause(cause)  # an unknown cause is bad input, not an empty table
    query = select(Failure, Job).where(Failure.job_id == Job.id)
    if experiment:
        query = query.where(Job.experiment == experiment)
    if cause:
        query = query.where(Failure.cause == cause)
    if user:
        query = query.where(Job.user == user)
    if newest:
        # Only the rows a table shows are loaded; the sort below restores oldest-first order.
        ended = func.coalesce(Job.ended_at, Job.submitted_at, Job.created_at)
        query = query.order_by(ended.desc(), Job.id.desc()).limit(newest)
    rows: list[PostmortemRow] = []
    fixes = {fix.id: fix for fix in db.exec(select(Fix))}
    for failure, job in db.exec(query):
        if not is_since(job.ended_at or job.submitted_at or job.created_at, since):
            continue
        rows.append(build_row(failure, job, fixes.get(failure.fix_id) if failure.fix_id else None))
    rows.sort(key=lambda row: (_naive_utc(row.ended_at) or datetime.min, row.job_pk, row.detail.get("run", 1)))
    return rows


def count_failures(db: Session, experiment: str | None = None, cause: str | None = None,
                   user: str | None = None) -> int:
    """How many failed runs are recorded (for "showing N of M")."""
    query = select(func.count(Failure.id)).where(Failure.job_id == Job.id)
    if experiment:
        query = query.where(Job.experiment == experiment)
    if cause:
        query = query.where(Failure.cause == cause)
    if user:
        query = query.where(Job.user == user)
    return int(db.exec(query).one())

"""The postmortem log: classify failed jobs into failures, record fixes, build card A's table.

Sync records each end with its failures (:func:`classify_end`, the store's ``ended``). ``idmctl failures``
classifies what is still pending first (:func:`classify_pending`: a job is (re)classified when it has no
failure yet or its record changed since; a fix already recorded stays attached), then reads the table,
all through the store's face.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ground.errors import UserError
from idmctl.core.job_state import JobState, is_failed
from idmctl.ops.failures.classify import Classification, classify, get_cause
from idmctl.ops.failures.progress import History, crash_loop, last_step, with_resume_events
from idmctl.ops.failures.rows import (PostmortemRow, _naive_utc, build_row, is_since, parse_since,  # noqa: F401 (re-exported)
                                  setting_of)
from idmctl.core.notice import warn
from idmctl.record.records import FailureRecord, FixRecord, JobRecord, NewFailure
from idmctl.record.store import JobStore, store
from idmctl.ops.failures.mlflow_status import mark_run_failed
from idmctl.ops.failures.logtail import LOG_TAIL_BYTES, read_log_tail  # noqa: F401 (re-exported: sync, importer)



def waited_seconds(job: JobRecord) -> float | None:
    """Seconds between submit and start (or end, for a job that never started)."""
    submitted = _naive_utc(job.submitted_at)
    until = _naive_utc(job.started_at or job.ended_at)
    if submitted is None or until is None:
        return None
    return max(0.0, (until - submitted).total_seconds())


def ran_seconds(job: JobRecord) -> float | None:
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


def failed_runs(job: JobRecord) -> list[FailedRun]:
    runs = job.runs
    found: list[FailedRun] = []
    for index, run in enumerate(runs[:-1], start=1):
        if is_failed(run["state"]) or JobState.of(run["state"]) is JobState.REQUEUED:
            started, ended = _parse_iso(run.get("started_at")), _parse_iso(run.get("ended_at"))
            ran = (ended - started).total_seconds() if started and ended else None
            found.append(FailedRun(index, False, run["state"], run.get("exit_code"), run.get("reason"),
                                   started is not None, ran))
    if is_failed(job.state_text):
        found.append(FailedRun(len(runs) if runs else job.restarts + 1, True, job.state_text, job.exit_code, job.reason,
                               job.started_at is not None, ran_seconds(job)))
    return found


def _parse_iso(text: str | None) -> datetime | None:
    return _naive_utc(datetime.fromisoformat(text)) if text else None


def classify_job(job: JobRecord, failed: FailedRun | None = None) -> Classification:
    """Classify one stored job (its current run, or an earlier ``failed`` run) from Slurm's record and the log."""
    if failed is not None and not failed.final:
        # An earlier run: its own Slurm record decides; the log tail belongs to the last run.
        return classify(failed.state, reason=failed.reason, exit_code=failed.exit_code, started=failed.started,
                        ran_seconds=failed.ran_seconds, restarts=failed.run - 1)
    log = read_log_tail(job.log_path) or job.log_tail or ""  # the file holds more than the stored tail
    found = classify(job.state_text, reason=job.reason, exit_code=job.exit_code,
                     derived_exit_code=job.derived_exit_code, log_tail=log,
                     waited_seconds=waited_seconds(job), restarts=job.restarts, started=job.started_at is not None,
                     ran_seconds=ran_seconds(job))
    step = last_step(log)
    if step is not None:  # where it failed: what "caught now by" is judged from (caught.py)
        found.detail["last_step"] = step
    return found


def classify_end(job: JobRecord, history: History) -> list[NewFailure]:
    """Every failed run of a job that ended, classified (the final run's crash loop judged from ``history``,
    its resume events appended): the failures its end is recorded with."""
    found: list[NewFailure] = []
    for run in failed_runs(job):
        classified = classify_job(job, run)
        if run.final:  # what resume noticed, and the chain's verdict on a loop, belong to the attempt's end
            classified = crash_loop(job, with_resume_events(classified, read_log_tail(job.log_path)), history)
        found.append(NewFailure(classified.cause, "\n".join(classified.evidence),
                                {**classified.detail, "run": run.run, "final": run.final}))
    return found


def store_history(records: JobStore, job: JobRecord) -> History:
    """The chain's attempts before ``job`` and their recorded causes, read from the store when asked."""
    def read() -> tuple[list[JobRecord], dict[int, str]]:
        earlier = records.attempts(job.chain_id, before=job.attempt) if job.chain_id is not None else []
        return earlier, recorded_causes(records.failures([other.id for other in earlier]))
    return read


def recorded_causes(failures: list[FailureRecord]) -> dict[int, str]:
    """Each job's recorded cause of how it ended: the failure of its final run (the latest run recorded
    as ``final``). A job with no such failure is absent: it has not been classified."""
    found: dict[int, tuple[int, str]] = {}
    for failure in failures:
        if failure.final and failure.run >= found.get(failure.job_id, (0, ""))[0]:
            found[failure.job_id] = (failure.run, failure.cause)
    return {job_id: cause for job_id, (_, cause) in found.items()}


def mark_ended_run(mlflow_run_id: str | None, cause: str, state: str) -> None:
    """Mark the chain's MLflow run FAILED/KILLED with the cause of the attempt that ended (a warning, never an
    error, when MLflow will not: the record in our store matters more than the MLflow tag)."""
    if not mlflow_run_id:
        return
    from mlflow.exceptions import MlflowException

    try:
        mark_run_failed(mlflow_run_id, cause=cause, slurm_state=state)
    except MlflowException as exc:
        warn(f"warning: could not mark MLflow run {mlflow_run_id}: {exc}")


def classify_pending(records: JobStore) -> list[FailureRecord]:
    """Classify every job whose failed runs are new or changed since they were last classified (each job's
    failures in one transaction, the chain's MLflow run marked by its final run); returns what was written."""
    return [failure for job in records.to_classify() for failure in _classify(records, job)]


def _classify(records: JobStore, job: JobRecord) -> list[FailureRecord]:
    found = classify_end(job, store_history(records, job))
    if not found:
        return []
    written = records.classified(job.id, found)
    final = next((failure for failure in found if failure.detail.get("final")), None)
    if final is not None and job.chain_id is not None:
        chain = records.chain(job.chain_id)
        mark_ended_run(chain.mlflow_run_id if chain else None, final.cause, job.state_text)
    return written


def find_jobs(records: JobStore, job_ids: list[str]) -> list[JobRecord]:
    """Jobs by Slurm id (``6054``) or store id (``#12``); a missing one is a UserError."""
    found: list[JobRecord] = []
    for text in job_ids:
        if text.startswith("#") and text[1:].isdigit():
            job = records.job(int(text[1:]))
            matches = [job] if job else []
        else:
            matches = records.with_scheduler_id(text)
        if not matches:
            raise UserError(f"no job {text} in the store", field="JOB",
                            hint="run `idmctl sync`, or `idmctl jobs import --since D` for jobs not submitted by idmctl")
        found += matches
    return found


def record_fix(records: JobStore, job_ids: list[str], note: str,
               commit: str | None = None) -> tuple[FixRecord, list[JobRecord]]:
    """One fix attached to the failures of every job given (6054/6108/6158 share one)."""
    if not note.strip():
        raise UserError("the fix note is empty", field="--note", hint='say what changed, e.g. --note "use core-own"')
    jobs = find_jobs(records, job_ids)
    not_failed = [job for job in jobs if not is_failed(job.state_text)]
    if not_failed:
        job = not_failed[0]
        raise UserError(f"job {job.scheduler_id} is {job.state_text}, not a failure", field="JOB",
                        hint="only jobs that did not complete take a fix")
    pending = {job.id for job in records.to_classify()}
    for job in jobs:
        if job.id in pending:
            _classify(records, job)
    return records.fixed([job.id for job in jobs], note.strip(), commit), jobs


def table(records: JobStore, experiment: str | None = None, since: datetime | None = None, cause: str | None = None,
          newest: int | None = None, user: str | None = None) -> tuple[list[PostmortemRow], int]:
    """Every classified failure (or the ``newest`` N), oldest first, filtered by experiment, time, cause and
    the job's user; and the count of failed runs (``--since`` aside): what ``idmctl failures`` shows."""
    if cause is not None:
        get_cause(cause)  # an unknown cause is bad input, not an empty table
    found, total = records.failure_table(experiment, cause, user, newest)
    rows = [build_row(failure, job, fix) for failure, job, fix in found
            if is_since(job.ended_at or job.submitted_at or job.created_at, since)]
    rows.sort(key=lambda row: (_naive_utc(row.ended_at) or datetime.min, row.job_pk, row.detail.get("run", 1)))
    return rows, total


def postmortem_rows(records: JobStore, experiment: str | None = None, since: datetime | None = None,
                    cause: str | None = None, newest: int | None = None, user: str | None = None) -> list[PostmortemRow]:
    """:func:`table`'s rows."""
    return table(records, experiment, since, cause, newest, user)[0]


def classify_and_read(experiment: str | None = None, since: datetime | None = None, cause: str | None = None,
                      newest: int | None = None, user: str | None = None) -> tuple[list[PostmortemRow], int]:
    """Classify any newly failed jobs, then read the table's rows and the count of failed runs: the
    ``failures`` report when the plain sqlite3 read had to step aside."""
    records = store()
    classify_pending(records)
    return table(records, experiment=experiment, since=since, cause=cause, newest=newest, user=user)


def record_fix_in_store(job_ids: list[str], note: str, commit: str | None = None) -> dict[str, Any]:
    """:func:`record_fix` on the configured store; returns what ``failures fix`` reports."""
    fix, covered = record_fix(store(), job_ids, note, commit)
    return {"fix_id": fix.id, "note": fix.note, "commit": fix.commit,
            "jobs": [job.scheduler_id or f"#{job.id}" for job in covered]}

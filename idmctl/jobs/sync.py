"""Bring every unfinished job's record up to date with one scheduler status call per executor.

Job.state, reason, exit_code, node_list and restarts are stored exactly as the scheduler reports
them (sacct's words, e.g. ``CANCELLED by 0``); the failure classifier builds on them. A job that
reaches a final state is handed to the retry policy, which may resubmit into the same chain.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlmodel import Session, select

from idmctl.executors import executor_for
from idmctl.executors.base import UNCONFIRMED, JobStatus, is_final
from idmctl.jobs.listing import aware as _aware, queue_wait_seconds  # noqa: F401  (re-exported; one home)
from idmctl.store.db import session
from idmctl.store.models import Chain, Job, NodeExclusion
from ground.contract import MLFLOW_RUN_ID_FILE

LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 8192


@dataclass
class SyncReport:
    checked: int = 0
    changed: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    resubmitted: list[tuple[int, int]] = field(default_factory=list)
    """(old job id, new job id)."""
    stopped: list[tuple[int, str]] = field(default_factory=list)
    """(job id, why the chain stopped)."""
    unconfirmed: list[int] = field(default_factory=list)
    """Jobs squeue shows ended that sacct has not recorded yet (asked again next sync)."""


def log_tail(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            data = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return "\n".join(data.splitlines()[-LOG_TAIL_LINES:])


def _apply(job: Job, status: JobStatus) -> bool:
    before = (job.state, job.reason, job.exit_code, job.started_at, job.ended_at, job.node_list, job.restarts)
    if not status.confirmed:
        _apply_live(job, status)
    else:
        job.state = status.state
        job.reason = status.reason
        # An exit code sacct once reported is kept when a later answer has none (a run that has not ended).
        job.exit_code = status.exit_code if status.exit_code is not None else job.exit_code
        if status.runs:
            # sacct is the record: the first run that reached a node is when the job started (queue wait =
            # first start − submit), and a job whose runs never reached one never started (5961: cancelled
            # while pending), whatever squeue guessed earlier.
            job.started_at = next((r.started_at for r in status.runs if r.started_at), None)
        else:
            job.started_at = status.started_at or job.started_at
        job.ended_at = status.ended_at
        job.node_list = status.node_list or job.node_list
        # Restarts only grow: an answer listing fewer runs than one before (records still on their way to
        # slurmdbd after an outage) must not undo a preemption already counted.
        job.restarts = max(job.restarts, status.restarts)
        if status.submitted_at:
            # The scheduler's clock, so queue wait = start − submit is on one clock. With -D this is the
            # first run's Submit: later runs' lines carry the requeue time (squeue's %V does too, which
            # is why a live status never sets it).
            job.submitted_at = status.submitted_at
        if status.runs:
            options = json.loads(job.options_json or "{}")
            # Every run of a requeued job as sacct -D lists it: where the preemptions show.
            options["runs"] = [{"state": r.state, "exit_code": r.exit_code, "reason": r.reason,
                                "started_at": r.started_at.isoformat() if r.started_at else None,
                                "ended_at": r.ended_at.isoformat() if r.ended_at else None,
                                "node_list": r.node_list, "steps": [list(step) for step in r.steps]}
                               for r in status.runs]
            job.options_json = json.dumps(options)
    job.log_tail = log_tail(job.log_path) or job.log_tail
    job.updated_at = datetime.now(timezone.utc)
    return before != (job.state, job.reason, job.exit_code, job.started_at, job.ended_at, job.node_list, job.restarts)


def _apply_live(job: Job, status: JobStatus) -> None:
    """A status from the live view (squeue) while sacct lags: it says whether the job runs, nothing
    more. An end it reports is only a claim until sacct records it: the job becomes UNCONFIRMED (not
    final), keeps its restarts, exit code and runs, and every sync asks again."""
    if is_final(status.state):
        job.state = UNCONFIRMED
        job.reason = f"squeue says {status.state}; waiting for sacct to record how it ended"
    else:
        job.state = status.state
        job.reason = status.reason
    job.started_at = job.started_at or status.started_at
    job.node_list = status.node_list or job.node_list


def _note_mlflow_run(db: object, job: Job) -> None:
    """The trainer writes ``RUN_DIR/mlflow_run_id`` (one MLflow run per chain); keep it on the chain."""
    run_dir = run_dir_of(job)
    chain = db.get(Chain, job.chain_id) if job.chain_id else None  # type: ignore[attr-defined]
    if run_dir is None or chain is None or chain.mlflow_run_id:
        return
    try:
        chain.mlflow_run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip() or None
    except OSError:
        return
    db.add(chain)  # type: ignore[attr-defined]


def unfinished_jobs() -> list[Job]:
    with session() as db:
        rows = db.exec(select(Job).where(Job.scheduler_id.is_not(None))).all()  # type: ignore[union-attr]
        return [job for job in rows if not is_final(job.state)]


def sync(retry: bool = True) -> SyncReport:
    """One status call per executor for all unfinished jobs, then retries for the ones that ended."""
    from idmctl.jobs.retry import decide_for_job
    from idmctl.jobs.submit import resubmit

    report = SyncReport()
    jobs = unfinished_jobs()
    by_executor: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        by_executor[job.executor].append(job)
    # Every executor answers before any row is written: when one does not (SchedulerUnreachable), the
    # store is left exactly as it was.
    answers = [(group, executor_for(name).status([job.scheduler_id for job in group if job.scheduler_id]))
               for name, group in by_executor.items()]
    ended: list[int] = []
    for group, statuses in answers:
        with session() as db:
            for job in group:
                status = statuses.get(job.scheduler_id or "")
                if status is None:
                    continue
                row = db.get(Job, job.id)
                assert row is not None
                report.checked += 1
                if _apply(row, status):
                    report.changed.append(row.id or 0)
                _exclude_nodes_that_failed(db, row, status)
                if is_final(row.state):
                    ended.append(row.id or 0)
                elif row.state == UNCONFIRMED:
                    report.unconfirmed.append(row.id or 0)
                db.add(row)
                _note_mlflow_run(db, row)
    report.finished = ended
    for job_id in ended:
        with session() as db:
            job = db.get(Job, job_id)
            chain = db.get(Chain, job.chain_id) if job and job.chain_id else None
            if job is None or chain is None or chain.status != "ACTIVE":
                continue
            decision = decide_for_job(db, job, chain, retry)  # the policy is taxonomy.yaml's `action`
            now = datetime.now(timezone.utc)
            for node in decision.exclude_nodes:
                db.add(NodeExclusion(node=node, until=now + (decision.exclude_for or timedelta(0)),
                                     reason=f"{decision.cause} under job {job.scheduler_id}"))
            if decision.action == "done":
                chain.status = "COMPLETED"
            elif decision.action == "stop":
                chain.status = "FAILED"
                report.stopped.append((job_id, f"{decision.cause}: {decision.why}"))
            db.add(chain)
        if decision.action == "retry":
            new_job = resubmit(job_id, decision.extra_env, reason=f"{decision.cause}: {decision.why}")
            report.resubmitted.append((job_id, new_job.id or 0))
    if ended:  # classify now: Failure rows with evidence, and the chain's MLflow run marked FAILED/KILLED
        from idmctl.failures.postmortem import record_failures

        with session() as db:
            record_failures(db, [job for job in (db.get(Job, job_id) for job_id in ended) if job is not None])
    return report


def _exclude_nodes_that_failed(db: Session, job: Job, status: JobStatus) -> None:
    """Slurm requeues a job whose node failed (``--requeue``): the job goes on, but the node is left out
    of later submissions all the same. Earlier runs that ended NODE_FAIL name the node."""
    failed_nodes = {run.node_list for run in status.runs[:-1] if run.state == "NODE_FAIL" and run.node_list}
    if not failed_nodes:
        return
    from idmctl.jobs.retry import node_exclusion_time

    reason = f"node_fail under job {job.scheduler_id}"
    known = {e.node for e in db.exec(select(NodeExclusion).where(NodeExclusion.reason == reason))}
    now = datetime.now(timezone.utc)
    for node in sorted(failed_nodes - known):
        db.add(NodeExclusion(node=node, until=now + node_exclusion_time("node_fail"), reason=reason))




def run_dir_of(job: Job) -> Path | None:
    return Path(job.script_path).parent if job.script_path else None

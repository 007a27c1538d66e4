"""Bring every unfinished job's record up to date with one scheduler status call per executor.

Job.state, reason, exit_code, node_list and restarts are stored exactly as the scheduler reports
them (sacct's words, e.g. ``CANCELLED by 0``); the failure classifier builds on them. A job that
reaches a final state goes the failure path in its natural order: classified once and its Failure rows
written in the same transaction as its final state, then the retry policy decides from those rows (the
chain's earlier attempts from theirs), then it may resubmit into the same chain.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ground import heartbeat
from ground import tracking as names
from ground.contract import CAUSE_HANG
from ground.mlflow_store import store_init_lock
from ground.paths import atomic_write_text, home, mlflow_tracking_uri
from ground.trainer_stats import attempt_totals
from ground.tracking_spool import flush_spool
from idmctl.core.notice import warn
from idmctl.ops.executors import executor_for
from idmctl.core.executor import UNCONFIRMED, JobStatus
from idmctl.core.job_state import JobState, is_terminal
from idmctl.ops.eval_jobs import follow as follow_evals
from idmctl.ops.failures.postmortem import read_log_tail, record_failures
from idmctl.ops.failures.progress import note_attempt_end
from idmctl.ops.notify import announce_decision
from idmctl.ops import retry as policy
from idmctl.plan.efficiency import EfficiencyReport, report as efficiency_report
from idmctl.ops.listing import aware as _aware, queue_wait_seconds  # noqa: F401  (re-exported; one home)
from idmctl.record.claims import claim_end
from idmctl.record.db import Session, session
from idmctl.record.stored_json import eval_link
from idmctl.record.exclusions import exclude_node, nodes_excluded_for
from idmctl.record.failures import failures_of
from idmctl.record.jobs import unfinished_jobs  # noqa: F401  (re-exported: `watch` asks sync for it)
from idmctl.record.url import shared_url, writer
from idmctl.record.models import Chain, Failure, Job
from idmctl.record.stored_json import job_options
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
    hung: list[int] = field(default_factory=list)
    """Running jobs whose heartbeat is silent past the hang threshold (classified ``hang`` now)."""
    unconfirmed: list[int] = field(default_factory=list)
    """Jobs squeue shows ended that sacct has not recorded yet (asked again next sync)."""
    evals: list[str] = field(default_factory=list)
    """What happened to eval jobs whose training attempt was resubmitted or whose chain ended early."""
    elsewhere: list[int] = field(default_factory=list)
    """Ended jobs another sync running at the same time recorded and decided (this one left them alone)."""


def log_tail(path: str | None) -> str | None:
    """The stored tail: the last LOG_TAIL_LINES lines of the log's last LOG_TAIL_BYTES (one bounded reader,
    idmctl/ops/failures/logtail.py: a 1 GB log or one 10 MB line reads 8 KB); None when there is none."""
    data = read_log_tail(path, LOG_TAIL_BYTES)
    return "\n".join(data.splitlines()[-LOG_TAIL_LINES:]) if data else None


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
            # Every run of a requeued job as sacct -D lists it: where the preemptions show.
            job.runs = [{"state": r.state, "exit_code": r.exit_code, "reason": r.reason,
                       "started_at": r.started_at.isoformat() if r.started_at else None,
                       "ended_at": r.ended_at.isoformat() if r.ended_at else None,
                       "node_list": r.node_list, "steps": [list(step) for step in r.steps],
                       **({"usage": r.usage, "step_usage": r.step_usage} if r.usage else {})}
                         for r in status.runs]
    job.log_tail = log_tail(job.log_path) or job.log_tail
    job.updated_at = datetime.now(timezone.utc)
    return before != (job.state, job.reason, job.exit_code, job.started_at, job.ended_at, job.node_list, job.restarts)


def _apply_live(job: Job, status: JobStatus) -> None:
    """A status from the live view (squeue) while sacct lags: it says whether the job runs, nothing
    more. An end it reports is only a claim until sacct records it: the job becomes UNCONFIRMED (not
    final), keeps its restarts, exit code and runs, and every sync asks again."""
    if is_terminal(status.state):
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


def sync(retry: bool = True, chain_id: int | None = None) -> SyncReport:
    """One status call per executor for all unfinished jobs (of chain ``chain_id`` only, when given: what a
    chain's controller job runs); the ones that ended are classified and recorded, then retried as their
    recorded cause says."""
    from idmctl.ops.submit import ResubmitRefused, resubmit  # start-up: the submit path, only once a job ended

    report = SyncReport()
    # In the team's store, each member's sync (and controller) looks after that member's jobs: a colleague's
    # run directory, log and spool are theirs to read, and their own syncs record them.
    jobs = unfinished_jobs(chain_id, user=writer()[0] if shared_url() else None)
    by_executor: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        by_executor[job.executor].append(job)
    # Every executor answers before any row is written: when one does not (SchedulerUnreachable), the
    # store is left exactly as it was.
    # Each id with the time the store saw it submitted: the scheduler matches the id by that time too (an
    # id reused after a controller reset is another job), and a job it does not list stays as it was.
    answers = [(group, executor_for(name).status([job.scheduler_id for job in group if job.scheduler_id],
                                                 {job.scheduler_id: job.submitted_at for job in group
                                                  if job.scheduler_id and job.submitted_at}))
               for name, group in by_executor.items()]
    # What a job that ended could not send to the tracking server goes there now (a later attempt would
    # too, but a chain's last attempt has none): records stay spooled while the server does not answer.
    _flush_tracking([job for group, statuses in answers for job in group
                     if (status := statuses.get(job.scheduler_id or "")) is not None and is_terminal(status.state)])
    ended: list[int] = []
    for group, statuses in answers:
        ended_rows: list[Job] = []
        with session() as db:
            for job in group:
                status = statuses.get(job.scheduler_id or "")
                if status is None:
                    continue
                row = db.get(Job, job.id)
                assert row is not None
                report.checked += 1
                if status.confirmed and is_terminal(status.state):
                    # Another sync (a controller, a person's `sync` or `watch`) may be at this very job:
                    # the one that claims its end records and decides it, once; this one leaves it.
                    if not claim_end(db, row.id or 0):
                        report.elsewhere.append(row.id or 0)
                        continue
                    db.refresh(row)
                if _apply(row, status):
                    report.changed.append(row.id or 0)
                _exclude_nodes_that_failed(db, row, status)
                # RUNNING, or ended by squeue's word while sacct lags (UNCONFIRMED): either way not classified yet.
                if row.state in (JobState.RUNNING, UNCONFIRMED) and _note_hang(db, row):
                    report.hung.append(row.id or 0)
                if is_terminal(row.state):
                    ended.append(row.id or 0)
                    ended_rows.append(row)
                    _record_efficiency(row)
                    note_attempt_end(row, read_log_tail(row.log_path))  # before classifying: the crash-loop rule reads it
                elif row.state == UNCONFIRMED:
                    report.unconfirmed.append(row.id or 0)
                db.add(row)
                _note_mlflow_run(db, row)
            # Classified once, here: Failure rows with evidence (and the chain's MLflow run marked
            # FAILED/KILLED) committed with the final state, so a sync that fails from here on leaves
            # nothing half-recorded and the decision below reads the record.
            record_failures(db, ended_rows)
    report.finished = ended
    for job_id in ended:
        with session() as db:
            job = db.get(Job, job_id)
            chain = db.get(Chain, job.chain_id) if job and job.chain_id else None
            if job is None or chain is None or chain.status != "ACTIVE":
                continue
            if eval_link(job) is not None:  # an eval job is never retried (eval_jobs.follow moves it)
                chain.status = "COMPLETED" if job.state == JobState.COMPLETED else "FAILED"
                db.add(chain)
                continue
            # From the Failure rows recorded above; the policy is taxonomy.yaml's `action`.
            decision = policy.decide_for_job(db, job, chain, retry)
            now = datetime.now(timezone.utc)
            for node in decision.exclude_nodes:
                exclude_node(db, node, now + (decision.exclude_for or timedelta(0)),
                             f"{decision.cause} under job {job.scheduler_id}")
            if decision.action == "done":
                chain.status = "COMPLETED"
            elif decision.action == "stop":
                chain.status = "FAILED"
                report.stopped.append((job_id, f"{decision.cause}: {decision.why}"))
            db.add(chain)
        if decision.action == "retry":
            try:
                new_job = resubmit(job_id, decision.extra_env, reason=f"{decision.cause}: {decision.why}",
                                   spends_retry=decision.spends_retry)
            except ResubmitRefused as exc:  # the chain is FAILED and the refused attempt recorded
                report.stopped.append((job_id, str(exc)))
            else:
                report.resubmitted.append((job_id, new_job.id or 0))
        announce_decision(job_id, decision, report)  # what was done, from the report: once per event
    if ended:
        _log_efficiency(ended)
    report.evals = follow_evals(report.resubmitted, report.finished)
    return report


PENDING_SPOOLS = "tracking_spools_pending"
"""In ``$IDMCTL_HOME``: run directories of ended jobs whose spool a sync could not send yet, one a line. An
ended job is not polled again, so this list is how a later sync knows to try them."""


def _flush_tracking(jobs: list[Job]) -> None:
    listed = home() / PENDING_SPOOLS
    try:
        earlier = [Path(line) for line in listed.read_text().splitlines() if line.strip()]
    except OSError:
        earlier = []
    todo = {str(run_dir): (job.id, run_dir) for job in jobs if (run_dir := run_dir_of(job)) is not None}
    for run_dir in earlier:
        todo.setdefault(str(run_dir), (None, run_dir))
    still: list[str] = []
    for key, (job_id, run_dir) in todo.items():
        if not run_dir.is_dir():
            continue
        result = flush_spool(run_dir)
        if result.error and result.pending:
            still.append(key)
            if job_id is not None:  # said once, when the job ends; the list keeps it for later syncs
                warn(f"warning: job {job_id}: {result.pending} tracking record(s) still spooled in "
                     f"{run_dir} (the tracking server: {result.error}); a later sync sends them")
    if still or earlier:
        atomic_write_text(listed, "".join(f"{line}\n" for line in still))


def _note_hang(db: Session, job: Job) -> bool:
    """Sync's own look at a running job's heartbeat, besides the watchdog inside the job: silent past
    max(k × s/step, floor) of the job's options, it is classified ``hang`` now — a Failure row for the
    current run, before the job's watchdog has dumped the stacks and killed it, so the record's latency is
    the threshold plus one sync interval. When the job ends the row is reclassified from its log (the
    watchdog's marker) and the retry policy acts then, as for any cause."""
    options = job_options(job.options_json, job.id)
    k, floor, run_dir = options.get("hang_k"), options.get("hang_floor_s"), run_dir_of(job)
    runs = job.runs or []
    # This run's start: a requeued job's earlier run left a beat that is older than it.
    started = datetime.fromisoformat(runs[-1]["started_at"]) if runs and runs[-1].get("started_at") else job.started_at
    if k is None or floor is None or run_dir is None or started is None:
        return False
    beat = heartbeat.read(run_dir)
    if beat is None or beat.at < _aware(started).timestamp():
        return False  # not armed: no beat from this run yet (a previous attempt's file is older)
    now = datetime.now(timezone.utc)
    silent, limit = now.timestamp() - beat.at, heartbeat.threshold_s(beat, float(k), float(floor))
    if silent <= limit:
        return False
    run = job.restarts + 1
    known = failures_of(db, [job.id or 0])
    if any(json.loads(f.detail_json or "{}").get("run", 1) == run for f in known):
        return False  # already recorded for this run
    last = datetime.fromtimestamp(beat.at, timezone.utc).isoformat(timespec="milliseconds")
    pace = f"{beat.s_per_step:.3f} s/step" if beat.s_per_step else "no step timed yet"
    evidence = [f"Slurm: State={job.state} on {job.node_list}",
                f"sync: no heartbeat for {silent:.1f} s since step {beat.step} at {last} > max({k:g} × {pace}, "
                f"{floor:g} s) = {limit:.1f} s; the job's watchdog dumps every rank's stacks and kills it"]
    detail = {"run": run, "final": False, "seen_by": "sync", "node": job.node_list, "step": str(beat.step),
              "last_beat": last, "silent_s": f"{silent:.1f}", "threshold_s": f"{limit:.1f}"}
    db.add(Failure(job_id=job.id or 0, cause=CAUSE_HANG, evidence="\n".join(evidence),
                   detail_json=json.dumps(detail, sort_keys=True), classified_at=now))
    return True


def _record_efficiency(job: Job) -> None:
    """The efficiency report of a job that just ended, kept on its row (its ``efficiency`` column)."""
    options = job_options(job.options_json, job.id)
    runs = job.runs or [{"state": job.state}]
    run_dir = run_dir_of(job)
    # An eval job shares the training run directory, whose trainer totals are the training attempts'.
    trainer = attempt_totals(run_dir, job.attempt) if run_dir is not None and eval_link(job) is None else None
    job.efficiency = efficiency_report(job.scheduler_id or f"#{job.id}", runs[-1], options, trainer).as_dict()


def _log_efficiency(job_ids: list[int]) -> None:
    """The reports onto each chain's MLflow run: metrics at step = attempt, the lines as a tag."""
    with session() as db:
        pairs = [(job, db.get(Chain, job.chain_id)) for job in (db.get(Job, i) for i in job_ids)
                 if job is not None and job.chain_id is not None]
        todo = [(job.attempt, chain.mlflow_run_id, job.efficiency)
                for job, chain in pairs if chain is not None and chain.mlflow_run_id
                and eval_link(job) is None]  # an eval job's run is the training chain's
    todo = [item for item in todo if item[2]]
    if not todo:
        return
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient  # heavy (~1.3 s): only when a job with a run ended

    with store_init_lock():
        client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    for attempt, run_id, data in todo:
        found = EfficiencyReport.from_dict(data)
        metrics = {names.M_JOB_CPU_EFF: found.cpu_eff, names.M_JOB_MEM_EFF: found.mem_eff,
                   names.M_JOB_TIME_FRAC: found.time_frac, names.M_JOB_PEAK_RSS: found.peak_rss_bytes}
        try:
            for key, value in metrics.items():
                if value is not None:
                    client.log_metric(run_id, key, float(value), step=attempt)
            text = "\n".join([*found.lines(), *(f"suggest {s.line()}" for s in found.suggestions)])
            client.set_tag(run_id, f"{names.TAG_EFFICIENCY}.attempt-{attempt}", text[:5000] or "no figures")
        except MlflowException as exc:  # the report on our row matters more than its copy in MLflow
            warn(f"warning: could not log the efficiency of attempt {attempt} to MLflow run {run_id}: {exc}")


def _exclude_nodes_that_failed(db: Session, job: Job, status: JobStatus) -> None:
    """Slurm requeues a job whose node failed (``--requeue``): the job goes on, but the node is left out
    of later submissions all the same. Earlier runs that ended NODE_FAIL name the node."""
    failed_nodes = {run.node_list for run in status.runs[:-1] if run.state == JobState.NODE_FAIL and run.node_list}
    if not failed_nodes:
        return
    reason = f"node_fail under job {job.scheduler_id}"
    known = nodes_excluded_for(db, reason)
    now = datetime.now(timezone.utc)
    for node in sorted(failed_nodes - known):
        exclude_node(db, node, now + policy.node_exclusion_time("node_fail"), reason)




def run_dir_of(job: Job) -> Path | None:
    return Path(job.script_path).parent if job.script_path else None

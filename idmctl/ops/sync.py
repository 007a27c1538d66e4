"""Bring every unfinished job's record up to date with one scheduler status call per executor.

A job's life, as sync walks it: the scheduler's **statuses** (every executor answers before anything is
written) → each job **observed** (its state, reason, exit code, node list and restarts stored exactly as
the scheduler reports them: sacct's words, e.g. ``CANCELLED by 0``) → a job that reached a final state is
**classified** → **ended** (its end claimed, its final state and its failures in one transaction of the
store) → the retry policy **decides** from the recorded failures (the chain's earlier attempts from
theirs) → **decided** (the chain closed, nodes excluded) → **resubmit** into the same chain.

Sync holds no session: it reads records from the store's face and writes through its named transitions
(``idmctl.record.store``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ground import heartbeat
from ground import tracking as names
from ground.contract import CAUSE_HANG, MLFLOW_RUN_ID_FILE
from ground.mlflow_store import store_init_lock
from ground.paths import atomic_write_text, home, mlflow_tracking_uri
from ground.trainer_stats import attempt_totals
from ground.tracking_spool import flush_spool
from idmctl.core.executor import JobStatus
from idmctl.core.job_state import JobState, is_terminal
from idmctl.core.notice import warn
from idmctl.ops import retry as policy
from idmctl.ops.eval_jobs import follow as follow_evals
from idmctl.ops.executors import executor_for
from idmctl.ops.failures.postmortem import classify_end, mark_ended_run, read_log_tail, store_history
from idmctl.ops.failures.progress import attempt_end
from idmctl.ops.listing import aware as _aware, queue_wait_seconds  # noqa: F401  (re-exported; one home)
from idmctl.ops.notify import announce_decision
from idmctl.plan.efficiency import EfficiencyReport, report as efficiency_report
from idmctl.record.jobs import unfinished_jobs  # noqa: F401  (re-exported: `watch` asks sync for it)
from idmctl.record.records import ChainStatus, JobRecord, NewFailure, NodeExclusionRecord
from idmctl.record.store import Decision as Decided, JobStore, Observation, store
from idmctl.record.url import shared_url, writer

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


def observe(job: JobRecord, status: JobStatus) -> Observation:
    """The job's record after the scheduler's status (nothing written): sacct's answer is the record, with
    the rules below; squeue's (``confirmed`` False) says only whether the job runs."""
    if not status.confirmed:
        return _observe_live(job, status)
    return Observation(
        state=_state(status.state), state_text=status.state, reason=status.reason,
        # An exit code sacct once reported is kept when a later answer has none (a run that has not ended).
        exit_code=status.exit_code if status.exit_code is not None else job.exit_code,
        # The scheduler's clock, so queue wait = start − submit is on one clock. With -D this is the first
        # run's Submit: later runs' lines carry the requeue time (squeue's %V does too, which is why a live
        # status never sets it).
        submitted_at=status.submitted_at or job.submitted_at,
        # sacct is the record: the first run that reached a node is when the job started (queue wait = first
        # start − submit), and a job whose runs never reached one never started (5961: cancelled while
        # pending), whatever squeue guessed earlier.
        started_at=(next((r.started_at for r in status.runs if r.started_at), None) if status.runs
                    else status.started_at or job.started_at),
        ended_at=status.ended_at, node_list=status.node_list or job.node_list,
        # Restarts only grow: an answer listing fewer runs than one before (records still on their way to
        # slurmdbd after an outage) must not undo a preemption already counted.
        restarts=max(job.restarts, status.restarts),
        # Every run of a requeued job as sacct -D lists it: where the preemptions show.
        runs=tuple({"state": r.state, "exit_code": r.exit_code, "reason": r.reason,
                    "started_at": r.started_at.isoformat() if r.started_at else None,
                    "ended_at": r.ended_at.isoformat() if r.ended_at else None,
                    "node_list": r.node_list, "steps": [list(step) for step in r.steps],
                    **({"usage": r.usage, "step_usage": r.step_usage} if r.usage else {})}
                   for r in status.runs) if status.runs else job.runs,
        log_tail=log_tail(job.log_path) or job.log_tail)


def _observe_live(job: JobRecord, status: JobStatus) -> Observation:
    """A status from the live view (squeue) while sacct lags: it says whether the job runs, nothing
    more. An end it reports is only a claim until sacct records it: the job becomes UNCONFIRMED (not
    final), keeps its restarts, exit code and runs, and every sync asks again."""
    if is_terminal(status.state):
        state, text = JobState.UNCONFIRMED, JobState.UNCONFIRMED.value
        reason: str | None = f"squeue says {status.state}; waiting for sacct to record how it ended"
    else:
        state, text, reason = _state(status.state), status.state, status.reason
    return Observation(state=state, state_text=text, reason=reason, exit_code=job.exit_code,
                       submitted_at=job.submitted_at, started_at=job.started_at or status.started_at,
                       ended_at=job.ended_at, node_list=status.node_list or job.node_list, restarts=job.restarts,
                       runs=job.runs, log_tail=log_tail(job.log_path) or job.log_tail)


def _state(text: str) -> JobState:
    state = JobState.stored(text)
    if state is None:  # the executors pass on only the states JobState knows (executors/slurm.py drops others)
        raise ValueError(f"the scheduler reported {text!r}, which is not a job state")
    return state


def changed(job: JobRecord, seen: Observation) -> bool:
    """Whether the status changed what ``sync --json`` reports as changed."""
    return ((job.state_text, job.reason, job.exit_code, job.started_at, job.ended_at, job.node_list, job.restarts)
            != (seen.state_text, seen.reason, seen.exit_code, seen.started_at, seen.ended_at, seen.node_list,
                seen.restarts))


def sync(retry: bool = True, chain_id: int | None = None) -> SyncReport:
    """One status call per executor for all unfinished jobs (of chain ``chain_id`` only, when given: what a
    chain's controller job runs); the ones that ended are classified and recorded, then retried as their
    recorded cause says."""
    records, report = store(), SyncReport()
    # In the team's store, each member's sync (and controller) looks after that member's jobs: a colleague's
    # run directory, log and spool are theirs to read, and their own syncs record them.
    answers = statuses(records.unfinished(chain_id, user=writer()[0] if shared_url() else None))
    # What a job that ended could not send to the tracking server goes there now (a later attempt would
    # too, but a chain's last attempt has none): records stay spooled while the server does not answer.
    _flush_tracking([job for job, status in answers if is_terminal(status.state)])
    for job, status in answers:
        report.checked += 1
        seen = observe(job, status)
        _note_mlflow_run(records, job)  # before an end marks the chain's run; kept once, whoever notes it
        if seen.state.is_terminal:
            if _end(records, job, seen) is None:  # another sync claimed the end: it records and decides it
                report.elsewhere.append(job.id)
                continue
            report.finished.append(job.id)
        else:
            now = records.observed(job.id, seen)
            if now.state in (JobState.RUNNING, JobState.UNCONFIRMED) and _note_hang(records, now):
                report.hung.append(job.id)  # RUNNING, or ended by squeue's word while sacct lags: not classified yet
            if now.state is JobState.UNCONFIRMED:
                report.unconfirmed.append(job.id)
        _exclude_nodes_that_failed(records, job, status)
        if changed(job, seen):
            report.changed.append(job.id)
    for job_id in report.finished:
        _decide(records, job_id, retry, report)
    if report.finished:
        _log_efficiency(records, report.finished)
    report.evals = follow_evals(report.resubmitted, report.finished)
    return report


def statuses(jobs: list[JobRecord]) -> list[tuple[JobRecord, JobStatus]]:
    """Each job the scheduler answered for, with its status: every executor answers before any record is
    written (one that does not raises SchedulerUnreachable, and the store stays exactly as it was). Each
    id goes with the time the store saw it submitted: the scheduler matches the id by that time too (an id
    reused after a controller reset is another job), and a job it does not list stays as it was."""
    by_executor: dict[str, list[JobRecord]] = {}
    for job in jobs:
        by_executor.setdefault(job.executor, []).append(job)
    answers = [(group, executor_for(name).status([job.scheduler_id for job in group if job.scheduler_id],
                                                 {job.scheduler_id: job.submitted_at for job in group
                                                  if job.scheduler_id and job.submitted_at}))
               for name, group in by_executor.items()]
    return [(job, status) for group, found in answers for job in group
            if (status := found.get(job.scheduler_id or "")) is not None]


def _end(records: JobStore, job: JobRecord, seen: Observation) -> JobRecord | None:
    """Classify the job's end and record it with its failures, its efficiency and its committed step in one
    transaction (a sync that fails from here on leaves nothing half-recorded, and the decision reads the
    record); then mark the chain's MLflow run FAILED/KILLED. None when another sync claimed the end."""
    log = read_log_tail(job.log_path)
    facts = {"committed_step": attempt_end(job.script_path, log)}  # before classifying: the crash-loop rule reads it
    ending = _ending(job, seen, facts)
    facts["efficiency"] = _efficiency(ending)
    failures = classify_end(ending, store_history(records, ending))
    ended = records.ended(job.id, seen, failures, {k: v for k, v in facts.items() if v is not None})
    final = next((failure for failure in failures if failure.detail.get("final")), None)
    if ended is not None and final is not None and ended.chain_id is not None:
        chain = records.chain(ended.chain_id)
        mark_ended_run(chain.mlflow_run_id if chain else None, final.cause, ended.state_text)
    return ended


def _ending(job: JobRecord, seen: Observation, facts: dict[str, object]) -> JobRecord:
    """The record as it will read once its end is written (what the classifier and the efficiency read)."""
    return replace(job, state=seen.state, state_text=seen.state_text, reason=seen.reason, exit_code=seen.exit_code,
                   submitted_at=seen.submitted_at, started_at=seen.started_at, ended_at=seen.ended_at,
                   node_list=seen.node_list, restarts=seen.restarts, runs=seen.runs, log_tail=seen.log_tail,
                   committed_step=facts.get("committed_step"))  # type: ignore[arg-type]


def _decide(records: JobStore, job_id: int, retry: bool, report: SyncReport) -> None:
    """Decide an ended job from its recorded failures, write the decision, resubmit, and say so."""
    from idmctl.ops.submit import ResubmitRefused, resubmit  # start-up: the submit path, only once a job ended

    job = records.job(job_id)
    chain = records.chain(job.chain_id) if job is not None and job.chain_id is not None else None
    if job is None or chain is None or chain.status is not ChainStatus.ACTIVE:
        return
    if job.eval_link is not None:  # an eval job is never retried (eval_jobs.follow moves it)
        records.decided(chain.id, Decided(close=ChainStatus.COMPLETED if job.state is JobState.COMPLETED
                                          else ChainStatus.FAILED))
        return
    decision = policy.decide_for_job(records, job, chain, retry)  # the policy is taxonomy.yaml's `action`
    until = datetime.now(timezone.utc) + (decision.exclude_for or timedelta(0))
    excluded = [NodeExclusionRecord(node, until, f"{decision.cause} under job {job.scheduler_id}")
                for node in decision.exclude_nodes]
    close = {"done": ChainStatus.COMPLETED, "stop": ChainStatus.FAILED}.get(decision.action)
    records.decided(chain.id, Decided(close=close, exclude=excluded))
    if decision.action == "stop":
        report.stopped.append((job_id, f"{decision.cause}: {decision.why}"))
    if decision.action == "retry":
        try:
            new_job = resubmit(job_id, decision.extra_env, reason=f"{decision.cause}: {decision.why}",
                               spends_retry=decision.spends_retry)
        except ResubmitRefused as exc:  # the chain is FAILED and the refused attempt recorded
            report.stopped.append((job_id, str(exc)))
        else:
            report.resubmitted.append((job_id, new_job.id or 0))
    announce_decision(job_id, decision, report)  # what was done, from the report: once per event


def _note_mlflow_run(records: JobStore, job: JobRecord) -> None:
    """The trainer writes ``RUN_DIR/mlflow_run_id`` (one MLflow run per chain); keep it on the chain."""
    run_dir = run_dir_of(job)
    if run_dir is None or job.chain_id is None:
        return
    chain = records.chain(job.chain_id)
    if chain is None or chain.mlflow_run_id:
        return
    try:
        run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    except OSError:
        return
    if run_id:
        records.note_chain_run(chain.id, run_id)


PENDING_SPOOLS = "tracking_spools_pending"
"""In ``$IDMCTL_HOME``: run directories of ended jobs whose spool a sync could not send yet, one a line. An
ended job is not polled again, so this list is how a later sync knows to try them."""


def _flush_tracking(jobs: list[JobRecord]) -> None:
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


def _note_hang(records: JobStore, job: JobRecord) -> bool:
    """Sync's own look at a running job's heartbeat, besides the watchdog inside the job: silent past
    max(k × s/step, floor) of the job's options, it is classified ``hang`` now — a failure for the current
    run, before the job's watchdog has dumped the stacks and killed it, so the record's latency is the
    threshold plus one sync interval. When the job ends the run is reclassified from its log (the
    watchdog's marker) and the retry policy acts then, as for any cause."""
    k, floor, run_dir = job.options.get("hang_k"), job.options.get("hang_floor_s"), run_dir_of(job)
    runs = job.runs
    # This run's start: a requeued job's earlier run left a beat that is older than it.
    started = (datetime.fromisoformat(str(runs[-1]["started_at"])) if runs and runs[-1].get("started_at")
               else job.started_at)
    if not isinstance(k, (int, float)) or not isinstance(floor, (int, float)) or run_dir is None or started is None:
        return False
    beat = heartbeat.read(run_dir)
    if beat is None or beat.at < _aware(started).timestamp():
        return False  # not armed: no beat from this run yet (a previous attempt's file is older)
    now = datetime.now(timezone.utc)
    silent, limit = now.timestamp() - beat.at, heartbeat.threshold_s(beat, float(k), float(floor))
    if silent <= limit:
        return False
    run = job.restarts + 1
    if any(failure.run == run for failure in records.failures([job.id])):
        return False  # already recorded for this run
    last = datetime.fromtimestamp(beat.at, timezone.utc).isoformat(timespec="milliseconds")
    pace = f"{beat.s_per_step:.3f} s/step" if beat.s_per_step else "no step timed yet"
    evidence = [f"Slurm: State={job.state_text} on {job.node_list}",
                f"sync: no heartbeat for {silent:.1f} s since step {beat.step} at {last} > max({k:g} × {pace}, "
                f"{floor:g} s) = {limit:.1f} s; the job's watchdog dumps every rank's stacks and kills it"]
    detail = {"run": run, "final": False, "seen_by": "sync", "node": job.node_list, "step": str(beat.step),
              "last_beat": last, "silent_s": f"{silent:.1f}", "threshold_s": f"{limit:.1f}"}
    records.record_failure(job.id, NewFailure(CAUSE_HANG, "\n".join(evidence), detail))
    return True


def _efficiency(job: JobRecord) -> dict[str, object]:
    """The efficiency report of a job that just ended (kept as its ``efficiency`` fact)."""
    runs = job.runs or ({"state": job.state_text},)
    run_dir = run_dir_of(job)
    # An eval job shares the training run directory, whose trainer totals are the training attempts'.
    trainer = attempt_totals(run_dir, job.attempt) if run_dir is not None and job.eval_link is None else None
    return efficiency_report(job.scheduler_id or f"#{job.id}", dict(runs[-1]), dict(job.options), trainer).as_dict()


def _log_efficiency(records: JobStore, job_ids: list[int]) -> None:
    """The reports onto each chain's MLflow run: metrics at step = attempt, the lines as a tag."""
    todo = []
    for job in (records.job(job_id) for job_id in job_ids):
        chain = records.chain(job.chain_id) if job is not None and job.chain_id is not None else None
        if job is not None and chain is not None and chain.mlflow_run_id and job.eval_link is None and job.efficiency:
            todo.append((job.attempt, chain.mlflow_run_id, dict(job.efficiency)))  # an eval job's run is the training chain's
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


def _exclude_nodes_that_failed(records: JobStore, job: JobRecord, status: JobStatus) -> None:
    """Slurm requeues a job whose node failed (``--requeue``): the job goes on, but the node is left out
    of later submissions all the same. Earlier runs that ended NODE_FAIL name the node."""
    failed_nodes = {run.node_list for run in status.runs[:-1] if run.state == JobState.NODE_FAIL and run.node_list}
    if not failed_nodes:
        return
    reason = f"node_fail under job {job.scheduler_id}"
    known = {exclusion.node for exclusion in records.exclusions(reason)}
    until = datetime.now(timezone.utc) + policy.node_exclusion_time("node_fail")
    records.exclude_nodes([NodeExclusionRecord(node, until, reason) for node in sorted(failed_nodes - known)])


def run_dir_of(job: JobRecord) -> Path | None:
    return Path(job.script_path).parent if job.script_path else None

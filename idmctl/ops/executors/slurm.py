"""Slurm through its command-line tools: ``sbatch --parsable``, one ``sacct -D`` call for many jobs,
``squeue`` only for jobs sacct has not recorded yet (it lags scontrol by ~1 s), ``scancel``.

Parses the ``--parsable2`` text, not JSON: 22.05's ``sacct --json`` misreports exit codes and its
``squeue --json`` ignores filters (both seen on the local 22.05.8 cluster).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ground.errors import CheckFailed, UserError
from idmctl.core.executor import JobStatus, RunRecord, SchedulerRefusal, SchedulerUnreachable, one_line
from idmctl.core.job_state import JobState, is_terminal
from idmctl.core.notice import warn
from idmctl.ops.executors.slurm_read import ReadNotes, known, parse_time, sacct_time, slurm_env

SACCT_FIELDS = ("JobID", "State", "ExitCode", "Reason", "Submit", "Start", "End", "NodeList")
USAGE_FIELDS = ("Elapsed", "TotalCPU", "AllocCPUS", "ReqMem", "MaxRSS", "Timelimit", "NTasks", "NNodes")
"""What the efficiency report reads, in the same call. MaxRSS lives on the steps
(``.batch``, ``.0``), not the allocation line: the call lists steps (no ``-X``)."""
IDS_PER_CALL = 5000
"""Job ids per sacct call: keeps the command line far below ARG_MAX (5000 × ~8 chars)."""
CALL_TIMEOUT_S = 120
"""Deadline of one Slurm call (seconds)."""
GONE_RECHECK_S = 5.0
"""Between the two squeue answers that must both miss a job before it counts as gone."""


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    if shutil.which(args[0]) is None:
        raise UserError(f"{args[0]} not found on PATH", field="scheduler",
                        hint="install Slurm's client tools, or use a cluster profile with scheduler: local")
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=CALL_TIMEOUT_S, env=slurm_env())
    except subprocess.TimeoutExpired as exc:  # the call's deadline: no answer is an outage, never a traceback
        daemon = "slurmdbd" if args[0] in ("sacct", "sacctmgr") else "slurmctld"
        raise SchedulerUnreachable(daemon, args[0], f"no answer within {CALL_TIMEOUT_S} s") from exc


SKEW = timedelta(minutes=10)
"""How far sacct's Submit may lie before the store's submit time of the same job (the login node's and
slurmctld's clocks, and the second sbatch took): a run submitted earlier than that is another job that
had the same id (ids restart after a controller reset with a fresh StateSaveLocation)."""
JOB_ID = re.compile(r"^\d+(?:_\d+|_\[[0-9,\-%]+\]|\+\d+)?$")
"""An allocation's id as sacct/squeue print it: ``123``, an array task ``123_4``, pending tasks
``123_[5-9]``, a heterogeneous component ``123+0``; a step adds ``.batch``/``.extern``/``.0``."""


def _runs_in_order(runs: list[tuple[datetime | None, RunRecord]]) -> list[RunRecord]:
    """Oldest run first by its Submit (a requeued run's Submit is its requeue time): sacct -X without -D
    printed the first run's PREEMPTED after the requeued run had completed (MFlowCode/MFC#1311), so the
    printed order is not trusted to say which run is current."""
    far = datetime.max.replace(tzinfo=timezone.utc)
    return [run for _, run in sorted(runs, key=lambda pair: pair[0] or far)]


def parse_sacct(text: str, not_before: dict[str, datetime] | None = None) -> dict[str, JobStatus]:
    """``sacct -n -P -D --format=JobID,State,ExitCode,Reason,Submit,Start,End,NodeList[,usage]`` → statuses.

    With ``-D`` a requeued job has one line per run; the latest (by Submit) is the current state and the
    number of earlier lines is the restart count. Step lines (``123.batch``, ``123.0``) follow their run's
    line and are kept on it. ``not_before`` (id → the store's submit time) drops runs of an older job that
    had the same id. A line that cannot be read is said once (command and field) and its job left out, so
    sync keeps it as it was.
    """
    notes = ReadNotes("sacct")
    runs: dict[str, list[tuple[datetime | None, RunRecord]]] = {}
    dropped: set[tuple[str, str]] = set()
    current: dict[str, RunRecord] = {}
    unreadable: set[str] = set()
    for line in text.split("\n"):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) not in (len(SACCT_FIELDS), len(SACCT_FIELDS) + len(USAGE_FIELDS)):
            notes.note("field count", line)
            if parts and JOB_ID.match(parts[0].split(".")[0]):
                unreadable.add(parts[0].split(".")[0])
            continue
        job_id, state, exit_code, reason, submit, start, end, nodes = parts[:len(SACCT_FIELDS)]
        usage = {k: v for k, v in zip(USAGE_FIELDS, parts[len(SACCT_FIELDS):]) if v}
        base_id = job_id.split(".")[0]
        if not JOB_ID.match(base_id):
            notes.note("JobID", job_id)
            continue
        if "." in job_id:  # a step (batch, extern, 0, 1...) of the job's run listed just before it
            run = current.get(base_id)
            if run is not None:
                run.steps.append((job_id, state, exit_code))
                if usage:
                    run.step_usage[job_id] = usage
            continue
        noted = notes.total
        submitted = parse_time(submit, notes, "Submit")
        floor = (not_before or {}).get(job_id)
        # Submit, or where a format has none, Start (never before Submit): earlier than ours is another job.
        earliest = submitted or parse_time(start)
        if floor is not None and earliest is not None and earliest < _aware(floor) - SKEW:
            dropped.add((job_id, submit))
            current.pop(job_id, None)
            continue
        if JobState.of(state) is None:
            notes.note("State", state)
        assigned = known(nodes) is not None
        # A job that never reached a node never started, whatever Start says: 22.05 prints Start = End
        # for one cancelled while pending, newer releases Unknown or None.
        run = RunRecord(state=state, exit_code=known(exit_code), reason=known(reason),
                        started_at=parse_time(start, notes, "Start") if assigned else None,
                        ended_at=parse_time(end, notes, "End"), node_list=nodes if assigned else None, usage=usage)
        if notes.total > noted:
            unreadable.add(job_id)  # a state or time idmctl cannot read: the job stays as it was
        current[job_id] = run
        runs.setdefault(job_id, []).append((submitted, run))
    statuses: dict[str, JobStatus] = {}
    for job_id, pairs in runs.items():
        if job_id in unreadable:
            continue  # kept as it was: a state idmctl cannot read is not a state to record
        ordered = _runs_in_order(pairs)
        first_submit = min((s for s, _ in pairs if s is not None), default=None)
        status = statuses[job_id] = JobStatus(scheduler_id=job_id, state=ordered[-1].state,
                                              submitted_at=first_submit, runs=ordered)
        _settle(status)
    notes.say()
    return statuses


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _settle(status: JobStatus) -> None:
    """The job's own fields from its current (last) run."""
    current = status.runs[-1]
    status.state = current.state
    status.exit_code = current.exit_code
    status.reason = current.reason
    oom_step = next((step for step in current.steps if step[1] == JobState.OUT_OF_MEMORY), None)
    if current.state == JobState.FAILED and oom_step is not None:
        # Slurm 22.05 marks the allocation FAILED with the batch shell's exit when an srun step is
        # OOM-killed; the step's own record (OUT_OF_MEMORY 0:125) is the cause, so it is what we keep.
        status.state, status.exit_code = JobState.OUT_OF_MEMORY.value, oom_step[2]
        status.reason = f"OutOfMemory in step {oom_step[0]}"
    status.started_at = current.started_at
    status.ended_at = current.ended_at
    status.node_list = current.node_list or next((r.node_list for r in reversed(status.runs) if r.node_list), None)
    status.restarts = len(status.runs) - 1


SQUEUE_FORMAT = "%i|%T|%r|%V|%S|%e|%N"


def parse_squeue(text: str) -> dict[str, JobStatus]:
    notes = ReadNotes("squeue")
    statuses: dict[str, JobStatus] = {}
    for line in text.split("\n"):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 7:
            notes.note("field count", line)
            continue
        job_id, state, reason, submit, start, end, nodes = parts
        if JobState.of(state) is None:
            notes.note("State", state)
            continue
        started = parse_time(start, notes, "StartTime") if state != JobState.PENDING and known(nodes) else None
        statuses[job_id] = JobStatus(
            scheduler_id=job_id, state=state, reason=known(reason),
            submitted_at=parse_time(submit, notes, "SubmitTime"), started_at=started,
            ended_at=parse_time(end, notes, "EndTime") if state not in (JobState.PENDING, JobState.RUNNING) else None,
            node_list=known(nodes), confirmed=False,
        )
    notes.say()
    return statuses


def _refused_field(result: subprocess.CompletedProcess[str]) -> str | None:
    """The field a release refused: ``sacct: error: Invalid field requested: "Restarts"``."""
    match = re.search(r'Invalid field requested:\s*"?([A-Za-z]+)', result.stderr or "")
    return match.group(1) if match else None


def _last_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {result.returncode}"


def check_controller() -> None:
    """Raise SchedulerUnreachable unless ``scontrol ping`` says slurmctld is UP."""
    result = _run(["scontrol", "ping"])
    if result.returncode != 0 or " is UP" not in result.stdout:
        first = result.stdout.strip().splitlines()[0] if result.stdout.strip() else _last_error(result)
        raise SchedulerUnreachable("slurmctld", "scontrol ping", first)


class SlurmExecutor:
    name = "slurm"

    def submit(self, script_path: Path, log_path: str) -> str:
        result = _run(["sbatch", "--parsable", str(script_path)])
        if result.returncode != 0:
            message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"sbatch exit {result.returncode}"
            raise CheckFailed(f"sbatch refused the job: {message}")
        # "<jobid>" or "<jobid>;<cluster>" on federated setups.
        return result.stdout.strip().split(";")[0]

    def test_only(self, script_path: Path) -> str:
        # slurmctld's will-run answer: QoS grants, associations, partitions and node configurations as
        # the cluster has them now, which a cluster profile can only mirror. Nothing is queued.
        result = _run(["sbatch", "--test-only", str(script_path)])
        text = one_line(result.stderr + "\n" + result.stdout)
        if result.returncode != 0:
            raise SchedulerRefusal("sbatch --test-only", text or f"exit {result.returncode}")
        return text

    def status(self, scheduler_ids: list[str], submitted: dict[str, datetime] | None = None) -> dict[str, JobStatus]:
        """sacct for every id, squeue for those sacct has not recorded yet. Raises SchedulerUnreachable
        when slurmdbd (sacct) or slurmctld (squeue, confirmed by ``scontrol ping``) does not answer:
        a sync from half the picture lowered restart counts and cleared exit codes.

        ``submitted`` (id → when the store saw it submitted) matches an id by its submit time too: sacct
        answers ``-j`` from the start of its records, so after a controller reset restarted the ids it
        also lists the older job that had the id. It also opens each call's window (``-S``, in the
        cluster's local time) at the oldest of those times, less :data:`SKEW`."""
        ids = [i for i in dict.fromkeys(scheduler_ids) if JOB_ID.match(i)]
        submitted = {k: v for k, v in (submitted or {}).items() if v is not None}
        statuses: dict[str, JobStatus] = {}
        for start in range(0, len(ids), IDS_PER_CALL):
            chunk = ids[start:start + IDS_PER_CALL]
            window = []
            if chunk and all(i in submitted for i in chunk):
                window = ["-S", sacct_time(min(_aware(submitted[i]) for i in chunk) - SKEW)]
            result = _run(["sacct", "-n", "-P", "-D", *window, "-j", ",".join(chunk),
                           f"--format={','.join(SACCT_FIELDS + USAGE_FIELDS)}"])
            if result.returncode != 0 and _refused_field(result) in USAGE_FIELDS:
                # A release that does not know a usage field (sacct: "Invalid field requested"): the states
                # matter more than the efficiency figures; ask again without the usage, said once.
                warn(f"warning: sacct refused the field {_refused_field(result)}: {_last_error(result)}; "
                     "reading states without the usage fields")
                result = _run(["sacct", "-n", "-P", "-D", *window, "-j", ",".join(chunk),
                               f"--format={','.join(SACCT_FIELDS)}"])
            if result.returncode != 0:
                if _refused_field(result):
                    raise CheckFailed(f"sacct refused the field {_refused_field(result)}: {_last_error(result)}")
                # sacct talks to slurmdbd only ("Problem talking to the database: Connection refused").
                raise SchedulerUnreachable("slurmdbd", "sacct", _last_error(result))
            statuses.update(parse_sacct(result.stdout, submitted))
        self._hold_back_preempted(statuses)
        lagging = [i for i in ids if i not in statuses]
        if lagging:
            result = _run(["squeue", "-h", "-t", "all", "-j", ",".join(lagging), "-o", SQUEUE_FORMAT])
            if result.returncode != 0:
                # squeue also exits 1 when no id is known any more (Slurm 22.05): only a failed ping
                # means the controller is away.
                check_controller()
            # squeue knows no exit code of steps, no earlier runs and no start of a job that never ran:
            # its statuses are unconfirmed, and sync never finalises a job from one. An id it does not
            # list is simply left out: the job stays as it was (an empty answer is never "gone").
            statuses.update({k: v for k, v in parse_squeue(result.stdout).items() if k in lagging})
        elif ids:
            check_controller()  # sacct answers from the database even while the controller is down
        return statuses

    @staticmethod
    def _hold_back_preempted(statuses: dict[str, JobStatus]) -> None:
        """sacct says PREEMPTED as soon as a preemption starts, also on a cluster that cancels; the job
        script may still checkpoint and requeue itself (it did on the local cluster with the QoS set to
        cancel). Until squeue no longer shows the job live, it is not over: sync would otherwise resubmit
        a chain whose job comes back by itself, and two attempts would train into one run directory.

        "No longer shows" takes two answers :data:`GONE_RECHECK_S` apart that both say so: one transient
        empty or failed squeue (a controller restarting, an RPC timeout) would otherwise end a job that
        is still queued and orphan its allocation. A job not twice seen gone stays unconfirmed."""
        preempted = [i for i, status in statuses.items() if JobState.of(status.state) is JobState.PREEMPTED]
        if not preempted:
            return
        gone = set(preempted)
        for read in range(2):
            if read:
                time.sleep(GONE_RECHECK_S)
            result = _run(["squeue", "-h", "-t", "all", "-j", ",".join(sorted(gone)), "-o", SQUEUE_FORMAT])
            answered = result.returncode == 0 or "Invalid job id" in result.stderr
            live = parse_squeue(result.stdout) if answered else {}
            for job_id, status in live.items():
                if job_id in statuses and not is_terminal(status.state):
                    statuses[job_id].state, statuses[job_id].ended_at = status.state, None
            gone -= {i for i, status in live.items() if not is_terminal(status.state)}
            if not answered:
                # No answer is no evidence: the job stays as it was until squeue answers twice.
                for job_id in gone:
                    statuses[job_id].confirmed = False
                    statuses[job_id].state = JobState.PREEMPTED.value
                return
            if not gone:
                return

    def cancel(self, scheduler_id: str) -> None:
        # scancel exits 0 and says nothing on an unknown id (Slurm 22.05); -v makes it say so on stderr.
        result = _run(["scancel", "-v", scheduler_id])
        if result.returncode != 0 or "Invalid job id" in result.stderr:
            raise CheckFailed(f"scancel {scheduler_id}: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'failed'}")

"""Slurm through its command-line tools: ``sbatch --parsable``, one ``sacct -D`` call for many jobs,
``squeue`` only for jobs sacct has not recorded yet (it lags scontrol by ~1 s), ``scancel``.

Parses the ``--parsable2`` text, not JSON: 22.05's ``sacct --json`` misreports exit codes and its
``squeue --json`` ignores filters (both seen on the local 22.05.8 cluster).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from ground.errors import CheckFailed, UserError
from idmctl.core.executor import JobStatus, RunRecord, SchedulerRefusal, SchedulerUnreachable, one_line
from idmctl.core.job_state import JobState, is_terminal

SACCT_FIELDS = ("JobID", "State", "ExitCode", "Reason", "Submit", "Start", "End", "NodeList")
USAGE_FIELDS = ("Elapsed", "TotalCPU", "AllocCPUS", "ReqMem", "MaxRSS", "Timelimit", "NTasks", "NNodes")
"""What the efficiency report reads, in the same call. MaxRSS lives on the steps
(``.batch``, ``.0``), not the allocation line: the call lists steps (no ``-X``)."""
IDS_PER_CALL = 5000
"""Job ids per sacct call: keeps the command line far below ARG_MAX (5000 × ~8 chars)."""
CALL_TIMEOUT_S = 120


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    if shutil.which(args[0]) is None:
        raise UserError(f"{args[0]} not found on PATH", field="scheduler",
                        hint="install Slurm's client tools, or use a cluster profile with scheduler: local")
    return subprocess.run(args, capture_output=True, text=True, timeout=CALL_TIMEOUT_S, env=os.environ.copy())


def parse_time(text: str) -> datetime | None:
    """sacct/squeue print local time without a zone; 'Unknown', 'None' and 'N/A' mean not yet."""
    text = text.strip()
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc)
    except ValueError:
        return None


def parse_sacct(text: str) -> dict[str, JobStatus]:
    """``sacct -n -P -D --format=JobID,State,ExitCode,Reason,Submit,Start,End,NodeList`` → statuses.

    With ``-D`` a requeued job has one line per run, oldest first; the last one is the current state
    and the number of earlier lines is the restart count. Step lines (``123.batch``, ``123.0``) follow
    their run's line and are kept on it.
    """
    statuses: dict[str, JobStatus] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) not in (len(SACCT_FIELDS), len(SACCT_FIELDS) + len(USAGE_FIELDS)):
            continue
        job_id, state, exit_code, reason, submit, start, end, nodes = parts[:len(SACCT_FIELDS)]
        usage = {k: v for k, v in zip(USAGE_FIELDS, parts[len(SACCT_FIELDS):]) if v}
        if "." in job_id:  # a step (batch, extern, 0, 1...) of the job's latest run listed so far
            base = statuses.get(job_id.split(".")[0])
            if base is not None and base.runs:
                base.runs[-1].steps.append((job_id, state, exit_code))
                if usage:
                    base.runs[-1].step_usage[job_id] = usage
            continue
        assigned = nodes not in ("", "None assigned")
        # A job cancelled while pending gets Start = End from sacct but no node: it never started.
        run = RunRecord(state=state, exit_code=exit_code or None, reason=reason or None,
                        started_at=parse_time(start) if assigned else None, ended_at=parse_time(end),
                        node_list=nodes if assigned else None, usage=usage)
        status = statuses.get(job_id)
        if status is None:
            status = statuses[job_id] = JobStatus(scheduler_id=job_id, state=state, submitted_at=parse_time(submit))
        status.runs.append(run)
    for status in statuses.values():
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
    return statuses


SQUEUE_FORMAT = "%i|%T|%r|%V|%S|%e|%N"


def parse_squeue(text: str) -> dict[str, JobStatus]:
    statuses: dict[str, JobStatus] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 7:
            continue
        job_id, state, reason, submit, start, end, nodes = parts
        started = parse_time(start) if state != JobState.PENDING and nodes else None
        statuses[job_id] = JobStatus(
            scheduler_id=job_id, state=state, reason=reason if reason not in ("None", "") else None,
            submitted_at=parse_time(submit), started_at=started,
            ended_at=parse_time(end) if state not in (JobState.PENDING, JobState.RUNNING) else None,
            node_list=nodes or None, confirmed=False,
        )
    return statuses


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

    def status(self, scheduler_ids: list[str]) -> dict[str, JobStatus]:
        """sacct for every id, squeue for those sacct has not recorded yet. Raises SchedulerUnreachable
        when slurmdbd (sacct) or slurmctld (squeue, confirmed by ``scontrol ping``) does not answer:
        a sync from half the picture lowered restart counts and cleared exit codes."""
        ids = [i for i in dict.fromkeys(scheduler_ids) if i.isdigit()]
        statuses: dict[str, JobStatus] = {}
        for start in range(0, len(ids), IDS_PER_CALL):
            chunk = ids[start:start + IDS_PER_CALL]
            result = _run(["sacct", "-n", "-P", "-D", "-j", ",".join(chunk),
                           f"--format={','.join(SACCT_FIELDS + USAGE_FIELDS)}"])
            if result.returncode != 0:
                # sacct talks to slurmdbd only ("Problem talking to the database: Connection refused").
                raise SchedulerUnreachable("slurmdbd", "sacct", _last_error(result))
            statuses.update(parse_sacct(result.stdout))
        self._hold_back_preempted(statuses)
        lagging = [i for i in ids if i not in statuses]
        if lagging:
            result = _run(["squeue", "-h", "-t", "all", "-j", ",".join(lagging), "-o", SQUEUE_FORMAT])
            if result.returncode != 0:
                # squeue also exits 1 when no id is known any more (Slurm 22.05): only a failed ping
                # means the controller is away.
                check_controller()
            # squeue knows no exit code of steps, no earlier runs and no start of a job that never ran:
            # its statuses are unconfirmed, and sync never finalises a job from one.
            statuses.update({k: v for k, v in parse_squeue(result.stdout).items() if k in lagging})
        elif ids:
            check_controller()  # sacct answers from the database even while the controller is down
        return statuses

    @staticmethod
    def _hold_back_preempted(statuses: dict[str, JobStatus]) -> None:
        """sacct says PREEMPTED as soon as a preemption starts, also on a cluster that cancels; the job
        script may still checkpoint and requeue itself (it did on the local cluster with the QoS set to
        cancel). Until squeue no longer shows the job live, it is not over: sync would otherwise resubmit
        a chain whose job comes back by itself, and two attempts would train into one run directory."""
        preempted = [i for i, status in statuses.items() if JobState.of(status.state) is JobState.PREEMPTED]
        if not preempted:
            return
        result = _run(["squeue", "-h", "-t", "all", "-j", ",".join(preempted), "-o", SQUEUE_FORMAT])
        for job_id, live in parse_squeue(result.stdout).items():
            if job_id in statuses and not is_terminal(live.state):
                statuses[job_id].state, statuses[job_id].ended_at = live.state, None

    def cancel(self, scheduler_id: str) -> None:
        # scancel exits 0 and says nothing on an unknown id (Slurm 22.05); -v makes it say so on stderr.
        result = _run(["scancel", "-v", scheduler_id])
        if result.returncode != 0 or "Invalid job id" in result.stderr:
            raise CheckFailed(f"scancel {scheduler_id}: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'failed'}")

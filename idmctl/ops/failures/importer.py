"""``idmctl jobs import``: pull a team's past jobs from sacct so failures submitted without idmctl
enter the postmortem log (as imported job records, classified like any other)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ground.errors import CheckFailed, UserError
from idmctl.core.job_state import JobState, is_terminal
from idmctl.ops.executors.slurm_read import (CallDeadline, ReadNotes, TooManyRecords, known, parse_time, run_bounded,
                                             sacct_time, slurm_env)
from idmctl.ops.failures.postmortem import classify_end, read_log_tail
from idmctl.record.store import ImportedJob, store

IMPORT_FIELDS = ("JobID", "State", "ExitCode", "DerivedExitCode", "Reason", "Submit", "Start", "End", "NodeList",
                 "QOS", "AllocTRES", "WorkDir", "User", "JobName")
"""JobName last and a unit-separator delimiter: a ``|`` in a job name cannot shift the columns."""
DELIMITER = "\x1f"
_GPUS = re.compile(r"gres/gpu=(\d+)")


@dataclass
class SacctJob:
    scheduler_id: str
    name: str
    state: str
    exit_code: str | None
    derived_exit_code: str | None
    reason: str | None
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    node_list: str | None
    qos: str | None
    gpus: int | None
    work_dir: str | None
    user: str | None = None
    """Who submitted it (sacct's User): in the team's shared store, ``--user`` finds imported jobs too."""
    restarts: int = 0
    run_keys: list[str] | None = None
    """Each run's Submit as printed (a requeued run's is its requeue time): the same run listed by two
    windows is counted once."""


WINDOW = timedelta(days=7)
"""First window of a windowed import; halved while a window holds more than MAX_LINES_PER_CALL lines or
misses the deadline, doubled (up to MAX_WINDOW) while it holds under a quarter of them."""
MAX_WINDOW = timedelta(days=31)
MIN_WINDOW = timedelta(minutes=1)
MAX_LINES_PER_CALL = 20_000
"""Records read from one sacct call at most (~4 MB of lines at ~200 bytes): memory stays bounded
whatever the history's size."""
STORE_BATCH = 1_000
"""Jobs stored and classified per transaction."""
CALL_DEADLINE_S = 120.0
"""One sacct call's deadline (seconds): a slow slurmdbd gives a smaller window, not a hung import."""


def history_args(start: datetime, end: datetime | None) -> list[str]:
    """sacct's arguments for one window: allocations and every requeued run (``-X -D``) of all users, ``-S``/
    ``-E`` in the cluster's local time (sacct reads them so), JobName last after a unit separator."""
    window = ["-S", sacct_time(start)] + (["-E", sacct_time(end)] if end is not None else [])
    return ["sacct", "-n", "-P", "-X", "-D", "-a", *window,
            f"--delimiter={DELIMITER}", f"--format={','.join(IMPORT_FIELDS)}"]


def sacct_history(since: datetime, until: datetime | None = None) -> str:
    """Every allocation (and every requeued run, ``-D``) between ``since`` and ``until``, in one call."""
    try:
        return run_bounded(history_args(since, until), MAX_LINES_PER_CALL, CALL_DEADLINE_S)
    except FileNotFoundError as exc:
        raise UserError("sacct not found on PATH", field="scheduler", hint="run this on a Slurm login node") from exc
    except subprocess.CalledProcessError as exc:
        raise CheckFailed(f"sacct failed (exit {exc.returncode}): {(exc.stderr or '').strip()}") from exc


def history_windows(since: datetime, until: datetime | None = None) -> Iterator[tuple[str, datetime]]:
    """sacct's answers from ``since`` to ``until`` (now), one bounded call per time window, oldest first:
    a window that prints more than MAX_LINES_PER_CALL lines or runs past CALL_DEADLINE_S is asked again
    at half the length; one that prints little, the next window is twice as long."""
    end_all = until or datetime.now(timezone.utc)
    start = since if since.tzinfo else since.replace(tzinfo=timezone.utc)
    end_all = end_all if end_all.tzinfo else end_all.replace(tzinfo=timezone.utc)
    window = WINDOW
    while start < end_all:
        end = min(start + window, end_all)
        try:
            text = sacct_history(start, end)
        except (TooManyRecords, CallDeadline) as exc:
            if window <= MIN_WINDOW:
                raise CheckFailed(f"sacct: a {window} window from {sacct_time(start)} still {exc}; "
                                  "the cluster's accounting is too busy for a bounded import") from exc
            window = max(MIN_WINDOW, window / 2)
            continue
        yield text, end
        start = end
        if text.count("\n") < MAX_LINES_PER_CALL // 4:
            window = min(MAX_WINDOW, window * 2)


def gpus_counted() -> bool | None:
    """Whether the cluster counts GPUs in AllocTRES (``AccountingStorageTRES`` has ``gres/gpu``): then a job
    whose AllocTRES shows none had none. None where ``scontrol show config`` cannot say."""
    try:
        result = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                                timeout=CALL_DEADLINE_S, env=slurm_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"^AccountingStorageTRES\s*=\s*(\S*)", result.stdout, re.M) if result.returncode == 0 else None
    return None if match is None else "gres/gpu" in match.group(1)


def parse_history(text: str, counted: bool | None = None) -> list[SacctJob]:
    """sacct lines → one record per job; a requeued job's earlier runs become its restart count.

    Read the way Slurm means them: a job that never reached a node has no start (whatever Start says);
    ``None`` is no reason; a GPU count missing from AllocTRES is unknown unless the cluster counts GPUs
    there (``counted``: :func:`gpus_counted`; not known, then unless this answer shows one). JobName is last, so a newline in a name continues the record on
    the next line (a line without a delimiter); a line with some but too few fields is truncated and
    said once. Array tasks (``123_4``, ``123_[5-9]``) and heterogeneous components (``123+0``) are
    records of their own."""
    notes = ReadNotes("sacct")
    rows: list[list[str]] = []
    for line in text.split("\n"):
        if not line:
            continue
        parts = line.split(DELIMITER)
        if len(parts) == 1 and rows and len(rows[-1]) == len(IMPORT_FIELDS):
            rows[-1][-1] += "\n" + line  # a newline inside the last field, JobName
        elif len(parts) >= len(IMPORT_FIELDS):
            # JobName last: anything past the fields is the name's own (a delimiter cannot be typed there,
            # but a release adding a column would land here too; the name keeps it, nothing shifts).
            rows.append(parts[:len(IMPORT_FIELDS) - 1] + [DELIMITER.join(parts[len(IMPORT_FIELDS) - 1:])])
        else:
            notes.note("field count", line)
    gpu_tracked = counted if counted is not None else any("gres/gpu" in row[IMPORT_FIELDS.index("AllocTRES")]
                                                          for row in rows)
    jobs: dict[str, SacctJob] = {}
    for row in rows:
        job_id, state, exit_code, derived, reason, submit, start, end, nodes, qos, tres, work_dir, user, name = row
        noted = notes.total
        if JobState.of(state) is None:
            notes.note("State", state)
        gpus = _GPUS.search(tres)
        assigned = known(nodes) is not None
        record = SacctJob(scheduler_id=job_id, name=name, state=state, exit_code=known(exit_code),
                          derived_exit_code=known(derived), reason=known(reason),
                          submitted_at=parse_time(submit, notes, "Submit"),
                          started_at=parse_time(start, notes, "Start") if assigned else None,
                          ended_at=parse_time(end, notes, "End"), node_list=nodes if assigned else None,
                          qos=known(qos), gpus=int(gpus.group(1)) if gpus else (0 if gpu_tracked and tres else None),
                          work_dir=known(work_dir), user=known(user))
        if notes.total > noted:
            continue  # a state or time idmctl cannot read: not imported now (a later import may)
        record.run_keys = [submit]
        earlier = jobs.get(job_id)
        if earlier is not None:
            record = merged(earlier, record, one_answer=True)
        jobs[job_id] = record
    notes.say()
    return list(jobs.values())


def merged(earlier: SacctJob, later: SacctJob, one_answer: bool = False) -> SacctJob:
    """One job's record from two of its lines (``-D``: each line a run, ``one_answer``) or from two windows
    (the run going at the first window's end is listed by both: runs are told apart by their Submit):
    the later run's state, the first run's Submit."""
    keys = list(earlier.run_keys or [])
    keys += [k for k in later.run_keys or [] if one_answer or k not in keys]
    later.run_keys, later.restarts, later.submitted_at = keys, len(keys) - 1, earlier.submitted_at
    return later


def import_windows(since: datetime, until: datetime | None = None) -> tuple[dict[str, Any], int]:
    """``jobs import`` over a long history in bounded calls (:func:`history_windows`): each window's
    finished jobs are stored and classified in their own transaction, so memory holds one window's lines
    and the jobs still going at its end (carried into the next window, where sacct lists them again, and
    merged run by run), never the whole history. Returns the summary :func:`import_and_classify` gives."""
    total: dict[str, Any] = {"seen": 0, "imported": [], "failed": {}}
    failed_runs = 0
    carry: dict[str, SacctJob] = {}
    counted = gpus_counted()

    def keep(records: list[SacctJob]) -> None:
        nonlocal failed_runs
        # A window may hold up to MAX_LINES_PER_CALL jobs: stored STORE_BATCH at a time, so the records of
        # one transaction, not the window, set the peak (measured: 77 MB at 900 jobs a window, 179 MB at 7,900).
        for start in range(0, len(records), STORE_BATCH):
            result, runs = import_and_classify(records[start:start + STORE_BATCH])
            total["seen"] += result["seen"]
            total["imported"] += result["imported"]
            total["failed"].update(result["failed"])
            failed_runs += runs

    for text, end in history_windows(since, until):
        ready: list[SacctJob] = []
        for record in parse_history(text, counted):
            if record.scheduler_id in carry:
                record = merged(carry.pop(record.scheduler_id), record)
            # Going at the window's end: the next window lists it again (with its later runs).
            if not is_terminal(record.state) or record.ended_at is None or record.ended_at >= end - timedelta(seconds=1):
                carry[record.scheduler_id] = record
            else:
                ready.append(record)
        keep(ready)
    keep(list(carry.values()))
    return total, failed_runs


def default_log(record: SacctJob) -> str | None:
    """Slurm's default output file (``<WorkDir>/slurm-<id>.out``) when it is still there."""
    if not record.work_dir:
        return None
    path = Path(record.work_dir) / f"slurm-{record.scheduler_id}.out"
    return str(path) if path.is_file() else None


def imported_job(record: SacctJob) -> ImportedJob:
    """A job sacct lists, as the store takes it."""
    log_path = default_log(record)
    return ImportedJob(scheduler_id=record.scheduler_id, experiment=record.name, state_text=record.state,
                       reason=record.reason, exit_code=record.exit_code, derived_exit_code=record.derived_exit_code,
                       submitted_at=record.submitted_at, started_at=record.started_at, ended_at=record.ended_at,
                       node_list=record.node_list, restarts=record.restarts, qos=record.qos, gpus=record.gpus,
                       log_path=log_path, log_tail=read_log_tail(log_path) or None, user=record.user or None)


def import_and_classify(records: list[SacctJob]) -> tuple[dict[str, Any], int]:
    """Store the jobs the store does not know yet and classify their failures, in one transaction (an
    imported job has no chain: no crash loop to judge); returns what ``jobs import`` reports (sacct's
    count, the imported Slurm ids, each failed job's cause) and the number of failed runs classified (a
    requeued job may have several)."""
    added = store().imported([imported_job(record) for record in records if "." not in record.scheduler_id],
                             lambda job: classify_end(job, lambda: ([], {})))
    return {"seen": len(records), "imported": [job.scheduler_id for job, _ in added],
            "failed": {str(failure.job_id): failure.cause for _, failures in added for failure in failures}}, sum(
        len(failures) for _, failures in added)

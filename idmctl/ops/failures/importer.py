"""``idmctl jobs import``: pull a team's past jobs from sacct so failures submitted without idmctl
enter the postmortem log (as ``Job(imported=True)`` rows, classified like any other)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ground.errors import CheckFailed, UserError
from idmctl.ops.executors.slurm import parse_time
from idmctl.ops.failures.postmortem import read_log_tail, record_failures
from idmctl.record.db import Session, session
from idmctl.record.failures import known_scheduler_ids
from idmctl.record.models import Job

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


def sacct_history(since: datetime) -> str:
    """Every allocation (and every requeued run, ``-D``) since ``since``, for all users."""
    args = ["sacct", "-n", "-P", "-X", "-D", "-a", "-S", since.strftime("%Y-%m-%dT%H:%M:%S"),
            f"--delimiter={DELIMITER}", f"--format={','.join(IMPORT_FIELDS)}"]
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    except FileNotFoundError as exc:
        raise UserError("sacct not found on PATH", field="scheduler", hint="run this on a Slurm login node") from exc
    if result.returncode != 0:
        raise CheckFailed(f"sacct failed (exit {result.returncode}): {result.stderr.strip()}")
    return result.stdout


def parse_history(text: str) -> list[SacctJob]:
    """sacct lines → one record per job; a requeued job's earlier runs become its restart count."""
    jobs: dict[str, SacctJob] = {}
    for line in text.splitlines():
        parts = line.split(DELIMITER)
        if len(parts) != len(IMPORT_FIELDS):
            continue
        job_id, state, exit_code, derived, reason, submit, start, end, nodes, qos, tres, work_dir, user, name = parts
        gpus = _GPUS.search(tres)
        record = SacctJob(scheduler_id=job_id, name=name, state=state, exit_code=exit_code or None,
                          derived_exit_code=derived or None, reason=reason or None,
                          submitted_at=parse_time(submit), started_at=parse_time(start), ended_at=parse_time(end),
                          node_list=nodes if nodes not in ("", "None assigned") else None, qos=qos or None,
                          gpus=int(gpus.group(1)) if gpus else (0 if tres else None), work_dir=work_dir or None, user=user or None)
        earlier = jobs.get(job_id)
        if earlier is not None:
            record.restarts = earlier.restarts + 1
            record.submitted_at = earlier.submitted_at
        jobs[job_id] = record
    return list(jobs.values())


def default_log(record: SacctJob) -> str | None:
    """Slurm's default output file (``<WorkDir>/slurm-<id>.out``) when it is still there."""
    if not record.work_dir:
        return None
    path = Path(record.work_dir) / f"slurm-{record.scheduler_id}.out"
    return str(path) if path.is_file() else None


def import_history(db: Session, records: list[SacctJob]) -> list[Job]:
    """Store the jobs the store does not know yet (by Slurm id); returns the new rows."""
    known = known_scheduler_ids(db)
    added: list[Job] = []
    for record in records:
        if record.scheduler_id in known or "." in record.scheduler_id:
            continue
        log_path = default_log(record)
        job = Job(experiment=record.name, executor="slurm", scheduler_id=record.scheduler_id, state=record.state,
                  reason=record.reason, exit_code=record.exit_code, submitted_at=record.submitted_at,
                  started_at=record.started_at, ended_at=record.ended_at, node_list=record.node_list,
                  restarts=record.restarts, qos=record.qos, gpus=record.gpus, log_path=log_path,
                  log_tail=read_log_tail(log_path) or None, imported=True,
                  derived_exit_code=record.derived_exit_code)
        if record.user:  # the submitter, not whoever ran the import (host stays the importer's)
            job.user = record.user
        db.add(job)
        added.append(job)
    db.flush()
    return added


def import_and_classify(records: list[SacctJob]) -> tuple[dict[str, Any], int]:
    """Store the jobs the store does not know yet and classify their failures, in one transaction;
    returns what ``jobs import`` reports (sacct's count, the imported Slurm ids, each failed job's cause)
    and the number of failed runs classified (a requeued job may have several)."""
    with session() as db:
        added = import_history(db, records)
        failures = record_failures(db, added)
        return {"seen": len(records), "imported": [job.scheduler_id for job in added],
                "failed": {str(failure.job_id): failure.cause for failure in failures}}, len(failures)

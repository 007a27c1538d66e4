"""Postmortem table rows, built from a failure and its job: shared by the ORM path and the fast read.

No SQLAlchemy here. ``idmctl failures`` (table, ``--json``, ``--markdown``, ``--since``) on a store
that needs no classifying reads its rows with plain sqlite3 (:func:`read_table_rows`, through
``idmctl.record.failures``) and never imports the ORM (~0.45 s of a 0.8 s command).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ground.errors import UserError
from ground.units import parse_duration
from idmctl.ops.failures.classify import Classification, get_cause
from idmctl.ops.failures.caught import caught_now_by
from idmctl.record.failures import failure_rows_fast
from idmctl.record.records import FailureRecord, FixRecord, JobRecord
from idmctl.record.sql_store import job_record



def _naive_utc(moment: datetime | None) -> datetime | None:
    # SQLite hands datetimes back without tzinfo; compare everything as naive UTC.
    if moment is None or moment.tzinfo is None:
        return moment
    return moment.astimezone(timezone.utc).replace(tzinfo=None)


def parse_since(text: str) -> datetime:
    """``2026-11-01`` / an ISO time, or a look-back such as ``7d`` / ``12h`` → naive UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            return datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=parse_duration(text))
        except ValueError as exc:
            raise UserError(f"not a date or a look-back: {text!r}", field="--since",
                            hint="use e.g. 2026-11-01 or 7d") from exc
    return _naive_utc(moment) if moment.tzinfo else moment


def is_since(when: datetime | None, since: datetime | None) -> bool:
    """``--since``: a job counts from when it ended (or was submitted/created); undated jobs always show."""
    moment, since = _naive_utc(when), _naive_utc(since)
    return since is None or moment is None or moment >= since


def setting_of(job: Any) -> str:
    """Card A's "setting" column: ``8 GPU core-extra, N=12``."""
    parts = []
    resources = f"{job.gpus} GPU" if job.gpus else ("CPU" if job.gpus == 0 else "")
    if resources or job.qos:
        parts.append(" ".join(p for p in (resources, job.qos or "") if p))
    if job.routing_n:
        parts.append(f"N={job.routing_n}")
    return ", ".join(parts) or "—"


def _job_label(job: Any, detail: dict[str, Any]) -> str:
    name = job.scheduler_id or f"#{job.id}"
    return name if job.restarts == 0 and detail.get("run", 1) == 1 else f"{name} run {detail.get('run', 1)}"


@dataclass
class PostmortemRow:
    job: str
    job_pk: int
    chain_id: int | None
    experiment: str
    setting: str
    state: str
    cause: str
    evidence: str
    evidence_lines: list[str]
    detail: dict[str, Any]
    caught_by: str
    fix_id: int | None
    fix: str | None
    commit: str | None
    suggested_fix: str
    ended_at: datetime | None
    imported: bool = False
    user: str | None = None
    """Who submitted the job (the shared store holds the whole team's)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data.pop("extra")
        return data


def build_row(failure: FailureRecord, job: JobRecord, fix: FixRecord | None) -> PostmortemRow:
    """One table row from a failure, its job and its fix."""
    detail = dict(failure.detail)
    lines = failure.evidence.splitlines()
    info = get_cause(failure.cause)
    return PostmortemRow(
        job=_job_label(job, detail), job_pk=job.id, chain_id=job.chain_id, experiment=job.experiment,
        setting=setting_of(job), state=job.state_text, cause=failure.cause,
        evidence=Classification(failure.cause, lines, detail).headline, evidence_lines=lines, detail=detail,
        caught_by=caught_now_by(info, detail), fix_id=failure.fix_id, fix=fix.note if fix else None,
        commit=fix.commit if fix else None, suggested_fix=info.fix, ended_at=job.ended_at, imported=job.imported,
        user=job.user)


def _when(text: str | None) -> datetime | None:
    """A stored datetime as the ORM returns it (SQLModel stores UTC without the offset)."""
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def read_table_rows(db: Path, experiment: str | None, cause: str | None, newest: int | None,
                    since: datetime | None = None, user: str | None = None) -> tuple[list[PostmortemRow], int] | None:
    """The ``newest`` rows (None: all) ended since ``since``, oldest first, and the count of failed runs
    (before ``since``), read with sqlite3: exactly what :func:`postmortem.table` returns. None when the ORM path must run instead (no store, another schema
    revision, or jobs that still need classifying)."""
    found = failure_rows_fast(db, experiment, cause, newest, user)
    if found is None:
        return None
    selected, total = found
    rows = []
    for failure, job, fix in selected:
        if not is_since(_when(job.ended_at or job.submitted_at or job.created_at), since):
            continue
        detail = json.loads(failure.detail_json or "{}")
        rows.append(build_row(FailureRecord(id=0, job_id=job.id, cause=failure.cause, evidence=failure.evidence,
                                            detail=detail if isinstance(detail, dict) else {}, fix_id=failure.fix_id),
                              job_record(vars(job)), FixRecord(id=failure.fix_id, note=fix.note, commit=fix.commit)
                              if fix is not None else None))
    rows.sort(key=lambda r: (_naive_utc(r.ended_at) or datetime.min, r.job_pk, r.detail.get("run", 1)))
    return rows, total

"""The SQL store behind :class:`~idmctl.record.store.JobStore`: SQLite under ``$IDMCTL_HOME`` or the team's
PostgreSQL (``IDMCTL_DB_URL``), each transition one transaction guarded by the state it starts from
(``UPDATE job SET … WHERE id = ? AND state IN (…)``: a row that moved meanwhile matches nothing, and the
move is refused rather than written over).

The transitions are written once, over a driver of three verbs (select, insert, update with simple
conditions). A SQLite store already at head is driven with plain sqlite3 (``record.fast``: the submit
path imports no ORM); any other store (PostgreSQL, a SQLite file to create or migrate) with SQLAlchemy
Core on the migrated engine. Both hand back the same records.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Protocol

from ground.errors import UserError
from ground.paths import db_path
from idmctl.core.job_state import JobState
from idmctl.record.fast import JOB_JSON_COLUMNS, connect, db_time, from_db_time, stored_json_value
from idmctl.record.records import (ChainRecord, ChainStatus, EndClaim, EvalLink, FailureRecord, FixRecord, JobRecord,
                                   NewFailure,
                                   NodeExclusionRecord)
from idmctl.record.moves import (Decision, newest_first, FACTS, ImportedJob, NewJob, Observation, RowRefused,
                                 SpecVersionRecord, TransitionRefused, UnknownRecord, claimant, merged)
from idmctl.record.stored_json import EVAL_FIELDS, job_options, typed
from idmctl.record.url import shared_url, writer

Value = object
Condition = tuple[str, str, Value]
"""(column, operator, value): operator ``=``, ``!=``, ``<``, ``>``, ``in`` (a sequence), ``null`` or ``not null``
(value unused)."""

NOT_OVER = tuple(state.value for state in JobState if not state.is_terminal)
"""The stored words of a job that may still change: the guard of every move of a running job."""
IN_CHUNK = 500
"""Ids per ``IN (...)``: SQLite caps bound parameters per statement."""


class _Driver(Protocol):
    def select(self, table: str, where: Sequence[Condition], order: Sequence[str] = ()) -> list[dict[str, Value]]: ...

    def insert(self, table: str, values: Mapping[str, Value]) -> int: ...

    def update(self, table: str, values: Mapping[str, Value], where: Sequence[Condition]) -> int: ...

    def delete(self, table: str, where: Sequence[Condition]) -> int: ...


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _Sqlite3:
    """Plain sqlite3 on a store at head: values written as the ORM writes them (``record.fast``)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    @staticmethod
    def _clause(where: Sequence[Condition]) -> tuple[str, list[Value]]:
        parts, params = [], []
        for column, op, value in where:
            if op == "in":
                values = list(value)  # type: ignore[call-overload]
                parts.append(f'"{column}" IN ({", ".join("?" * len(values))})' if values else "0")
                params += values
            elif op in ("null", "not null"):
                parts.append(f'"{column}" IS {"NULL" if op == "null" else "NOT NULL"}')
            else:
                parts.append(f'"{column}" {op} ?')
                params.append(db_time(value) if isinstance(value, datetime) else value)
        return (" WHERE " + " AND ".join(parts)) if parts else "", params

    @staticmethod
    def _stored(table: str, values: Mapping[str, Value]) -> list[Value]:
        return [db_time(v) if isinstance(v, datetime) else
                json.dumps(v) if table == "job" and k in JOB_JSON_COLUMNS and v is not None else v
                for k, v in values.items()]

    def select(self, table: str, where: Sequence[Condition], order: Sequence[str] = ()) -> list[dict[str, Value]]:
        clause, params = self._clause(where)
        ordered = f" ORDER BY {', '.join(order)}" if order else ""
        found = []
        for row in self.connection.execute(f"SELECT * FROM {table}{clause}{ordered}", params).fetchall():
            values = dict(row)
            if table == "job":
                for name in sorted(JOB_JSON_COLUMNS):  # a row damaged in two columns names the same one each time
                    values[name] = stored_json_value(values[name], values["id"], name)  # type: ignore[arg-type]
            found.append(values)
        return found

    def insert(self, table: str, values: Mapping[str, Value]) -> int:
        columns = ", ".join(f'"{name}"' for name in values)
        cursor = self.connection.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(values))})",
                                         self._stored(table, values))
        return int(cursor.lastrowid or 0)

    def update(self, table: str, values: Mapping[str, Value], where: Sequence[Condition]) -> int:
        clause, params = self._clause(where)
        assignments = ", ".join(f'"{name}" = ?' for name in values)
        return self.connection.execute(f"UPDATE {table} SET {assignments}{clause}",
                                       [*self._stored(table, values), *params]).rowcount

    def delete(self, table: str, where: Sequence[Condition]) -> int:
        clause, params = self._clause(where)
        return self.connection.execute(f"DELETE FROM {table}{clause}", params).rowcount


class _Alchemy:
    """SQLAlchemy Core on the migrated engine: PostgreSQL, or a SQLite store the ORM had to create or migrate."""

    def __init__(self, connection: object) -> None:
        from sqlmodel import SQLModel  # heavy: SQLAlchemy, only for a store plain sqlite3 does not drive

        import idmctl.record.models  # noqa: F401  here: registers the tables on SQLModel.metadata

        self.connection = connection
        self.tables = SQLModel.metadata.tables

    def _where(self, table: object, where: Sequence[Condition]) -> list[object]:
        columns = table.c  # type: ignore[attr-defined]
        found: list[object] = []
        for column, op, value in where:
            target = columns[column]
            found.append(target.in_(list(value)) if op == "in" else target.is_(None) if op == "null"  # type: ignore[call-overload]
                         else target.is_not(None) if op == "not null" else target < value if op == "<"
                         else target > value if op == ">" else target != value if op == "!=" else target == value)
        return found

    def select(self, table: str, where: Sequence[Condition], order: Sequence[str] = ()) -> list[dict[str, Value]]:
        import sqlalchemy as sa  # heavy: as above

        source = self.tables[table]
        query = sa.select(source).where(*self._where(source, where)).order_by(*(source.c[n] for n in order))
        return [dict(row) for row in self.connection.execute(query).mappings()]  # type: ignore[attr-defined]

    def insert(self, table: str, values: Mapping[str, Value]) -> int:
        import sqlalchemy as sa  # heavy: as above

        result = self.connection.execute(sa.insert(self.tables[table]).values(**values))  # type: ignore[attr-defined]
        key = result.inserted_primary_key[0]
        return key if isinstance(key, int) else 0  # spec_version's key is its hash, which the caller holds

    def update(self, table: str, values: Mapping[str, Value], where: Sequence[Condition]) -> int:
        import sqlalchemy as sa  # heavy: as above

        source = self.tables[table]
        return int(self.connection.execute(  # type: ignore[attr-defined]
            sa.update(source).where(*self._where(source, where)).values(**values)).rowcount)

    def delete(self, table: str, where: Sequence[Condition]) -> int:
        import sqlalchemy as sa  # heavy: as above

        source = self.tables[table]
        return int(self.connection.execute(sa.delete(source).where(*self._where(source, where))).rowcount)  # type: ignore[attr-defined]


class _Absent:
    """No store yet: every read finds nothing, and nothing is created by looking (a dry run, a refused
    submit, a bad ``$IDMCTL_HOME`` leave no store behind)."""

    def select(self, table: str, where: Sequence[Condition], order: Sequence[str] = ()) -> list[dict[str, Value]]:
        return []

    def insert(self, table: str, values: Mapping[str, Value]) -> int:
        raise AssertionError("a read transaction writes nothing")

    def update(self, table: str, values: Mapping[str, Value], where: Sequence[Condition]) -> int:
        raise AssertionError("a read transaction writes nothing")

    def delete(self, table: str, where: Sequence[Condition]) -> int:
        raise AssertionError("a read transaction writes nothing")


@contextmanager
def _transaction(read: bool = False) -> Iterator[_Driver]:
    """One transaction on the configured store, committed on success and rolled back on any error. A
    ``read`` of a SQLite store that does not exist yet finds nothing instead of creating it."""
    if read and not shared_url() and not db_path().exists():
        yield _Absent()
        return
    with connect() as fast:
        if fast is not None:
            if not read and not fast.in_transaction:
                # A transition reads the state it may move and then writes: taken with the write lock from
                # its first read, two processes cannot both see "not there yet" (two submits of one spec
                # both inserting its spec_version: UNIQUE failed) or both move the same state.
                fast.execute("BEGIN IMMEDIATE")
            yield _Sqlite3(fast)
            return
    from idmctl.record.db import open_store  # heavy: SQLAlchemy, only where plain sqlite3 cannot serve

    with open_store().begin() as connection:
        yield _Alchemy(connection)


def _aware(value: Value) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return None if value is None else (value.replace(tzinfo=timezone.utc) if value.tzinfo is None
                                           else value.astimezone(timezone.utc))
    return from_db_time(str(value))


def _opt_int(value: Value) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _opt_str(value: Value) -> str | None:
    return None if value is None else str(value)


def job_record(row: Mapping[str, Value]) -> JobRecord:
    """A stored job row (either driver's) as its record; a state no one writes is one line naming the job."""
    job_id = int(row["id"])  # type: ignore[call-overload]
    text = str(row["state"] or "")
    state = JobState.stored(text)
    if state is None:
        raise UserError(f"job {job_id}: its stored state {text!r} is not a state idmctl knows", field="store",
                        hint="restore the store from a backup, or correct that job's state")
    claim = typed(row.get("end_recorded"), "end_recorded", job_id)
    notified = typed(row.get("notified"), "notified", job_id) or {}
    link = None
    if row.get("eval_of_chain") is not None:
        link = EvalLink(of_chain=int(row["eval_of_chain"]), step=_opt_int(row.get("eval_step")),  # type: ignore[call-overload]
                        after=_opt_str(row.get("eval_after")), choice=_opt_str(row.get("eval_choice")),
                        replaces=_opt_int(row.get("eval_replaces")), moved_to=_opt_int(row.get("eval_moved_to")))
    return JobRecord(
        id=job_id, experiment=str(row["experiment"]), state=state, state_text=text,
        chain_id=_opt_int(row.get("chain_id")), attempt=int(row.get("attempt") or 1),  # type: ignore[call-overload]
        spec_hash=_opt_str(row.get("spec_hash")), code_version=_opt_str(row.get("code_version")),
        preflight_id=_opt_int(row.get("preflight_id")), executor=str(row.get("executor") or "slurm"),
        scheduler_id=_opt_str(row.get("scheduler_id")), reason=_opt_str(row.get("reason")),
        exit_code=_opt_str(row.get("exit_code")), submitted_at=_aware(row.get("submitted_at")),
        started_at=_aware(row.get("started_at")), ended_at=_aware(row.get("ended_at")),
        node_list=_opt_str(row.get("node_list")), restarts=int(row.get("restarts") or 0),  # type: ignore[call-overload]
        qos=_opt_str(row.get("qos")), gpus=_opt_int(row.get("gpus")), routing_n=_opt_int(row.get("routing_n")),
        script_path=_opt_str(row.get("script_path")), log_path=_opt_str(row.get("log_path")),
        log_tail=_opt_str(row.get("log_tail")), options=job_options(_opt_str(row.get("options_json")), job_id),
        admitted=typed(row.get("admitted"), "admitted", job_id), code=typed(row.get("code"), "code", job_id),
        runs=tuple(typed(row.get("runs"), "runs", job_id) or ()),
        efficiency=typed(row.get("efficiency"), "efficiency", job_id),
        derived_exit_code=_opt_str(row.get("derived_exit_code")),
        committed_step=typed(row.get("committed_step"), "committed_step", job_id),
        controller=typed(row.get("controller"), "controller", job_id),
        end_claim=EndClaim(by=str(claim.get("by", "")), at=str(claim.get("at", ""))) if claim else None,
        notified={str(k): str(v) for k, v in notified.items()}, eval_link=link,
        forced_reason=_opt_str(row.get("forced_reason")), imported=bool(row.get("imported")),
        user=_opt_str(row.get("user")), host=_opt_str(row.get("host")),
        created_at=_aware(row.get("created_at")), updated_at=_aware(row.get("updated_at")))


def chain_record(row: Mapping[str, Value]) -> ChainRecord:
    """A stored chain row as its record."""
    return ChainRecord(id=int(row["id"]), experiment=str(row["experiment"]), spec_hash=str(row["spec_hash"]),  # type: ignore[call-overload]
                       status=ChainStatus(str(row["status"])), retries_budget=int(row.get("retries_budget") or 0),  # type: ignore[call-overload]
                       retries_used=int(row.get("retries_used") or 0), mlflow_run_id=_opt_str(row.get("mlflow_run_id")),  # type: ignore[call-overload]
                       user=_opt_str(row.get("user")), host=_opt_str(row.get("host")),
                       created_at=_aware(row.get("created_at")))


def failure_record(row: Mapping[str, Value]) -> FailureRecord:
    """A stored failure row as its record."""
    detail = json.loads(str(row.get("detail_json") or "{}"))
    return FailureRecord(id=int(row["id"]), job_id=int(row["job_id"]), cause=str(row["cause"]),  # type: ignore[call-overload]
                         evidence=str(row.get("evidence") or ""), detail=detail if isinstance(detail, dict) else {},
                         fix_id=_opt_int(row.get("fix_id")), classified_at=_aware(row.get("classified_at")),
                         user=_opt_str(row.get("user")))


def _observation_columns(seen: Observation, now: datetime) -> dict[str, Value]:
    return {"state": seen.state_text, "reason": seen.reason, "exit_code": seen.exit_code,
            "submitted_at": seen.submitted_at, "started_at": seen.started_at, "ended_at": seen.ended_at,
            "node_list": seen.node_list, "restarts": seen.restarts,
            "runs": [dict(run) for run in seen.runs] if seen.runs else None, "log_tail": seen.log_tail,
            "updated_at": now}


def _writer() -> dict[str, Value]:
    user, host = writer()
    return {"user": user, "host": host}


class SqlStore:
    """:class:`~idmctl.record.store.JobStore` on the configured SQL store (each call its own transaction)."""

    # --- reads ------------------------------------------------------------------------------------------------
    def job(self, job_id: int) -> JobRecord | None:
        with _transaction(read=True) as db:
            found = db.select("job", [("id", "=", job_id)])
        return job_record(found[0]) if found else None

    def chain(self, chain_id: int) -> ChainRecord | None:
        with _transaction(read=True) as db:
            found = db.select("chain", [("id", "=", chain_id)])
        return chain_record(found[0]) if found else None

    def attempts(self, chain_id: int, before: int | None = None) -> list[JobRecord]:
        where: list[Condition] = [("chain_id", "=", chain_id)]
        if before is not None:
            where.append(("attempt", "<", before))
        with _transaction(read=True) as db:
            return [job_record(row) for row in db.select("job", where, order=("attempt", "id"))]

    def unfinished(self, chain_id: int | None = None, user: str | None = None) -> list[JobRecord]:
        where: list[Condition] = [("scheduler_id", "not null", None), ("state", "in", NOT_OVER)]
        if chain_id is not None:
            where.append(("chain_id", "=", chain_id))
        if user is not None:
            where.append(("user", "=", user))
        with _transaction(read=True) as db:
            return [job_record(row) for row in db.select("job", where, order=("id",))]

    def eval_jobs(self, chain_id: int) -> list[JobRecord]:
        with _transaction(read=True) as db:
            return [job_record(row) for row in db.select("job", [("eval_of_chain", "=", chain_id)], order=("id",))]

    def failures(self, job_ids: Sequence[int]) -> list[FailureRecord]:
        ids = list(job_ids)
        found: list[FailureRecord] = []
        with _transaction(read=True) as db:
            for start in range(0, len(ids), IN_CHUNK):
                found += [failure_record(row) for row in
                          db.select("failure", [("job_id", "in", ids[start:start + IN_CHUNK])], order=("id",))]
        return sorted(found, key=lambda f: f.id)

    def exclusions(self, reason: str | None = None) -> list[NodeExclusionRecord]:
        with _transaction(read=True) as db:
            rows = db.select("node_exclusion", [("reason", "=", reason)] if reason is not None else [], order=("id",))
        return [NodeExclusionRecord(node=str(row["node"]), until=_aware(row["until"]) or _now(),
                                    reason=str(row.get("reason") or "")) for row in rows]

    def with_scheduler_id(self, scheduler_id: str) -> list[JobRecord]:
        with _transaction(read=True) as db:
            return [job_record(row) for row in db.select("job", [("scheduler_id", "=", scheduler_id)], order=("id",))]

    def to_classify(self) -> list[JobRecord]:
        with _transaction(read=True) as db:
            rows = {row["id"]: row for row in db.select("job", [("state", "!=", JobState.COMPLETED.value)])}
            rows.update({row["id"]: row for row in db.select("job", [("restarts", ">", 0)])})
            jobs = [job_record(row) for _, row in sorted(rows.items())]  # type: ignore[type-var]
            ids = [job.id for job in jobs]
            newest: dict[int, datetime] = {}
            for start in range(0, len(ids), IN_CHUNK):
                for row in db.select("failure", [("job_id", "in", ids[start:start + IN_CHUNK])]):
                    failure = failure_record(row)
                    if failure.classified_at is not None and (failure.job_id not in newest
                                                             or failure.classified_at > newest[failure.job_id]):
                        newest[failure.job_id] = failure.classified_at
        return [job for job in jobs if job.id not in newest or job.updated_at is None
                or newest[job.id] < job.updated_at]

    def failure_table(self, experiment: str | None = None, cause: str | None = None, user: str | None = None,
                      newest: int | None = None) -> tuple[list[tuple[FailureRecord, JobRecord, FixRecord | None]], int]:
        job_filter: list[Condition] = [("experiment", "=", experiment)] if experiment else []
        if user:
            job_filter.append(("user", "=", user))
        with _transaction(read=True) as db:
            failures = [failure_record(row) for row in
                        db.select("failure", [("cause", "=", cause)] if cause else [], order=("id",))]
            ids = sorted({failure.job_id for failure in failures})
            jobs: dict[int, JobRecord] = {}
            for start in range(0, len(ids), IN_CHUNK):
                jobs.update((job.id, job) for job in (job_record(row) for row in db.select(
                    "job", [("id", "in", ids[start:start + IN_CHUNK]), *job_filter])))
            pairs = [(failure, jobs[failure.job_id]) for failure in failures if failure.job_id in jobs]
            if newest:
                pairs = newest_first(pairs, newest)
            fix_ids = sorted({failure.fix_id for failure, _ in pairs if failure.fix_id is not None})
            fixes = {int(row["id"]): FixRecord(id=int(row["id"]), note=str(row["note"]),  # type: ignore[call-overload]
                                               commit=_opt_str(row.get("commit")), created_at=_aware(row.get("created_at")))
                     for row in (db.select("fix", [("id", "in", fix_ids)]) if fix_ids else [])}
        total = len(failures) if not (experiment or user) else sum(1 for f in failures if f.job_id in jobs)
        return [(failure, job, fixes.get(failure.fix_id) if failure.fix_id else None) for failure, job in pairs], total

    # --- transitions ------------------------------------------------------------------------------------------
    def open_chain(self, experiment: str, spec_hash: str, retries: int,
                   spec: SpecVersionRecord | None = None) -> ChainRecord:
        now = _now()
        with _transaction() as db:
            if spec is not None and not db.select("spec_version", [("hash", "=", spec.hash)]):
                db.insert("spec_version", {"hash": spec.hash, "experiment": spec.experiment,
                                           "source_path": spec.source_path, "resolved_json": spec.resolved_json,
                                           "registered_at": now, **_writer()})
            chain_id = db.insert("chain", {"experiment": experiment, "spec_hash": spec_hash, "mlflow_run_id": None,
                                           "retries_budget": retries, "retries_used": 0,
                                           "status": ChainStatus.ACTIVE.value, "created_at": now, **_writer()})
            return chain_record(db.select("chain", [("id", "=", chain_id)])[0])

    def withdrawn(self, chain_id: int) -> bool:
        with _transaction() as db:
            if db.select("job", [("chain_id", "=", chain_id)]):
                return False
            return db.delete("chain", [("id", "=", chain_id)]) == 1

    def resumed(self, chain_id: int) -> ChainRecord:
        with _transaction() as db:
            if not db.select("chain", [("id", "=", chain_id)]):
                raise UnknownRecord(f"no chain {chain_id} in the store")
            running = db.select("job", [("chain_id", "=", chain_id), ("scheduler_id", "not null", None),
                                        ("state", "in", NOT_OVER)], order=("attempt",))
            if running:
                raise TransitionRefused(f"chain {chain_id} is still running (job {running[-1]['id']}, "
                                        f"{running[-1]['state']})")
            db.update("chain", {"status": ChainStatus.ACTIVE.value}, [("id", "=", chain_id)])
            return chain_record(db.select("chain", [("id", "=", chain_id)])[0])

    def submitting(self, job: NewJob) -> JobRecord:
        now = _now()
        link = job.eval_link.as_dict() if job.eval_link else {}
        with _transaction() as db:
            self._open_chain(db, job.chain_id)
            job_id = db.insert("job", {
                "chain_id": job.chain_id, "attempt": job.attempt, "experiment": job.experiment,
                "spec_hash": job.spec_hash, "code_version": job.code_version, "preflight_id": job.preflight_id,
                "executor": job.executor, "state": JobState.SUBMITTING.value, "restarts": 0, "qos": job.qos,
                "gpus": job.gpus, "routing_n": job.routing_n, "script_path": job.script_path,
                "options_json": json.dumps(dict(job.options)), "admitted": _plain(job.admitted),
                "code": _plain(job.code), "forced_reason": job.forced_reason, "imported": False,
                **{f"eval_{name}": link.get(name) for name in EVAL_FIELDS},
                "created_at": now, "updated_at": now, **_writer()})
            return job_record(db.select("job", [("id", "=", job_id)])[0])

    def submitted(self, job_id: int, scheduler_id: str, log_path: str | None, at: datetime) -> JobRecord:
        return self._move(job_id, (JobState.SUBMITTING.value,), "submitted",
                          {"scheduler_id": scheduler_id, "state": JobState.PENDING.value, "log_path": log_path,
                           "submitted_at": at})

    def refused(self, job_id: int, reason: str) -> JobRecord:
        with _transaction() as db:
            job = self._guarded(db, job_id, (JobState.SUBMITTING.value,), "refused",
                                {"state": JobState.SUBMIT_FAILED.value, "reason": reason[:500]})
            if job.chain_id is not None:
                db.update("chain", {"status": ChainStatus.FAILED.value},
                          [("id", "=", job.chain_id), ("status", "=", ChainStatus.ACTIVE.value)])
            return job

    def observed(self, job_id: int, seen: Observation) -> JobRecord:
        if seen.state.is_terminal:
            raise TransitionRefused(f"job {job_id}: an end ({seen.state_text}) is recorded by `ended`, which claims it")
        return self._move(job_id, NOT_OVER, "observed", _observation_columns(seen, _now()))

    def claim_end(self, job_id: int) -> bool:
        with _transaction() as db:
            return self._claim(db, job_id)

    def ended(self, job_id: int, seen: Observation, failures: Sequence[NewFailure] = (),
              facts: Mapping[str, object] | None = None) -> JobRecord | None:
        if not seen.state.is_terminal:
            raise TransitionRefused(f"job {job_id}: {seen.state_text} is not an end (record it with `observed`)")
        now = _now()
        with _transaction() as db:
            row = self._row(db, job_id)
            if row.end_claim is None:
                if not self._claim(db, job_id):
                    return None
            elif row.end_claim.by != claimant().by:
                return None
            values = _observation_columns(seen, now)
            values.update({k: _plain(v) for k, v in (facts or {}).items() if k in ("efficiency", "committed_step")})
            job = self._guarded(db, job_id, NOT_OVER, "ended", values)
            for failure in failures:
                self._write_failure(db, job_id, failure, now)
            return job

    def record_failure(self, job_id: int, failure: NewFailure) -> FailureRecord:
        with _transaction() as db:
            self._row(db, job_id)
            return self._write_failure(db, job_id, failure, _now())

    def classified(self, job_id: int, failures: Sequence[NewFailure]) -> list[FailureRecord]:
        now = _now()
        with _transaction() as db:
            self._row(db, job_id)
            return [self._write_failure(db, job_id, failure, now) for failure in failures]

    def fixed(self, job_ids: Sequence[int], note: str, commit: str | None) -> FixRecord:
        ids = list(job_ids)
        with _transaction() as db:
            fix_id = db.insert("fix", {"note": note, "commit": commit, "created_at": _now(), **_writer()})
            for start in range(0, len(ids), IN_CHUNK):
                db.update("failure", {"fix_id": fix_id}, [("job_id", "in", ids[start:start + IN_CHUNK])])
            (row,) = db.select("fix", [("id", "=", fix_id)])
        return FixRecord(id=fix_id, note=str(row["note"]), commit=_opt_str(row.get("commit")),
                         created_at=_aware(row.get("created_at")))

    def decided(self, chain_id: int, decision: Decision) -> ChainRecord:
        if decision.close is not None and not decision.close.is_terminal():
            raise TransitionRefused(f"chain {chain_id}: {decision.close} does not close a chain")
        with _transaction() as db:
            chain = self._open_chain(db, chain_id)
            values: dict[str, Value] = {}
            if decision.spend_retry:
                values["retries_used"] = chain.retries_used + 1
            if decision.close is not None:
                values["status"] = decision.close.value
            if values and db.update("chain", values, [("id", "=", chain_id), ("status", "=", ChainStatus.ACTIVE.value),
                                                      ("retries_used", "=", chain.retries_used)]) != 1:
                raise TransitionRefused(f"chain {chain_id} changed while it was decided: decide it again")
            self._exclude(db, decision.exclude)
            return chain_record(db.select("chain", [("id", "=", chain_id)])[0])

    def exclude_nodes(self, exclusions: Sequence[NodeExclusionRecord]) -> None:
        with _transaction() as db:
            self._exclude(db, exclusions)

    def cancelling(self, job_id: int) -> tuple[JobRecord, ChainRecord | None]:
        with _transaction() as db:
            job = self._row(db, job_id)
            if job.scheduler_id is None:
                raise TransitionRefused(f"job {job_id} was never submitted")
            if job.is_terminal:
                raise TransitionRefused(f"job {job_id} already ended {job.state_text}: `cancelling` never leaves a terminal state")
            found = db.select("chain", [("id", "=", job.chain_id)]) if job.chain_id is not None else []
            chain = chain_record(found[0]) if found else None
            if chain is not None and chain.status is ChainStatus.ACTIVE and db.update(
                    "chain", {"status": ChainStatus.CANCELLED.value},
                    [("id", "=", chain.id), ("status", "=", ChainStatus.ACTIVE.value)]) != 1:
                # read ACTIVE in this transaction, yet the UPDATE matched nothing: the team store's row-level
                # security hides a colleague's chain from this member's writes
                raise RowRefused(f"error: the store changed nothing (chain {chain.id} of job {job_id}); in a team's store "
                                 "a member changes only their own jobs and chains (row-level security)")
            return job, chain

    def cancel_refused(self, chain_id: int, previous: ChainStatus) -> ChainRecord | None:
        with _transaction() as db:
            db.update("chain", {"status": previous.value},
                      [("id", "=", chain_id), ("status", "=", ChainStatus.CANCELLED.value)])
            found = db.select("chain", [("id", "=", chain_id)])
            return chain_record(found[0]) if found else None

    def note(self, job_id: int, key: str, value: object) -> JobRecord:
        if key not in FACTS:
            raise KeyError(f"{key!r} is not a job fact ({', '.join(FACTS)})")
        with _transaction() as db:
            job = self._row(db, job_id)
            db.update("job", {key: _plain(merged(getattr(job, key), value))}, [("id", "=", job_id)])
            return self._row(db, job_id)

    def relinked(self, job_id: int, link: EvalLink) -> JobRecord:
        with _transaction() as db:
            job = self._row(db, job_id)
            if job.eval_link is None or job.eval_link.of_chain != link.of_chain:
                raise TransitionRefused(f"job {job_id} is not an eval job of chain {link.of_chain}")
            values = {name: getattr(link, name) for name in EVAL_FIELDS}
            db.update("job", {f"eval_{name}": value for name, value in values.items()}, [("id", "=", job_id)])
            return self._row(db, job_id)

    def note_chain_run(self, chain_id: int, mlflow_run_id: str) -> ChainRecord:
        with _transaction() as db:
            db.update("chain", {"mlflow_run_id": mlflow_run_id}, [("id", "=", chain_id), ("mlflow_run_id", "null", None)])
            found = db.select("chain", [("id", "=", chain_id)])
            if not found:
                raise UnknownRecord(f"no chain {chain_id} in the store")
            return chain_record(found[0])

    def imported(self, jobs: Sequence[ImportedJob],
                 classify: Callable[[JobRecord], Sequence[NewFailure]]) -> list[tuple[JobRecord, list[FailureRecord]]]:
        now = _now()
        added: list[tuple[JobRecord, list[FailureRecord]]] = []
        with _transaction() as db:
            ids = [job.scheduler_id for job in jobs]
            known = {str(row["scheduler_id"]) for start in range(0, len(ids), IN_CHUNK)
                     for row in db.select("job", [("scheduler_id", "in", ids[start:start + IN_CHUNK])])}
            for new in jobs:
                if new.scheduler_id in known:
                    continue
                known.add(new.scheduler_id)
                writer_of = _writer()
                job_id = db.insert("job", {
                    "experiment": new.experiment, "executor": "slurm", "attempt": 1, "scheduler_id": new.scheduler_id,
                    "state": new.state_text, "reason": new.reason, "exit_code": new.exit_code,
                    "derived_exit_code": new.derived_exit_code, "submitted_at": new.submitted_at,
                    "started_at": new.started_at, "ended_at": new.ended_at, "node_list": new.node_list,
                    "restarts": new.restarts, "qos": new.qos, "gpus": new.gpus, "log_path": new.log_path,
                    "log_tail": new.log_tail, "options_json": "{}", "imported": True, "created_at": now,
                    "updated_at": now, **writer_of, "user": new.user or writer_of["user"]})
                record = self._row(db, job_id)
                added.append((record, [self._write_failure(db, job_id, found, now) for found in classify(record)]))
        return added

    def claim_notice(self, job_id: int, event: str) -> bool:
        with _transaction() as db:
            found = db.select("job", [("id", "=", job_id)])
            if not found:
                return False
            before = found[0]["notified"]
            notified = dict(before) if isinstance(before, dict) else {}
            if event in notified:
                return False
            claimed = {**notified, event: _now().isoformat(timespec="seconds")}
            # Compare-and-set on what was read: of two syncs deciding the same job at once, one update matches.
            guard: Condition = ("notified", "null", None) if before is None else ("notified", "=", json.dumps(before))
            if isinstance(db, _Alchemy) and before is not None:
                return self._claim_notice_alchemy(db, job_id, before, claimed)
            return db.update("job", {"notified": claimed}, [("id", "=", job_id), guard]) == 1

    # --- the rules -------------------------------------------------------------------------------------------
    @staticmethod
    def _claim_notice_alchemy(db: _Alchemy, job_id: int, before: object, claimed: dict[str, str]) -> bool:
        import sqlalchemy as sa  # heavy: the driver already loaded it

        table = db.tables["job"]
        same = sa.cast(table.c.notified, sa.String) == json.dumps(before)
        return int(db.connection.execute(sa.update(table).where(table.c.id == job_id, same)  # type: ignore[attr-defined]
                                         .values(notified=claimed)).rowcount) == 1

    @staticmethod
    def _row(db: _Driver, job_id: int) -> JobRecord:
        found = db.select("job", [("id", "=", job_id)])
        if not found:
            raise UnknownRecord(f"no job {job_id} in the store")
        return job_record(found[0])

    @staticmethod
    def _open_chain(db: _Driver, chain_id: int) -> ChainRecord:
        found = db.select("chain", [("id", "=", chain_id)])
        if not found:
            raise UnknownRecord(f"no chain {chain_id} in the store")
        chain = chain_record(found[0])
        if chain.status.is_terminal():
            raise TransitionRefused(f"chain {chain_id} is {chain.status}: a chain that is over takes no more")
        return chain

    def _guarded(self, db: _Driver, job_id: int, states: Sequence[str], move: str, values: dict[str, Value]) -> JobRecord:
        """``UPDATE job SET values WHERE id = job_id AND state IN states``; refused when it matches nothing."""
        values = {"updated_at": _now(), **values}
        if db.update("job", values, [("id", "=", job_id), ("state", "in", list(states))]) != 1:
            job = self._row(db, job_id)
            ended = " already ended" if job.is_terminal else ""
            raise TransitionRefused(f"job {job_id} is{ended} {job.state_text}: `{move}` "
                                    + ("never leaves a terminal state" if ended else f"moves only {', '.join(states)}"))
        return self._row(db, job_id)

    def _move(self, job_id: int, states: Sequence[str], move: str, values: dict[str, Value]) -> JobRecord:
        with _transaction() as db:
            return self._guarded(db, job_id, states, move, values)

    @staticmethod
    def _claim(db: _Driver, job_id: int) -> bool:
        claim = claimant()
        return db.update("job", {"end_recorded": {"by": claim.by, "at": claim.at}},
                         [("id", "=", job_id), ("end_recorded", "null", None)]) == 1

    @staticmethod
    def _write_failure(db: _Driver, job_id: int, failure: NewFailure, now: datetime) -> FailureRecord:
        run = failure.detail.get("run", 1)
        values: dict[str, Value] = {"cause": failure.cause, "evidence": failure.evidence,
                                    "detail_json": json.dumps(dict(failure.detail), sort_keys=True), "classified_at": now}
        same = [row for row in db.select("failure", [("job_id", "=", job_id)], order=("id",))
                if failure_record(row).run == run]
        if same:
            db.update("failure", values, [("id", "=", same[0]["id"])])
            failure_id = int(same[0]["id"])  # type: ignore[call-overload]
        else:
            failure_id = db.insert("failure", {"job_id": job_id, "fix_id": None, **values, **_writer()})
        return failure_record(db.select("failure", [("id", "=", failure_id)])[0])

    @staticmethod
    def _exclude(db: _Driver, exclusions: Sequence[NodeExclusionRecord]) -> None:
        for exclusion in exclusions:
            db.insert("node_exclusion", {"node": exclusion.node, "until": exclusion.until, "reason": exclusion.reason,
                                         **_writer()})


def _plain(value: object) -> object:
    """A record's JSON value as the column takes it (mappings and tuples as dicts and lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


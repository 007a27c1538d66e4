"""Plain sqlite3 on the submit path: importing the ORM (SQLAlchemy + SQLModel, ~0.3 s) would be most of
a submit's process time (the target: submit within submitit's time + 0.15 s).

Only a store already at :data:`HEAD_REVISION` is used this way; otherwise :func:`connect` returns None
and the caller takes the ORM path, which migrates. Values are written as the ORM writes them: UTC
datetimes without the offset (``2026-11-30 10:32:44.123456``), booleans as 0/1, so both paths read
each other's rows (tests/idmctl/record/test_submit_fast_store.py compares them).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from ground.errors import UserError
from ground.paths import db_path
from idmctl.record.head import HEAD_REVISION
from idmctl.record.url import shared_url, writer

BUSY_TIMEOUT_S = 10.0
WRITER_TABLES = frozenset({"spec_version", "preflight_run", "chain", "job", "failure", "fix", "node_exclusion"})
"""Tables whose rows carry the writer's ``user`` and ``host`` (models.Written), as the ORM fills them."""
JOB_JSON_COLUMNS = frozenset({"admitted", "code", "runs", "efficiency", "committed_step", "controller", "end_recorded",
                              "notified"})
"""The job table's JSON columns (models.Job, ``sa.JSON``): sqlite3 hands them back as text and takes them
as text, so this module parses and writes them as the ORM does (tests/idmctl/record/test_job_columns.py
checks the models agree)."""


def db_time(moment: datetime | None = None) -> str:
    """How the ORM stores a datetime in SQLite: UTC, no offset, microseconds."""
    moment = (moment or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")


def from_db_time(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


_OPEN: dict[str, sqlite3.Connection] = {}
"""One connection per process (for the store last used): opening, closing (a WAL checkpoint) and the
revision query once, not per statement group — half of a submit's store time otherwise."""


def _open(db: Path) -> sqlite3.Connection | None:
    connection = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)
    connection.row_factory = sqlite3.Row
    try:
        row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        row = None
    if row is None or row[0] != HEAD_REVISION:
        connection.close()
        return None
    connection.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    connection.execute("PRAGMA foreign_keys=ON")
    for other in _OPEN.values():  # tests switch IDMCTL_HOME; a process needs one store at a time
        other.close()
    _OPEN.clear()
    _OPEN[str(db)] = connection
    return connection


def close_all() -> None:
    """Close the connection this process keeps (the last close checkpoints the WAL into the store file)."""
    for connection in _OPEN.values():
        connection.close()
    _OPEN.clear()


@contextmanager
def connect(path: Path | None = None) -> Iterator[sqlite3.Connection | None]:
    """A transaction (committed on success, rolled back on error) on a store at head, or None: no store
    yet, another revision (the caller then takes the ORM path, which migrates), or the team's PostgreSQL
    store (``IDMCTL_DB_URL``), which only the ORM path writes."""
    if shared_url():  # whatever the path: the caller's default store is the shared one
        yield None
        return
    db = Path(path or db_path())
    connection = _OPEN.get(str(db))
    if connection is None:
        connection = _open(db) if db.exists() else None
    if connection is None:
        yield None
        return
    try:
        yield connection
        connection.commit()
    except sqlite3.DatabaseError as exc:
        connection.rollback()
        unusable = unusable_store(db, str(exc))
        if unusable is not None:
            raise unusable from exc
        raise
    except BaseException:
        connection.rollback()
        raise


def unusable_store(path: Path, text: str) -> UserError | None:
    """The one line for a store that cannot be used whatever the command does: damage found past the
    header, or a read-only file or disk (its -wal/-shm files too); None for any other database error."""
    if "malformed" in text or "not a database" in text or "readonly" in text:
        return UserError(f"the store cannot be used: {text}", file=str(path),
                         hint="restore it from a backup or move it aside; keep IDMCTL_HOME writable")
    return None


def rows(connection: sqlite3.Connection, sql: str, params: tuple[object, ...] = ()) -> list[SimpleNamespace]:
    """Rows as attribute objects, like the ORM's (datetimes stay text: callers convert what they read; a
    job's JSON columns are parsed, as the ORM parses them)."""
    found = []
    for row in connection.execute(sql, params).fetchall():
        values = dict(row)
        for name in JOB_JSON_COLUMNS.intersection(values):
            values[name] = stored_json_value(values[name], values.get("id", "?"), name)
        found.append(SimpleNamespace(**values))
    return found


def stored_json_value(text: str | None, job: object, column: str) -> object:
    """One JSON column of a job row as sqlite3 hands it back: None for NULL; a hand-edited value that is
    not JSON is one line naming the job and the column."""
    if text is None:
        return None
    if isinstance(text, (int, float)):  # a bare JSON number: the column's NUMERIC affinity stored it as one
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        where = f" at character {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        raise UserError(f"job {job}: its stored record is damaged ({column} is not JSON{where})", field="store",
                        hint="restore the store from a backup, or delete that job's row") from None


def _stored(table: str, values: Mapping[str, object]) -> dict[str, object]:
    """The values as sqlite3 takes them: a job's JSON columns as JSON text (None stays NULL)."""
    if table != "job":
        return values
    return {name: json.dumps(value) if name in JOB_JSON_COLUMNS and value is not None else value
            for name, value in values.items()}


def insert(connection: sqlite3.Connection, table: str, values: Mapping[str, object]) -> int:
    if table in WRITER_TABLES:
        user, host = writer()
        values = {"user": user, "host": host, **values}
    values = _stored(table, values)
    columns = ", ".join(f'"{name}"' for name in values)
    marks = ", ".join("?" for _ in values)
    cursor = connection.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", tuple(values.values()))
    return int(cursor.lastrowid or 0)


def update(connection: sqlite3.Connection, table: str, row_id: int, values: Mapping[str, object]) -> None:
    values = _stored(table, values)
    assignments = ", ".join(f'"{name}" = ?' for name in values)
    connection.execute(f"UPDATE {table} SET {assignments} WHERE id = ?", (*values.values(), row_id))

"""Read-only looks at a store, for ``idmctl doctor``: the schema level and integrity of a SQLite file
(idmctl's or MLflow's), the schema level of the team's PostgreSQL store, and what MLflow's store holds
of idmctl's experiment. Nothing here migrates, creates or writes a store."""

from __future__ import annotations

import sqlite3
from pathlib import Path


class UnreadableStore(Exception):
    """The file is not a SQLite database SQLite can read (the message is SQLite's)."""


def sqlite_state(path: Path) -> tuple[str | None, str]:
    """(stored Alembic revision, PRAGMA quick_check result) of a SQLite file, read-only."""
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            check = connection.execute("PRAGMA quick_check").fetchone()[0]
            try:
                row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            except sqlite3.OperationalError:
                row = None
            return (row[0] if row else None), check
        finally:
            connection.close()
    except sqlite3.DatabaseError as exc:
        raise UnreadableStore(str(exc)) from exc


def shared_revision(conninfo: str, timeout_s: int = 5) -> str | None:
    """The Alembic revision of a PostgreSQL store (None: no migration level), read with psycopg.
    ImportError without the driver; psycopg's error (or libpq's, for a conninfo it cannot parse) as raised."""
    import psycopg  # only for a shared store: the driver is optional

    with psycopg.connect(conninfo, connect_timeout=timeout_s) as connection:
        exists = connection.execute("SELECT to_regclass('alembic_version')").fetchone()[0]  # type: ignore[index]
        return connection.execute("SELECT version_num FROM alembic_version").fetchone()[0] if exists else None  # type: ignore[index]


def mlflow_experiment(path: Path, name: str, kind_tag: str) -> tuple[str | None, int, str | None] | None:
    """(experiment id or None when there is no experiment ``name``, its run count, its ``kind_tag`` value)
    in MLflow's SQLite store, read-only; None when the file has no MLflow tables."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        row = connection.execute("SELECT experiment_id FROM experiments WHERE name = ?", (name,)).fetchone()
        if row is None:
            return None, 0, None
        runs = connection.execute("SELECT COUNT(*) FROM runs WHERE experiment_id = ?", (row[0],)).fetchone()[0]
        kind = connection.execute("SELECT value FROM experiment_tags WHERE experiment_id = ? AND key = ?",
                                  (row[0], kind_tag)).fetchone()
    except sqlite3.OperationalError:
        return None
    finally:
        connection.close()
    return str(row[0]), int(runs), kind[0] if kind else None

"""Open the SQLite store under ``$IDMCTL_HOME`` (WAL, a busy timeout) or the team's PostgreSQL store
(``IDMCTL_DB_URL``, idmctl/store/shared.py), migrated to head.

The schema is owned by Alembic (``migrations/versions``). Opening checks the stored revision with
one cheap query and runs ``alembic upgrade head`` only when it differs, so commands stay fast.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

from ground.paths import db_path
from idmctl.store.url import shared_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
from idmctl.store.head import HEAD_REVISION  # noqa: E402  (re-exported: store_db.HEAD_REVISION)
BUSY_TIMEOUT_MS = 10_000


def _set_pragmas(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _stored_revision(path: Path) -> str | None:
    if not path.exists():
        return None
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.OperationalError:
        return None
    finally:
        connection.close()
    return row[0] if row else None


def upgrade(url: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "head")


@lru_cache(maxsize=8)
def _engine_for(path: str) -> Engine:
    url = f"sqlite:///{path}"
    db_file = Path(path)
    db_file.parent.mkdir(parents=True, exist_ok=True)
    if _stored_revision(db_file) != HEAD_REVISION:
        upgrade(url)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
    event.listen(engine, "connect", _set_pragmas)
    return engine


@lru_cache(maxsize=8)
def _shared_engine(url: str) -> Engine:
    from idmctl.store.shared import open_shared

    return open_shared(url)


def open_store(path: Path | None = None) -> Engine:
    """The engine for the store at ``path`` (default: the team's ``IDMCTL_DB_URL`` when set, else
    ``$IDMCTL_HOME/idmctl.sqlite``), migrated to head."""
    if path is None:
        url = shared_url()
        if url:
            return _shared_engine(url)
    return _engine_for(str(path or db_path()))


@contextmanager
def session(path: Path | None = None) -> Iterator[Session]:
    """A session that commits on success and rolls back on any exception."""
    with Session(open_store(path), expire_on_commit=False) as db:
        try:
            yield db
            db.commit()
        except BaseException:
            db.rollback()
            raise

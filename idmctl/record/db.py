"""Open the SQLite store under ``$IDMCTL_HOME`` (WAL, a busy timeout) or the team's PostgreSQL store
(``IDMCTL_DB_URL``, idmctl/record/shared.py), migrated to head.

The schema is owned by Alembic (``migrations/versions``). Opening checks the stored revision with
one cheap query and runs ``alembic upgrade head`` only when it differs, so commands stay fast.
"""

from __future__ import annotations

import fcntl
import sqlite3
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError as SQLAlchemyDatabaseError
from sqlalchemy.orm.exc import StaleDataError
from sqlmodel import Session, create_engine

from ground.contract import ENV_HOME
from ground.errors import UserError
from ground.paths import db_path
from idmctl.record.migrate import known_revisions, seed_new_store, upgrade
from idmctl.record.moves import RowRefused
from idmctl.record.url import shared_url

from idmctl.record.head import HEAD_REVISION  # noqa: E402  (re-exported: store_db.HEAD_REVISION)
from idmctl.record.fast import unusable_store
from idmctl.record.shared import open_shared
BUSY_TIMEOUT_MS = 10_000


def _set_pragmas(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _stored_revision(path: Path) -> str | None:
    """The Alembic revision the store is at; None for a new (or empty) file. A file that is not a
    SQLite database at all, or a damaged one, is a UserError naming it rather than a traceback."""
    if not path.exists():
        return None
    if not path.is_file():
        raise UserError("the store is not a file", file=str(path),
                        hint=f"move it aside; idmctl creates a new store there, or set {ENV_HOME}")
    try:
        connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise _unusable(path, exc) from exc
    try:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "alembic_version" not in tables:
            return None
        row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error as exc:  # "file is not a database", "database disk image is malformed"
        raise _unusable(path, exc) from exc
    finally:
        connection.close()
    return row[0] if row else None


def _unusable(path: Path, exc: BaseException) -> UserError:
    if "unable to open" in str(exc) and not _writable(path.parent):
        # SQLite in WAL mode creates -wal/-shm files beside the store even to read it.
        return UserError(f"cannot open the store: {path.parent} is read-only", file=str(path),
                         hint=f"make {ENV_HOME} a writable directory on local disk")
    return UserError(f"the store is unreadable: {exc}", file=str(path),
                     hint="restore it from a backup, or move it aside to start an empty store")


def _writable(directory: Path) -> bool:
    """Whether a file can be created there (os.access says yes to root even on a read-only mount)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


@contextmanager
def _init_lock(db_file: Path) -> Iterator[None]:
    """Serialise creating and migrating the store across processes: eight `idmctl jobs` on a new
    IDMCTL_HOME once crashed 31 of 80 times with "table chain already exists". The first
    process migrates; the others wait here, then find the store at head."""
    try:
        db_file.parent.mkdir(parents=True, exist_ok=True)
        handle = open(db_file.with_name(f".{db_file.name}.init.lock"), "a")
    except OSError as exc:
        raise UserError(f"cannot use {db_file.parent} for the store: {exc.strerror}", file=ENV_HOME,
                        hint="point IDMCTL_HOME at a writable directory on local disk") from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_ENGINES: "weakref.WeakSet[Engine]" = weakref.WeakSet()
"""Every engine this process made and still holds (``_engine_for`` and ``_shared_engine`` cache them),
for :func:`dispose_engines`; weak, so an engine the caches evict is freed as before."""


def dispose_engines() -> None:
    """Close the pooled connections of every engine made here (a SQLite store's last close checkpoints its
    WAL into the store file), which ``idmctl.cli.main`` no longer leaves to the interpreter's shutdown."""
    for engine in list(_ENGINES):
        engine.dispose()


@lru_cache(maxsize=8)
def _engine_for(path: str) -> Engine:
    url = f"sqlite:///{path}"
    db_file = Path(path)
    if _stored_revision(db_file) != HEAD_REVISION:  # cheap check without the lock: the usual case
        with _init_lock(db_file):
            if not db_file.exists():
                seed_new_store(db_file)
            stored = _stored_revision(db_file)
            if stored is not None and stored not in known_revisions():
                raise UserError(f"the store is at schema {stored}, newer than this idmctl knows (head {HEAD_REVISION})",
                                file=str(db_file), hint="upgrade idmctl; the newer version wrote this store")
            if stored != HEAD_REVISION:
                try:
                    upgrade(url)
                except (SQLAlchemyDatabaseError, sqlite3.Error) as exc:
                    raise _unusable(db_file, exc) from exc
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
    event.listen(engine, "connect", _set_pragmas)
    _ENGINES.add(engine)
    return engine


@lru_cache(maxsize=8)
def _shared_engine(url: str) -> Engine:

    engine = open_shared(url)
    _ENGINES.add(engine)
    return engine


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
        except StaleDataError as exc:  # the ORM's UPDATE/DELETE matched 0 rows: one line, not a traceback
            db.rollback()
            raise RowRefused(f"error: the store changed nothing ({exc}); in a team's store a member changes only "
                             "their own jobs and chains (row-level security)") from exc
        except SQLAlchemyDatabaseError as exc:
            db.rollback()

            unusable = unusable_store(path or db_path(), str(exc.orig) if exc.orig is not None else str(exc))
            if unusable is not None:
                raise unusable from exc
            raise
        except BaseException:
            db.rollback()
            raise

"""The store: migrations create exactly the models' schema; WAL and busy timeout are on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel

from idmctl.record import db as store_db
from idmctl.record import models  # noqa: F401
from idmctl.record.migrate import MIGRATIONS_DIR


def test_migrations_from_empty_match_models(store_backend: str):
    engine = store_db.open_store()  # a new IDMCTL_HOME / a new PostgreSQL database: migrated from empty
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    assert diff == []
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == store_db.HEAD_REVISION


def test_head_revision_is_the_newest_migration(tmp_path: Path):
    versions = sorted(p.stem.split("_")[0] for p in (MIGRATIONS_DIR / "versions").glob("*.py"))
    assert versions[-1] == store_db.HEAD_REVISION
    store_db.open_store(tmp_path / "s.sqlite")
    row = sqlite3.connect(tmp_path / "s.sqlite").execute("select version_num from alembic_version").fetchone()
    assert row == (store_db.HEAD_REVISION,)


def test_wal_and_busy_timeout(tmp_path: Path):
    engine = store_db.open_store(tmp_path / "s.sqlite")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == store_db.BUSY_TIMEOUT_MS

"""A new SQLite store is a copy of an empty-schema template built once: whole or absent, never half."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from ground.sqlite_template import seed_from_template


def schema_of(path: Path) -> tuple[dict[str, list[str]], list[tuple[str]]]:
    """Each table's and index's definition as its sorted clauses, and the alembic revision. Sorted: two
    stores MLflow builds itself may list a table's constraints in another order (its batch migrations
    rebuild tables from sets, so the order follows the process's string hash seed)."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
        revision = db.execute("SELECT version_num FROM alembic_version").fetchall()
    clauses = {name: sorted(line.strip().rstrip(",").strip() for line in sql.splitlines()) for name, sql in rows}
    return clauses, revision


def _build_counting(calls: list[Path]):
    def build(path: Path) -> None:
        calls.append(path)
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("PRAGMA journal_mode=WAL")  # the template is made single-file whatever build left
            db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
            db.execute("INSERT INTO alembic_version VALUES ('0001')")
    return build


def test_the_template_is_built_once_and_every_new_store_is_a_whole_copy(tmp_path: Path) -> None:
    calls: list[Path] = []
    template = tmp_path / "cache" / "t.sqlite"
    assert seed_from_template(tmp_path / "a" / "s.sqlite", template, _build_counting(calls))
    assert seed_from_template(tmp_path / "b" / "s.sqlite", template, _build_counting(calls))
    assert len(calls) == 1 and calls[0] != template  # built under a temp name, then renamed
    assert sorted(p.name for p in template.parent.iterdir()) == ["t.sqlite"]
    with sqlite3.connect(template) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    for store in (tmp_path / "a" / "s.sqlite", tmp_path / "b" / "s.sqlite"):
        assert schema_of(store) == schema_of(template)
        assert sorted(p.name for p in store.parent.iterdir()) == ["s.sqlite"]


def test_an_existing_store_is_never_overwritten(tmp_path: Path) -> None:
    calls: list[Path] = []
    store = tmp_path / "s.sqlite"
    store.write_bytes(b"kept as it is")
    assert seed_from_template(store, tmp_path / "cache" / "t.sqlite", _build_counting(calls)) is False
    assert store.read_bytes() == b"kept as it is" and calls == []


def test_a_build_that_fails_leaves_no_template_and_no_store(tmp_path: Path) -> None:
    def broken(path: Path) -> None:
        path.write_bytes(b"half a database")
        raise sqlite3.OperationalError("disk I/O error")

    template = tmp_path / "cache" / "t.sqlite"
    assert seed_from_template(tmp_path / "s.sqlite", template, broken) is False
    assert list(template.parent.iterdir()) == [] and not (tmp_path / "s.sqlite").exists()


def test_a_cache_that_cannot_be_written_seeds_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache directory should be")
    calls: list[Path] = []
    assert seed_from_template(tmp_path / "s.sqlite", cache / "t.sqlite", _build_counting(calls)) is False
    assert not (tmp_path / "s.sqlite").exists()


def test_a_seeded_idmctl_store_is_the_one_alembic_migrates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from idmctl.record import db as store_db
    from idmctl.record.migrate import template_path, upgrade

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    migrated = tmp_path / "migrated.sqlite"
    upgrade(f"sqlite:///{migrated}")
    seeded = tmp_path / "home" / "idmctl.sqlite"
    store_db.open_store(seeded)
    assert template_path().parent == tmp_path / "cache" / "idmctl" and template_path().exists()
    assert schema_of(seeded) == schema_of(migrated)
    assert schema_of(seeded)[1] == [(store_db.HEAD_REVISION,)]
    # WAL already, as every connection of ours sets it: concurrent first connections switching a DELETE-mode
    # store at once get "database is locked" without a busy wait.
    with closing(sqlite3.connect(template_path())) as template:
        assert template.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert not Path(f"{template_path()}-wal").exists()


def test_an_unwritable_cache_still_gets_a_migrated_idmctl_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from idmctl.record import db as store_db

    (tmp_path / "cache").write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store_db.open_store(tmp_path / "home" / "idmctl.sqlite")
    with sqlite3.connect(tmp_path / "home" / "idmctl.sqlite") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchone() == (store_db.HEAD_REVISION,)

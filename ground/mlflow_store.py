"""The first opening of the MLflow SQLite store: one process at a time, and seeded from an empty schema.

MLflow builds a new SQLite store by running every one of its schema migrations (~2.9 s of CPU on 2 cores
for MLflow 3.17, ~65 tables) and opens an existing one in ~0.1 s. So the migrations run once per MLflow
version, into a template (ground/sqlite_template.py), and a new store starts as a copy of it: the same
tables and alembic revision MLflow itself would have written, with no experiment in it, so that MLflow
creates the default experiment on first open with this home's own artifact root, exactly as for a store
it built.

Importing MLflow is needed only to build the template; seeding a store from it is a file copy.
"""

from __future__ import annotations

import fcntl
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from ground.paths import home, mlflow_tracking_uri, user_cache_dir
from ground.sqlite_template import seed_from_template

SQLITE_PREFIX = "sqlite:///"
INIT_LOCK_NAME = ".mlflow-init.lock"


def template_path() -> Path:
    """The empty-schema template for the installed MLflow: one file per version, as migrations differ."""
    return user_cache_dir() / f"mlflow-{metadata.version('mlflow')}-empty-store.sqlite"


def sqlite_file(uri: str) -> Path | None:
    """The path behind a ``sqlite:///`` tracking URI (None for a server, PostgreSQL or another backend)."""
    return Path(uri[len(SQLITE_PREFIX):]) if uri.startswith(SQLITE_PREFIX) else None


def build_template(path: Path) -> None:
    """Run MLflow's migrations into ``path``, then delete the default experiment they created: its
    artifact location names the template's folder, and MLflow recreates it on a store's first open."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # heavy: only for a missing template

    store = SqlAlchemyStore(f"{SQLITE_PREFIX}{path}", str(path.parent / "unused-artifacts"))
    store.engine.dispose()
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM experiment_tags")
        db.execute("DELETE FROM experiments")


def seed_new_store(uri: str | None = None) -> bool:
    """Start a store that does not exist yet as a copy of the template (built first when missing).
    Returns whether it seeded; any store that exists, or that is not a SQLite file, is left to MLflow."""
    uri = uri or mlflow_tracking_uri()
    store = sqlite_file(uri)
    if store is None or "?" in uri or store == Path(":memory:"):
        return False
    return seed_from_template(store, template_path(), build_template)


@contextmanager
def store_init_lock() -> Iterator[None]:
    """Serialise first use of the MLflow SQLite store across processes, and seed a new store.

    MLflow runs its schema migrations on first connect; several jobs opening a new store at once
    crash inside them ("duplicate column name"). A flock beside the store makes the first one seed it
    while the others wait.
    """
    lock_path = home() / INIT_LOCK_NAME
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            seed_new_store()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

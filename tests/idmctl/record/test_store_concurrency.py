"""Sixteen processes opening one brand-new store at once: before the init lock, 8
concurrent `idmctl jobs` on a fresh IDMCTL_HOME crashed 31 of 80 times ("table chain already exists")."""

from __future__ import annotations

import os
import time
from pathlib import Path

import alembic.command  # noqa: F401  (imported before the fork: the children's first opens migrate at once)
import alembic.config  # noqa: F401
import pytest

from fork_support import failures_of, start_forked
from ground.contract import ENV_HOME
from idmctl.record.db import HEAD_REVISION, session
from idmctl.record.models import Fix
from slurm_support import wait_until

FIRST_OPENS = 16


def _open_and_write(start: Path, ready: Path) -> None:
    """One process's first open of the store, and a write: after the others are ready, at the same moment."""
    ready.touch()
    while not start.exists():
        time.sleep(0.005)
    with session() as db:
        db.add(Fix(note=f"writer {os.getpid()}"))


@pytest.mark.slow
def test_sixteen_simultaneous_first_opens_all_succeed_and_every_write_lands(idmctl_home: Path, tmp_path: Path,
                                                                          store_backend: str):
    # Sixteen processes forked from this one, which has imported SQLAlchemy, Alembic and the store's modules
    # but opened no store: each makes its own engine and connection, and all of them first-open the store
    # at once (a fresh interpreter each spent ~1 s of CPU importing that; seen in the suite: 31 s for both
    # backends). A start file holds them back until the last one is ready.
    start, ready = tmp_path / "go", tmp_path / "ready"
    ready.mkdir()
    children = [start_forked(lambda k=k: _open_and_write(start, ready / str(k)), f"first open {k}",
                             output=tmp_path / f"open{k}.log", env={ENV_HOME: str(idmctl_home)})
                for k in range(FIRST_OPENS)]
    wait_until(lambda: len(list(ready.iterdir())) == FIRST_OPENS, 240, f"{FIRST_OPENS} forked processes to be ready")
    start.touch()
    failures = failures_of(children)
    assert not failures, f"{len(failures)} of {FIRST_OPENS} first opens failed; the first in full:\n{failures[0]}"
    # The same on SQLite (init lock) and on the team's PostgreSQL (advisory lock; IDMCTL_DB_URL is inherited).
    from sqlalchemy import text

    from idmctl.record.db import open_store

    with open_store().connect() as connection:
        assert connection.execute(text("SELECT version_num FROM alembic_version")).fetchall() == [(HEAD_REVISION,)]
        assert connection.execute(text("SELECT count(*) FROM fix")).scalar() == FIRST_OPENS

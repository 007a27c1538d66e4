"""Sixteen processes opening one brand-new store at once: before the init lock, 8
concurrent `idmctl jobs` on a fresh IDMCTL_HOME crashed 31 of 80 times ("table chain already exists")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ground.contract import ENV_HOME

from idmctl.record.db import HEAD_REVISION
from slurm_support import wait_until

FIRST_OPENS = 16
# Every process waits on a shared start file so that all of them open the store at the same moment
# (process start-up on 2 shared cores otherwise spreads them over seconds).
OPEN_AND_WRITE = """
import os, sys, time
import alembic.command, alembic.config
from idmctl.record.db import session
from idmctl.record.models import Fix
start = sys.argv[1]
open(sys.argv[2], "w").close()
while not os.path.exists(start):
    time.sleep(0.005)
with session() as db:
    db.add(Fix(note=f"writer {os.getpid()}"))
print("ok")
"""


@pytest.mark.slow
def test_sixteen_simultaneous_first_opens_all_succeed_and_every_write_lands(idmctl_home: Path, tmp_path: Path,
                                                                          store_backend: str):
    start = tmp_path / "go"
    env = {**os.environ, ENV_HOME: str(idmctl_home), "PYTHONPATH": str(Path(__file__).parents[3])}
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AND_WRITE, str(start), str(ready / str(k))], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(FIRST_OPENS)]
    wait_until(lambda: len(list(ready.iterdir())) == FIRST_OPENS, 240, f"{FIRST_OPENS} processes to import idmctl")
    start.touch()
    results = [proc.communicate(timeout=300) for proc in procs]
    failures = [err.strip() for proc, (out, err) in zip(procs, results) if proc.returncode != 0]
    assert not failures, (f"{len(failures)} of {FIRST_OPENS} first opens failed; last lines: "
                          f"{[failure.splitlines()[-1:] for failure in failures[:3]]}; the first in full:\n{failures[0]}")
    # The same on SQLite (init lock) and on the team's PostgreSQL (advisory lock; IDMCTL_DB_URL is inherited).
    from sqlalchemy import text

    from idmctl.record.db import open_store

    with open_store().connect() as connection:
        assert connection.execute(text("SELECT version_num FROM alembic_version")).fetchall() == [(HEAD_REVISION,)]
        assert connection.execute(text("SELECT count(*) FROM fix")).scalar() == FIRST_OPENS

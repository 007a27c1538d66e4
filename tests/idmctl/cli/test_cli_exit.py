"""``idmctl.cli.main`` freezes the heap instead of letting the interpreter garbage-collect it at exit,
so it closes the store connections itself first: a finished command leaves the store file
whole, its WAL checkpointed and removed, exactly as the interpreter's last collection used to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ground.contract import ENV_HOME

REPO = Path(__file__).resolve().parents[3]


def _leftovers(home: Path) -> list[str]:
    return sorted(p.name for p in home.glob("idmctl.sqlite-*"))


def test_closing_the_open_stores_checkpoints_both_paths(idmctl_home: Path) -> None:
    from sqlmodel import select

    from ground.paths import db_path
    from idmctl.record import close_open_stores, session
    from idmctl.record.fast import connect
    from idmctl.record.models import Job

    with session() as db:  # the ORM path creates and migrates the store, and puts it in WAL mode
        assert db.exec(select(Job)).all() == []
    with connect() as fast:  # plain sqlite3 on a store at head
        assert fast is not None
        fast.execute("CREATE TABLE IF NOT EXISTS exit_probe (x INTEGER)")
        fast.execute("INSERT INTO exit_probe VALUES (1)")
    assert db_path().exists() and _leftovers(idmctl_home), "a WAL store with open connections has its -wal file"
    close_open_stores()
    assert _leftovers(idmctl_home) == []


def test_a_finished_command_leaves_no_wal_beside_the_store(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, ENV_HOME: str(home), "PYTHONPATH": str(REPO)}
    for run in ("creates the store (ORM)", "records through sqlite3"):
        done = subprocess.run([sys.executable, "-m", "idmctl", "preflight", "latent_c_n4", "--cluster", "card",
                               "--no-smoke", "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        assert done.returncode in (0, 1), done.stderr[-2000:]
        assert (home / "idmctl.sqlite").exists()
        assert _leftovers(home) == [], f"after the run that {run}: {_leftovers(home)}"

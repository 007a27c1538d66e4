"""The team's shared store (IDMCTL_DB_URL=postgresql://…) on the real PostgreSQL that
scripts/postgres/up.sh starts, beside the embedded SQLite store: concurrent writers as two users with
nothing lost, the submit path (sqlite3 on SQLite) going through the ORM, ``--user`` filters, and the
one-line errors for a store that cannot be used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlmodel import select

from fork_support import failures_of, start_forked
from ground.contract import ENV_DB_URL, ENV_HOME
from idmctl.record import db as store_db
from idmctl.record import session
from idmctl.record.models import Chain, Failure, Job
from slurm_support import wait_until

REPO = Path(__file__).resolve().parents[3]
WRITERS = 8
JOBS_EACH = 15


def _write(start: Path, ready: Path, jobs: int) -> None:
    """One writer: ready, then at the start signal ``jobs`` chains, each with a failed job and its failure."""
    from datetime import datetime, timezone

    ready.touch()
    while not start.exists():
        time.sleep(0.005)
    for k in range(jobs):
        with session() as db:
            chain = Chain(experiment="shared", spec_hash=f"h{os.getpid()}")
            db.add(chain)
            db.flush()
            job = Job(chain_id=chain.id, experiment="shared", scheduler_id=f"{os.getpid()}-{k}", state="FAILED",
                      exit_code="1:0", started_at=datetime.now(timezone.utc), ended_at=datetime.now(timezone.utc))
            db.add(job)
            db.flush()
            db.add(Failure(job_id=job.id, cause="python_exception", evidence=f"writer {os.getpid()} job {k}"))


def _as(user: str) -> dict[str, str]:
    # getpass.getuser() reads LOGNAME first, then USER: how two people on one login node differ here.
    return {**os.environ, "LOGNAME": user, "USER": user, "PYTHONPATH": str(REPO)}


def test_eight_writers_as_two_users_lose_nothing(store_backend: str, idmctl_home: Path, tmp_path: Path, cli) -> None:
    start, ready = tmp_path / "go", tmp_path / "ready"
    ready.mkdir()
    # Every writer's open is a first open of an empty store: migrations from empty under concurrency
    # (SQLite: the init lock, without which concurrent first opens crashed with "table chain already exists";
    # PostgreSQL: an advisory lock).
    # Forked from this process (the store's modules imported, no store opened): real processes with their
    # own engines and connections, without ~1 s of imports each.
    users = ["alice", "bob"] * (WRITERS // 2)
    writers = [start_forked(lambda k=k: _write(start, ready / str(k), JOBS_EACH), f"writer {k} ({user})",
                            output=tmp_path / f"writer{k}.log", env={"LOGNAME": user, "USER": user})
               for k, user in enumerate(users)]
    wait_until(lambda: len(list(ready.iterdir())) == WRITERS, 240, f"{WRITERS} forked writers to be ready")
    start.touch()
    failed = failures_of(writers)
    assert not failed, f"{len(failed)} of {WRITERS} writers failed; the first:\n{failed[0]}"
    with session() as db:
        jobs = db.exec(select(Job)).all()
        failures = db.exec(select(Failure)).all()
    assert len(jobs) == len({job.scheduler_id for job in jobs}) == WRITERS * JOBS_EACH
    assert len(failures) == WRITERS * JOBS_EACH
    assert Counter(job.user for job in jobs) == {"alice": 4 * JOBS_EACH, "bob": 4 * JOBS_EACH}
    assert {job.host for job in jobs} == {os.uname().nodename}
    assert (store_backend == "sqlite") == (idmctl_home / "idmctl.sqlite").exists()

    listed = json.loads(cli("jobs", "--user", "bob", "--limit", "1000", "--json").output)
    assert len(listed) == 4 * JOBS_EACH and {row["user"] for row in listed} == {"bob"}
    rows = json.loads(cli("failures", "--user", "alice", "--json").output)
    assert len(rows) == 4 * JOBS_EACH and {row["user"] for row in rows} == {"alice"}
    assert json.loads(cli("ledger", "--user", "carol", "--json").output)["groups"] == []
    assert json.loads(cli("ledger", "--user", "alice", "--json").output)["total"]["runs"] == 4 * JOBS_EACH


PROBE = """
import json, runpy, sys
sys.argv = ["idmctl", *sys.argv[1:]]
try:
    runpy.run_module("idmctl", run_name="__main__")
except SystemExit as exc:
    pass
"""


def test_submit_to_the_shared_store_goes_through_the_orm(store_backend: str, tiny_cache, idmctl_home: Path) -> None:
    """On SQLite submit writes with sqlite3 (idmctl/record/fast.py); with IDMCTL_DB_URL every row must
    reach PostgreSQL instead, stamped with who submitted it."""
    if store_backend != "postgresql":
        pytest.skip("the SQLite submit path is tests/idmctl/record/test_submit_fast_store.py")
    from ground.spec.loader import load_spec
    from idmctl.record.preflights import code_version, record_run
    from idmctl.core.profile import load_profile
    from idmctl.record.models import SpecVersion

    spec = str(tiny_cache.spec_path)
    resolved = load_spec(spec)
    profile, profile_hash = load_profile("local")
    passed = record_run(resolved, profile.name, profile_hash, code_version(), [], with_smoke=True, seconds=0.1,
                        job={"smoke_flags": {"--entry": "tests.jobs_entry"}})
    env = {**_as("carol"), ENV_HOME: str(idmctl_home), "IDMCTL_TEST_BEHAVIOR": "steps:1:0.01"}
    done = subprocess.run([sys.executable, "-c", PROBE, "submit", spec, "--entry", "tests.jobs_entry", "--json"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    submitted = json.loads(done.stdout)
    with session() as db:
        job = db.get(Job, submitted["job"])
        chain = db.get(Chain, submitted["chain"])
        version = db.get(SpecVersion, resolved.hash)
    assert (job.state, job.preflight_id, job.user, chain.user) == ("PENDING", passed.id, "carol", "carol")
    assert version is not None and chain.spec_hash == resolved.hash and version.user == "carol"
    assert not (idmctl_home / "idmctl.sqlite").exists()


def _one_line_error(cli, *args: str) -> str:
    result = cli(*args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize("command", [("jobs",), ("failures",), ("ledger",)])
def test_unreachable_server_is_one_line_naming_the_url_without_its_password(cli, monkeypatch, command) -> None:
    monkeypatch.setenv(ENV_DB_URL, "postgresql://team:s3cret@127.0.0.1:1/idmctl")
    line = _one_line_error(cli, *command)
    assert line.startswith(f"error: {ENV_DB_URL}: cannot use the shared store (")
    assert "postgresql://***@127.0.0.1:1/idmctl" in line and "s3cret" not in line
    assert "check the server is up" in line


def test_wrong_password_and_wrong_scheme(cli, monkeypatch) -> None:
    from pg_support import server_url
    from sqlalchemy.engine import make_url

    wrong = make_url(server_url()).set(password="not-the-password").render_as_string(hide_password=False)
    monkeypatch.setenv(ENV_DB_URL, wrong)
    line = _one_line_error(cli, "jobs")
    assert "password authentication failed" in line and "not-the-password" not in line and "://***@" in line
    monkeypatch.setenv(ENV_DB_URL, "mysql://team:s3cret@db/idmctl")
    assert _one_line_error(cli, "failures") == (
        f"error: {ENV_DB_URL}: not a PostgreSQL URL: mysql://***@db/idmctl (use "
        "postgresql://USER:PASSWORD@HOST:PORT/DB, or unset it for the SQLite store in IDMCTL_HOME)")


def test_a_store_from_a_newer_schema_is_refused(cli, store_backend: str) -> None:
    if store_backend != "postgresql":
        pytest.skip("the SQLite case is in the bad-input corpus (store_newer_schema)")
    with store_db.open_store().begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    store_db._shared_engine.cache_clear()
    line = _one_line_error(cli, "jobs")
    assert "the shared store is at schema 0999, newer than this idmctl knows" in line
    assert "upgrade idmctl to the team's version" in line and "://***@" in line


@pytest.mark.slow
def test_trainer_logs_to_a_shared_mlflow_server_backed_by_postgresql(tiny_cache, tmp_path: Path, monkeypatch) -> None:
    """`idmctl ui`'s server on a PostgreSQL backend (the team's `mlflow` database: MLflow keeps its own
    alembic_version, so never the store's database), the real trainer logging to it over HTTP, and
    compare reading the run straight from PostgreSQL."""
    from ground.spec.loader import load_spec
    from ground.run_dir import write_run_spec
    from idmctl.track.compare import load_runs
    from idmctl.track.mlflow_server import backend_store_uri, start_server
    from net_support import free_port
    from pg_support import fresh_database

    with fresh_database() as mlflow_db:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_db)
        assert backend_store_uri() == mlflow_db
        server = start_server("127.0.0.1", free_port(), ready_timeout_s=120)
        try:
            run_dir = tmp_path / "shared_run"
            write_run_spec(run_dir, load_spec(str(tiny_cache.spec_file(tmp_path / "specs", "shared_run",
                                                                       train={"steps": 4, "log_every": 1}))))
            env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": server.local_url}
            done = subprocess.run([sys.executable, "-m", "trainers.train", "--run-dir", str(run_dir)],
                                  capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
        finally:
            server.stop()
        [row] = load_runs(tracking_uri=mlflow_db)
        assert row.name == "shared_run" and row.steps_done == 4 and row.metrics["loss"].points == 4

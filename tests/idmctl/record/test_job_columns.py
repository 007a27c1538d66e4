"""Migration 0003: a store written at 0002 (every per-job fact a key of ``options_json``) keeps every
fact when it moves to the typed columns, reads them back through the record's functions, and a
downgrade folds them back into ``options_json`` as they were. On SQLite and on the real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlmodel import SQLModel

from ground.contract import ENV_DB_URL
from ground.paths import db_path
from idmctl.record import db as store_db
from idmctl.record.fast import JOB_JSON_COLUMNS, close_all
from idmctl.record.jobs import job_by_id, unfinished_job_rows
from idmctl.record.migrate import MIGRATIONS_DIR
from idmctl.record.models import Job, StoredJSON
from idmctl.record.store import store
from idmctl.record.stored_json import eval_link, job_options, newest_efficiency

REQUEST = {"job_name": "tiny", "qos": "share", "partition": "cpu", "nodes": 1, "ranks_per_node": 2, "mem": "1500MB",
           "time_limit": "0:20:00", "retries": 2, "build": False, "rollback": False}
FACTS = {
    "admitted": {"admission": {"failed": [], "preflight_id": 3}, "cluster": "local", "job": {"changed": ["--qos"]}},
    "code": {"version": "abc123", "directory": "/snap/abc123", "store": "/snap", "env_digest": "e0", "commit": None},
    "runs": [{"state": "PREEMPTED", "exit_code": "0:15"}, {"state": "COMPLETED", "exit_code": "0:0"}],
    "efficiency": {"job": "57", "cpu_efficiency": 0.5, "suggestions": []},
    "committed_step": {"step": 40, "source": "checkpoints/step-40.ckpt", "last_step": 44},
    "controller": {"scheduler_id": "58", "after": "57", "submitted_at": "2026-12-01T10:00:00+00:00",
                   "last_run": {"at": "2026-12-01T10:05:00+00:00", "result": "sync ok", "ok": True}},
    "end_recorded": {"by": "n1:4242", "at": "2026-12-01T10:04:00+00:00"},
    "notified": {"failed": "2026-12-01T10:04:01+00:00"},
    "derived_exit_code": "0:0",
}
LINK = {"of_chain": 1, "step": 40, "after": "57", "choice": "each", "replaces": 2, "moved_to": 4}


def _config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url)
    return config


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The URL of an empty store; the record's functions use it (IDMCTL_DB_URL for PostgreSQL)."""
    if request.param == "sqlite":
        db_path().parent.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{db_path()}"
        return
    from pg_support import fresh_database

    with fresh_database() as url:
        monkeypatch.setenv(ENV_DB_URL, url)
        yield url


def _rows(url: str) -> dict[int, dict]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return {row["id"]: dict(row) for row in connection.execute(sa.text("SELECT * FROM job")).mappings()}
    finally:
        engine.dispose()


def _write_0002_store(url: str) -> dict[int, dict]:
    """A store at 0002 with a chain, a training job carrying every fact, an eval job carrying the link,
    a bare job, and a job whose options are damaged; returns each job's options_json as written."""
    command.upgrade(_config(url), "0002")
    written = {1: {**REQUEST, **FACTS}, 2: {**REQUEST, "eval": LINK}, 3: {}, 4: None}
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO chain (id, experiment, spec_hash, retries_budget, retries_used, "
                                       "status, created_at) VALUES (1, 'tiny', 'h', 2, 0, 'ACTIVE', :now)"),
                               {"now": "2026-12-01 10:00:00"})
            for job_id, options in written.items():
                text = '{"mem": "1' if options is None else json.dumps(options)
                connection.execute(sa.text(
                    "INSERT INTO job (id, chain_id, attempt, experiment, executor, state, restarts, options_json, "
                    "imported, created_at, updated_at) VALUES (:id, 1, :id, 'tiny', 'slurm', :state, 0, :options, "
                    ":imported, :now, :now)"),
                    {"id": job_id, "state": "RUNNING" if job_id == 3 else "COMPLETED", "options": text,
                     "imported": False, "now": "2026-12-01 10:00:00"})
    finally:
        engine.dispose()
    return {job_id: _rows(url)[job_id]["options_json"] for job_id in written}


def _fresh_engines() -> None:
    store_db.dispose_engines()
    store_db._engine_for.cache_clear()
    store_db._shared_engine.cache_clear()
    close_all()


def test_every_fact_moves_to_its_column_and_back(store_url: str) -> None:
    before = _write_0002_store(store_url)
    command.upgrade(_config(store_url), "head")
    _fresh_engines()
    with store_db.session() as db:
        trained, evaluated, bare = db.get(Job, 1), db.get(Job, 2), db.get(Job, 3)
        assert job_options(trained.options_json, 1) == REQUEST  # the submission request only
        for name, value in FACTS.items():
            assert getattr(trained, name) == value, name
        assert eval_link(trained) is None and eval_link(bare) is None
        assert eval_link(evaluated) == LINK
        assert (evaluated.eval_of_chain, evaluated.eval_step) == (1, 40)
        assert [job.id for job in store().eval_jobs(1)] == [2] and store().eval_jobs(2) == []
        assert all(getattr(bare, name) is None for name in FACTS)
        assert job_options(bare.options_json, 3) == {}
    # The claims read their own column: the end claimed at 0002 stays claimed, the bare job's is free.
    jobs = store()
    assert not jobs.claim_end(1)
    assert jobs.claim_end(3)
    with store_db.session() as db:
        assert db.get(Job, 3).end_recorded["by"]
    jobs = store()
    assert not jobs.claim_notice(1, "failed")
    assert jobs.claim_notice(1, "completed")
    assert not jobs.claim_notice(1, "completed")
    assert set(jobs.job(1).notified) == {"failed", "completed"}  # type: ignore[union-attr]
    kept = unfinished_job_rows()  # what the code snapshots' collector keeps: job 1 belongs to an ACTIVE chain
    (holding,) = [row for row in kept if FACTS["code"]["directory"] in row]
    assert holding.startswith('{"id": 1,')
    trained = store().job(1)
    assert trained is not None and (trained.admitted, trained.code) == (FACTS["admitted"], FACTS["code"])
    if store_url.startswith("sqlite"):  # the plain-sqlite3 fast path parses the same columns
        fast = job_by_id(1)
        assert {name: getattr(fast, name) for name in FACTS if name != "notified"} == {
            name: value for name, value in FACTS.items() if name != "notified"}
        assert set(fast.notified) == {"failed", "completed"}
        assert eval_link(job_by_id(2)) == LINK
        assert newest_efficiency("tiny") == FACTS["efficiency"]
    _fresh_engines()
    command.downgrade(_config(store_url), "0002")
    after = _rows(store_url)
    folded = json.loads(after[1]["options_json"])
    claimed_at = folded["notified"].pop("completed")  # the notice claimed at 0003 folds back with the rest
    assert claimed_at and folded == json.loads(before[1])
    assert json.loads(after[2]["options_json"]) == json.loads(before[2])
    assert json.loads(after[3]["options_json"])["end_recorded"]["by"]  # the claim made at 0003 is kept too
    assert after[4]["options_json"] == before[4]  # damaged text is left as it was, both ways
    assert "admitted" not in after[1] and "eval_of_chain" not in after[2]


def test_the_fast_paths_json_columns_are_the_models() -> None:
    table = SQLModel.metadata.tables["job"]
    assert JOB_JSON_COLUMNS == {column.name for column in table.columns if isinstance(column.type, StoredJSON)}


def test_a_claim_is_sql_null_until_made() -> None:
    """The JSON columns keep Python None as SQL NULL (not the JSON text null): the claims' IS NULL needs it."""
    with store_db.session() as db:
        job = Job(experiment="tiny", state="COMPLETED")
        db.add(job)
        db.flush()
        job_id = job.id
    close_all()
    rows = _rows(f"sqlite:///{db_path()}")
    assert rows[job_id]["end_recorded"] is None and rows[job_id]["runs"] is None
    assert store().claim_end(job_id) and not store().claim_end(job_id)

"""Training never dies of tracking: the trainer's RunLogger against a real ``mlflow server``
stopped and started again while it logs, a server that is not there when the run starts, a full spool,
and a record MLflow refuses. The Slurm test (a real training job across a real outage) is
tests/idmctl/ops/test_slurm_tracking_outage.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ground import tracking as names
from ground.contract import ENV_TRACKING_SPOOL_MAX_BYTES, MLFLOW_RUN_ID_FILE
from ground.tracking_spool import (Spool, create_record, flush_spool, metrics_record, spool_status,
                                   status_record)
from net_support import free_port
from slurm_support import wait_until

UNREACHABLE = "spooling to"
BACK = "tracking server answers again"


def _spec(tiny_cache):  # type: ignore[no-untyped-def]
    from ground.spec import load_spec

    return load_spec(str(tiny_cache.spec_path))


def _server(port: int):  # type: ignore[no-untyped-def]
    """The real ``mlflow server`` (idmctl ui's) on $IDMCTL_HOME's SQLite store."""
    from idmctl.track.mlflow_server import start_server

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the server serves the home's store
        return start_server(port=port)


def _client(uri: str):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _history(uri: str, run_id: str, key: str = names.M_LOSS) -> list[tuple[int, int]]:
    """(timestamp, step) of a metric's points as MLflow keeps them."""
    return [(p.timestamp, p.step) for p in _client(uri).get_metric_history(run_id, key)]


def _steps(uri: str, run_id: str) -> list[int]:
    """The metric's steps in timestamp order: in order iff they come out sorted."""
    return [step for _, step in sorted(_history(uri, run_id))]


@pytest.mark.slow
def test_server_stopped_and_restarted_while_logging_loses_nothing(tiny_cache, idmctl_home: Path, tmp_path: Path,
                                                                    monkeypatch, capfd) -> None:
    from trainers.tracking import RunLogger

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _server(port)
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        resolved, run_dir = _spec(tiny_cache), tmp_path / "run"
        logger = RunLogger(run_dir, resolved.name, resolved.hash, resolved.canonical, "v1")
        logger.start_attempt(0)
        for step in range(1, 6):
            logger.log_metrics({names.M_LOSS: 1.0 / step}, step)
        run_id = wait_until(lambda: logger.run_id, 60, "the run's creation to reach the server")
        wait_until(lambda: len(_history(uri, run_id)) == 5, 60, "steps 1..5 in MLflow while the server is up")

        server.stop()
        calls = []
        for step in range(6, 21):
            started = time.perf_counter()
            logger.log_metrics({names.M_LOSS: 1.0 / step}, step)
            calls.append(time.perf_counter() - started)
            if step == 8:
                wait_until(lambda: logger._shipper.backoff is not None, 30, "the shipper to notice the stopped server")
        assert max(calls) < 1.0, calls  # no call waited on the network (a timed-out request takes 5 s)
        assert Spool(run_dir).pending_records() == 15  # steps 6..20, none sent
        status = spool_status(run_dir)
        assert status is not None and status.facts.outage_since is not None
        assert "not yet in MLflow since" in (status.describe() or "")

        server = _server(port)
        wait_until(lambda: len(_history(uri, run_id)) == 20, 90,
                   lambda: f"steps 6..20 to reach the restarted server (have {_steps(uri, run_id)})")
        logger.finish("FINISHED")
        assert _steps(uri, run_id) == list(range(1, 21))
        assert _client(uri).get_run(run_id).info.status == "FINISHED"
        assert [p.step for p in _client(uri).get_metric_history(run_id, names.M_ATTEMPT_START)] == [0]
        err = capfd.readouterr().err
        assert 1 <= err.count(UNREACHABLE) == err.count(BACK) < 15, err  # once per outage, not per logged step
        assert Spool(run_dir).pending_records() == 0 and spool_status(run_dir).describe() is None
    finally:
        server.stop()


@pytest.mark.slow
def test_server_down_at_the_first_attempt_start_is_created_later_by_flush_spool(
        tiny_cache, idmctl_home: Path, tmp_path: Path, monkeypatch, capfd) -> None:
    from trainers.tracking import RunLogger

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    resolved, run_dir = _spec(tiny_cache), tmp_path / "run"
    started = time.perf_counter()
    logger = RunLogger(run_dir, resolved.name, resolved.hash, resolved.canonical, "v1")
    logger.start_attempt(0)
    for step in (1, 2, 3):
        logger.log_metrics({names.M_LOSS: float(step)}, step)
    logger.set_tag(names.TAG_FAILURE_CAUSE, "none")
    logger.finish("FINISHED")
    assert time.perf_counter() - started < 60  # connection refused answers at once: no retries, no backoff
    err = capfd.readouterr().err
    assert err.count(UNREACHABLE) == 1 and "tracking records stay spooled" in err, err
    assert not (run_dir / MLFLOW_RUN_ID_FILE).exists()
    status = spool_status(run_dir)
    assert status is not None and status.pending_records == 8  # create, tags, start, 3 × metrics, tag, status
    assert status.facts.unflushed_at is not None and status.facts.unflushed_records == 8
    assert "a job exited with 8 unflushed" in (status.describe() or "")

    server = _server(port)
    try:
        result = flush_spool(run_dir)  # as the controller or sync calls it
        assert (result.sent, result.refused, result.pending, result.error) == (8, 0, 0, None)
        run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
        run = _client(uri).get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.tags[names.TAG_CODE_VERSION] == "v1"
        assert run.data.tags[names.TAG_FAILURE_CAUSE] == "none"
        assert run.data.params[names.P_TRAIN_STEPS] == str(resolved.canonical["train"]["steps"])
        assert _steps(uri, run_id) == [1, 2, 3]
        assert spool_status(run_dir).describe() is None
        assert flush_spool(run_dir).sent == 0  # nothing sent twice
    finally:
        server.stop()


def test_full_spool_keeps_the_oldest_in_order_counts_the_dropped_and_keeps_control_records(
        tmp_path: Path, monkeypatch) -> None:
    spool = Spool(tmp_path)
    one = len(json.dumps(metrics_record({"loss": 1.0}, 1, stamp_ms=0), separators=(",", ":"))) + 1
    monkeypatch.setenv(ENV_TRACKING_SPOOL_MAX_BYTES, str(3 * one))
    for step in range(1, 7):
        spool.append(metrics_record({"loss": 1.0}, step, stamp_ms=0))
    spool.append(status_record("FINISHED"))
    lines = [json.loads(line) for line in spool.path.read_text().splitlines()]
    assert [r["metrics"][0][3] for r in lines[:-1]] == [1, 2, 3] and lines[-1]["op"] == "status"
    facts = spool.facts()
    assert (facts.dropped_records, facts.dropped_points, facts.dropped_steps) == (3, 3, [4, 6])
    assert "3 metric points dropped (spool full, steps 4..6)" in spool_status(tmp_path).describe()


def test_a_record_mlflow_refuses_is_skipped_and_counted_the_rest_is_sent(tmp_path: Path, idmctl_home: Path) -> None:
    """On the default SQLite store (no server): an invalid metric name is refused for good."""
    from ground.paths import mlflow_artifacts_dir, mlflow_tracking_uri

    run_dir = tmp_path / "run"
    Spool(run_dir).append(
        create_record("exp", "exp#1", {}, [("a", "1")], mlflow_artifacts_dir().as_uri(), ["loss"], None),
        metrics_record({"bad/../name": 1.0}, 1), metrics_record({"loss": 2.0}, 2), status_record("FINISHED"))
    # The two metrics records merge into one request; MLflow refuses it; they go again one by one.
    result = flush_spool(run_dir)
    assert (result.sent, result.refused, result.pending) == (3, 1, 0), result
    facts = Spool(run_dir).facts()
    assert facts.refused_records == 1 and facts.last_refusal.startswith("metrics: "), facts
    assert [p.step for p in _client(mlflow_tracking_uri()).get_metric_history(
        (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip(), "loss")] == [2]
    run = _client(mlflow_tracking_uri()).get_run((run_dir / MLFLOW_RUN_ID_FILE).read_text().strip())
    assert run.info.status == "FINISHED" and run.data.params == {"a": "1"}


def test_a_later_attempt_sends_the_earlier_attempts_spool_first(tiny_cache, idmctl_home: Path, tmp_path: Path,
                                                                 monkeypatch) -> None:
    """Attempt 1 logs while its server never answers (a port with nothing on it) and exits with its records
    spooled; attempt 2 reaches a store (the home's SQLite): attempt 1's records go first, in order."""
    from ground.paths import mlflow_tracking_uri
    from trainers.tracking import RunLogger

    resolved, run_dir = _spec(tiny_cache), tmp_path / "run"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    first = RunLogger(run_dir, resolved.name, resolved.hash, resolved.canonical, "v1")
    first.start_attempt(0)
    for step in (1, 2, 3):
        first.log_metrics({names.M_LOSS: float(step)}, step)
    first.finish("KILLED")
    assert Spool(run_dir).pending_records() == 7 and not (run_dir / MLFLOW_RUN_ID_FILE).exists()

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    second = RunLogger(run_dir, resolved.name, resolved.hash, resolved.canonical, "v2")
    second.start_attempt(2)
    for step in (3, 4):
        second.log_metrics({names.M_LOSS: float(step) + 0.5}, step)
    second.finish("FINISHED")
    client = _client(mlflow_tracking_uri())
    run_id = second.run_id
    assert run_id is not None and client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(run_id).data.tags[names.TAG_CODE_VERSION] == "v2"  # the later attempt's tag wins
    points = sorted((p.timestamp, p.step, p.value) for p in client.get_metric_history(run_id, names.M_LOSS))
    assert [(step, value) for _, step, value in points] == [(1, 1.0), (2, 2.0), (3, 3.0), (3, 3.5), (4, 4.5)]
    starts = client.get_metric_history(run_id, names.M_ATTEMPT_START)
    assert sorted((p.step, p.value) for p in starts) == [(0, 1.0), (2, 2.0)]
    surviving = names.surviving([(t, s, v) for t, s, v in points], [(p.timestamp, p.step) for p in starts])
    assert surviving == [(1, 1.0), (2, 2.0), (3, 3.5), (4, 4.5)]
    assert spool_status(run_dir).describe() is None


def test_the_limit_counts_only_what_waits_not_what_was_sent(tmp_path: Path, monkeypatch, idmctl_home: Path) -> None:
    """Bytes already in MLflow but not yet truncated (the spool empties only once every line is sent) do not
    count against the limit."""
    from ground.paths import mlflow_artifacts_dir

    spool = Spool(tmp_path)
    one = len(json.dumps(metrics_record({"loss": 1.0}, 1, stamp_ms=0), separators=(",", ":"))) + 1
    spool.append(create_record("exp", "exp#1", {}, [], mlflow_artifacts_dir().as_uri(), ["loss"], None))
    for step in range(1, 4):
        spool.append(metrics_record({"loss": 1.0}, step, stamp_ms=0))
    assert flush_spool(tmp_path).sent == 4 and spool.path.stat().st_size == 0  # all sent: emptied
    for step in range(4, 7):
        spool.append(metrics_record({"loss": 1.0}, step, stamp_ms=0))
    spool.update_facts(sent_bytes=2 * one)  # as if a flusher had sent steps 4 and 5 and not truncated yet
    monkeypatch.setenv(ENV_TRACKING_SPOOL_MAX_BYTES, str(2 * one))
    assert spool.append(metrics_record({"loss": 1.0}, 7, stamp_ms=0)) == 0  # 1 line waits: a second fits
    assert spool.append(metrics_record({"loss": 1.0}, 8, stamp_ms=0)) == 1  # a third would not

"""sync sends what an ended job left in its tracking spool (a chain's last attempt has no later attempt to
do it), and says in one line what is still spooled while the tracking server does not answer; `jobs show`
says what the spool holds."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ground.contract import MLFLOW_RUN_ID_FILE
from ground.paths import mlflow_artifacts_dir, mlflow_tracking_uri
from ground.tracking_spool import Spool, create_record, metrics_record, spool_status
from idmctl.ops.sync import PENDING_SPOOLS, _flush_tracking


def _spooled_run(run_dir: Path) -> Spool:
    run_dir.mkdir(parents=True)
    spool = Spool(run_dir)
    spool.append(create_record("exp", "exp#1", {}, [("a", "1")], mlflow_artifacts_dir().as_uri(), ["loss"], None),
                 *(metrics_record({"loss": 1.0 / step}, step) for step in range(1, 6)))
    return spool


def test_an_ended_jobs_spool_reaches_mlflow_at_sync(idmctl_home: Path, caplog) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = idmctl_home / "runs" / "exp" / "1"
    _spooled_run(run_dir)
    job = SimpleNamespace(id=1, script_path=str(run_dir / "attempt-1.sbatch"))
    _flush_tracking([job])  # type: ignore[list-item]
    run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    history = MlflowClient(tracking_uri=mlflow_tracking_uri()).get_metric_history(run_id, "loss")
    assert [point.step for point in history] == [1, 2, 3, 4, 5]
    status = spool_status(run_dir)
    assert status is None or status.describe() is None  # nothing left to say in `jobs show`
    assert _warnings(caplog) == []


def _warnings(caplog) -> list[str]:  # type: ignore[no-untyped-def]
    return [record.getMessage() for record in caplog.records if record.name == "idmctl"]


def test_a_tracking_server_that_does_not_answer_leaves_the_records_and_one_line(idmctl_home: Path, monkeypatch,
                                                                                caplog) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing listens
    run_dir = idmctl_home / "runs" / "exp" / "2"
    _spooled_run(run_dir)
    job = SimpleNamespace(id=2, script_path=str(run_dir / "attempt-1.sbatch"))
    _flush_tracking([job])  # type: ignore[list-item]
    lines = _warnings(caplog)
    assert len(lines) == 1 and lines[0].startswith("warning: job 2: 6 tracking record(s) still spooled in "), lines
    assert "a later sync sends them" in lines[0]
    status = spool_status(run_dir)
    assert status is not None and "6 records spooled" in status.describe()
    # The job is not polled again once recorded: the next sync finds its spool on the pending list, says
    # nothing more while the server is still away, and sends it once the server answers.
    _flush_tracking([])
    assert len(_warnings(caplog)) == 1
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # the home's own store answers
    _flush_tracking([])
    status = spool_status(run_dir)
    assert status is None or status.describe() is None
    assert (idmctl_home / PENDING_SPOOLS).read_text() == ""

"""The tracking server stopped mid-training of a real trainers.train job on the local Slurm cluster, and
started again: the job COMPLETED and the run's metric history in MLflow is complete and in order.

The real ``mlflow server`` (idmctl ui's) serves the test's store on 127.0.0.1 (the cluster's nodes share
this host) and the job logs to it through ``MLFLOW_TRACKING_URI`` (sbatch exports the environment). The
outage's edges fall at known steps: the job is suspended (``scontrol suspend``) while the server stops
and while it starts again, so the tiny model's fast steps cannot outrun the test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ground import tracking as names
from ground.contract import MLFLOW_RUN_ID_FILE
from ground.tracking_spool import spool_status
from net_support import free_port
from slurm_support import sacct_state, sh, squeue_state, text_so_far, wait_until
from test_slurm_jobs import _submit

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_home")]

STEP = re.compile(r"^step (\d+)/", re.M)
UNREACHABLE = "tracking server unreachable"
BACK = "tracking server answers again"


def _server(port: int):  # type: ignore[no-untyped-def]
    from idmctl.track.mlflow_server import start_server

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the server serves $IDMCTL_HOME's store
        return start_server(port=port)


def _steps_after(text: str, marker: str) -> list[int]:
    at = text.find(marker)
    return [] if at < 0 else [int(s) for s in STEP.findall(text[at:])]


def _suspended(job: str) -> None:
    sh("scontrol", "suspend", job)
    wait_until(lambda: squeue_state(job) == "SUSPENDED", 30, f"job {job} to be SUSPENDED")


@pytest.mark.slow
def test_mlflow_server_stopped_mid_training_and_restarted_loses_no_point(
        cli, tiny_cache, slurm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    total, every = 600, 10
    spec = tiny_cache.spec_file(slurm_home / "specs", "tiny_tracking_outage", resources={"cpus": 1, "mem": "1500MB"},
                                train={"steps": total, "checkpoint_every": 300, "log_every": every})
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _server(port)
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        submitted = _submit(cli, str(spec), "--qos", "sub")
        job, log = submitted["scheduler_id"], Path(submitted["log"])
        run_dir = Path(submitted["script"]).parent
        wait_until(lambda: STEP.search(text_so_far(log)), 240, lambda: f"job {job}'s first logged step "
                   f"({sacct_state(job)}; log: {text_so_far(log)[-800:]})", poll_s=0.2)

        _suspended(job)
        server.stop()
        down_from = max(int(s) for s in STEP.findall(text_so_far(log)))
        sh("scontrol", "resume", job)
        wait_until(lambda: len(_steps_after(text_so_far(log), UNREACHABLE)) >= 2, 120,
                   lambda: f"job {job} to log steps after saying the server is unreachable "
                           f"({sacct_state(job)}; log: {text_so_far(log)[-1500:]})", poll_s=0.2)

        _suspended(job)
        server = _server(port)
        up_from = max(int(s) for s in STEP.findall(text_so_far(log)))
        sh("scontrol", "resume", job)
        wait_until(lambda: sacct_state(job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"),
                   300, lambda: f"job {job} to end ({sacct_state(job)}; log: {text_so_far(log)[-1500:]})", poll_s=1.0)
        text = log.read_text()
        said = "\n".join(line for line in text.splitlines() if line.startswith("idmctl: "))
        assert sacct_state(job) == "COMPLETED", text[-3000:]
        assert down_from < up_from < total, (down_from, up_from)
        # Said once per outage, not per step: each "unreachable" is followed by its "answers again" (a send
        # that times out on a loaded box is an outage of its own), far fewer than the steps logged meanwhile.
        edges = [line for line in said.splitlines() if UNREACHABLE in line or BACK in line]
        assert edges and all((UNREACHABLE in line) == (i % 2 == 0) for i, line in enumerate(edges)), said
        assert len(edges) % 2 == 0, said
        assert len(edges) // 2 < len(_steps_after(text, UNREACHABLE)) - len(_steps_after(text, BACK)), said
        assert "tracking records stay spooled" not in text, said

        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        history = sorted((p.timestamp, p.step) for p in client.get_metric_history(run_id, names.M_LOSS))
        assert [step for _, step in history] == list(range(every, total + 1, every))  # complete, in order
        status = spool_status(run_dir)
        assert status is not None and status.pending_records == 0 and status.describe() is None
    finally:
        server.stop()

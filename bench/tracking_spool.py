"""Step-loop cost of the trainer's MLflow logging: ``RunLogger.log_metrics`` (a spool append; a thread
ships it) with the real ``mlflow server`` up and stopped, against the direct ``log_batch`` to the same
server that the trainer used to make in its step loop.

One logged step = the trainer's six per-window metrics (``trainers.train._log_window``). The direct call
while the server is down is not measured: with MLflow's defaults (7 retries, backoff factor 2, 120 s
timeout) it waits minutes before it raises, which is what killed jobs. ``python -m bench.tracking_spool``.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.common import Figure
from ground.contract import ENV_HOME

METRICS = {"loss": 0.5, "lr": 1e-3, "step_time_s": 0.1, "samples_per_s": 40.0, "data_wait_frac": 0.1,
           "peak_mem_bytes": 5e8}


def _timed(call, count: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Seconds per call; 5 ms apart, so the shipping thread runs between them as it does between steps."""
    samples = []
    for index in range(count):
        started = time.perf_counter()
        call(index)
        samples.append(time.perf_counter() - started)
        time.sleep(0.005)
    return samples


def run(fast: bool) -> list[Figure]:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from ground.spec import load_spec
    from idmctl.track.mlflow_server import start_server
    from trainers.tiny_data import TinyCache
    from trainers.tracking import RunLogger

    count = 50 if fast else 200
    root = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    kept = {key: os.environ.get(key) for key in (ENV_HOME, "MLFLOW_TRACKING_URI")}
    os.environ[ENV_HOME] = str(root / "home")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = start_server(port=port)
    try:
        os.environ["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{port}"
        resolved = load_spec(str(TinyCache.create(root / "cache").spec_path))
        logger = RunLogger(root / "run", resolved.name, resolved.hash, resolved.canonical, "bench")
        up = _timed(lambda i: logger.log_metrics(METRICS, 1 + i), count)
        client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
        run_id = None
        while run_id is None:
            run_id = logger.run_id
            time.sleep(0.1)
        direct = _timed(lambda i: client.log_batch(run_id, metrics=[
            Metric(k, v, int(time.time() * 1000), 100_000 + i) for k, v in METRICS.items()]), count)
        server.stop()
        down = _timed(lambda i: logger.log_metrics(METRICS, 1 + count + i), count)
        logger.close(wait_s=1.0)
    finally:
        server.stop()
        for key, value in kept.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    note = (f"{count} logged steps of 6 metrics each, 5 ms apart; the local `mlflow server` (1 worker, SQLite) "
            "on this machine; the server stopped by SIGTERM for the 'down' figure")
    return [
        Figure("log_metrics in the step loop, tracking server up (spool append)", "s", up,
               reference_name="direct MlflowClient.log_batch to the same server (before the spool)",
               reference_samples=direct, target="< 1 ms and ≤ 0.1× the direct call", note=note),
        Figure("log_metrics in the step loop, tracking server stopped (spool append)", "s", down,
               reference_name="the same, server up", reference_samples=up,
               target="< 1 ms: the step loop never waits on the network", note=note),
    ]


if __name__ == "__main__":
    for figure in run(fast=False):
        print(f"{figure.name}: median {figure.median * 1e3:.3f} ms"
              + (f"; {figure.reference_name}: {figure.reference_median * 1e3:.3f} ms" if figure.reference_samples else ""))

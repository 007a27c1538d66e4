"""CLI latency: `idmctl --help`, `exp list`, `failures` on a store of 10,000 jobs / 2,000 failures.

References: `python -c pass` (interpreter start) and the `mlflow` CLI listing runs of a store.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench.common import Figure, time_command
from ground.contract import ENV_HOME

VENV_BIN = Path(sys.executable).parent


def _populate_store(home: Path, jobs: int, failures: int) -> None:
    """Fill a store with realistic job and failure rows in one transaction."""
    os.environ[ENV_HOME] = str(home)
    from idmctl.record import session
    from idmctl.record.models import Failure, Job

    rng = random.Random(0)
    causes = ["preempted", "timeout", "oom_host", "shm_enospc", "loader_config", "python_exception", "queue_cancelled"]
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    with session(home / "idmctl.sqlite") as db:
        rows = []
        for i in range(jobs):
            submitted = start + timedelta(minutes=i)
            failed = i < failures
            rows.append(Job(experiment=f"exp_{i % 20}", scheduler_id=str(100000 + i), state="FAILED" if failed else "COMPLETED",
                            exit_code="1:0" if failed else "0:0", submitted_at=submitted, started_at=submitted + timedelta(minutes=5),
                            ended_at=submitted + timedelta(hours=2), qos=rng.choice(["core-own", "sub"]), gpus=8, routing_n=4))
        db.add_all(rows)
        db.flush()
        db.add_all(Failure(job_id=job.id, cause=rng.choice(causes), evidence="evidence line", classified_at=job.ended_at)
                   for job in rows[:failures])


def _populate_mlflow(uri: str, runs: int, env: dict[str, str]) -> None:
    """``runs`` FAILED runs in one MLflow experiment: the failed jobs as the mlflow CLI would list them."""
    script = ("import sys; from mlflow.tracking import MlflowClient; client = MlflowClient(sys.argv[1]); "
              "exp = client.create_experiment('idmctl'); "
              "[client.set_terminated(client.create_run(exp, run_name=f'job-{i}').info.run_id, 'FAILED') "
              "for i in range(int(sys.argv[2]))]")
    subprocess.run([sys.executable, "-c", script, uri, str(runs)], check=True, env=env, capture_output=True)


def run(fast: bool) -> list[Figure]:
    repeats = 1 if fast else 5  # failures on 2,000 rows takes seconds per run on this shared machine
    warmup = not fast  # fast mode (CI) keeps the benchmark alive; its single samples are not figures to quote
    jobs, failures = (1000, 200) if fast else (10_000, 2_000)
    idmctl = str(VENV_BIN / "idmctl")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        _populate_store(home, jobs, failures)
        env = {**os.environ, ENV_HOME: str(home)}
        python_pass = time_command([sys.executable, "-c", "pass"], max(repeats, 3), env)
        figures = [
            Figure("idmctl --help", "s", time_command([idmctl, "--help"], repeats, env, warmup), "python -c pass",
                   python_pass, target="interactive (a few × interpreter start)"),
            Figure("idmctl exp list", "s", time_command([idmctl, "exp", "list"], repeats, env, warmup), "python -c pass",
                   python_pass),
        ]
        has_failures = subprocess.run([idmctl, "failures", "--help"], env=env, capture_output=True).returncode == 0
        if has_failures:
            mlflow_uri = f"sqlite:///{home / 'mlflow_listing.sqlite'}"
            mlflow_runs = 20 if fast else failures  # creating runs costs ~10 ms each; CI only keeps this alive
            _populate_mlflow(mlflow_uri, mlflow_runs, env)
            mlflow_list = time_command([str(VENV_BIN / "mlflow"), "runs", "list", "--experiment-id", "1"], repeats,
                                       {**env, "MLFLOW_TRACKING_URI": mlflow_uri}, warmup)
            # The first `failures` classifies every failed job and stores it; the samples are the steady state.
            subprocess.run([idmctl, "failures", "--json"], env=env, capture_output=True, check=True)
            figures.append(Figure(f"idmctl failures ({jobs:,} jobs, {failures:,} failures)", "s",
                                  time_command([idmctl, "failures"], repeats, env, warmup),
                                  f"mlflow runs list ({mlflow_runs:,} failed runs)", mlflow_list,
                                  target="< 0.5 s and ≥ 3× faster than the mlflow listing",
                                  note="rich table of the 50 newest rows (the default), output to a pipe"))
            figures.append(Figure(f"idmctl ledger ({jobs:,} jobs, {failures:,} failures)", "s",
                                  time_command([idmctl, "ledger"], repeats, env, warmup), "python -c pass", python_pass,
                                  target="< 0.5 s", note="GPU-hours per experiment from every run in the store"))
            for flag in ("--json", "--markdown"):  # every row, read with sqlite3 (no ORM import)
                figures.append(Figure(f"idmctl failures {flag} ({jobs:,} jobs, {failures:,} failures)", "s",
                                      time_command([idmctl, "failures", flag], repeats, env, warmup),
                                      f"mlflow runs list ({mlflow_runs:,} failed runs)", mlflow_list,
                                      target="< 0.3 s and ≥ 3× faster than the mlflow listing",
                                      note=f"all {failures:,} rows, output to a pipe"))
        return figures


if __name__ == "__main__":
    for figure in run(fast="--fast" in sys.argv):
        print(figure.as_dict())

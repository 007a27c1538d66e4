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

VENV_BIN = Path(sys.executable).parent


def _populate_store(home: Path, jobs: int, failures: int) -> None:
    """Fill a store with realistic job and failure rows in one transaction."""
    os.environ["IDMCTL_HOME"] = str(home)
    from idmctl.store import session
    from idmctl.store.models import Failure, Job

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


def run(fast: bool) -> list[Figure]:
    repeats = 3 if fast else 10
    jobs, failures = (1000, 200) if fast else (10_000, 2_000)
    idmctl = str(VENV_BIN / "idmctl")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        _populate_store(home, jobs, failures)
        env = {**os.environ, "IDMCTL_HOME": str(home)}
        python_pass = time_command([sys.executable, "-c", "pass"], repeats, env)
        figures = [
            Figure("idmctl --help", "s", time_command([idmctl, "--help"], repeats, env), "python -c pass", python_pass,
                   target="interactive (a few × interpreter start)"),
            Figure("idmctl exp list", "s", time_command([idmctl, "exp", "list"], repeats, env), "python -c pass", python_pass),
        ]
        has_failures = subprocess.run([idmctl, "failures", "--help"], env=env, capture_output=True).returncode == 0
        if has_failures:
            mlflow_uri = f"sqlite:///{home / 'mlflow.sqlite'}"
            subprocess.run([sys.executable, "-c", f"import mlflow; mlflow.set_tracking_uri('{mlflow_uri}'); "
                            "mlflow.set_experiment('idmctl'); [mlflow.start_run().__exit__(None,None,None) for _ in range(20)]"],
                           check=True, env=env, capture_output=True)
            mlflow_list = time_command([str(VENV_BIN / "mlflow"), "runs", "list", "--experiment-id", "1"], repeats,
                                       {**env, "MLFLOW_TRACKING_URI": mlflow_uri})
            figures.append(Figure(f"idmctl failures ({jobs:,} jobs, {failures:,} failures)", "s",
                                  time_command([idmctl, "failures"], repeats, env), "mlflow runs list (same store)",
                                  mlflow_list, target="< 0.5 s and ≥ 3× faster than the mlflow listing"))
        return figures


if __name__ == "__main__":
    for figure in run(fast="--fast" in sys.argv):
        print(figure.as_dict())

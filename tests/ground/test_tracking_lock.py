"""Several processes opening a brand-new MLflow store at once (parallel jobs' first attempts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ground.contract import ENV_HOME

OPEN_STORE = """
from mlflow.tracking import MlflowClient
from ground.mlflow_store import store_init_lock
from ground.paths import mlflow_tracking_uri
with store_init_lock():
    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    client.search_experiments(max_results=1)
client.create_run(client.get_experiment_by_name("Default").experiment_id)
print("ok")
"""


@pytest.mark.slow
def test_three_processes_initialise_one_new_store_without_crashing(idmctl_home: Path):
    env = {**os.environ, ENV_HOME: str(idmctl_home)}
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_STORE], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [proc.communicate(timeout=180) for proc in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err[-2000:]
        assert out.strip().endswith("ok")
    assert (idmctl_home / "mlflow.sqlite").exists()

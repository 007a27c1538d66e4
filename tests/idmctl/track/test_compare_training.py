"""Two real trainings with different routing (``idmctl train``, the Fabric trainer, MLflow logging)
and ``idmctl compare`` lists both with their EEF mm and goal verdicts.

The data set is tiny but real (trainers.tiny_data: robomimic HDF5 + safetensors hidden caches).
The goals are chosen so one verdict must PASS and one must FAIL whatever the learned EEF error is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ground import tracking
from ground.paths import mlflow_artifacts_dir, mlflow_tracking_uri
from ground.contract import ENV_EXPERIMENTS, ENV_HOME

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_two_routings_are_compared_with_verdicts(tiny_cache, cli, idmctl_home: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch):
    from mlflow.tracking import MlflowClient
    from trainers.tiny_data import tiny_spec

    specs = tmp_path / "experiments"
    specs.mkdir()
    routings = {"routing_a": ([0, 2], "eef_mm_2ep <= 1000000"), "routing_b": ([1, 3], "eef_mm_2ep < 0")}
    for name, (selected, goal) in routings.items():
        spec = tiny_spec(tiny_cache.data)
        spec["data"]["selected_layer_indices"] = selected
        (specs / f"{name}.yaml").write_text(yaml.safe_dump({**spec, "goal": goal}, sort_keys=False))
    monkeypatch.setenv(ENV_EXPERIMENTS, str(specs))
    # Create the MLflow store once, so the two concurrent trainers do not both run its migrations.
    idmctl_home.mkdir(parents=True, exist_ok=True)
    MlflowClient(tracking_uri=mlflow_tracking_uri()).create_experiment(
        tracking.MLFLOW_EXPERIMENT, artifact_location=mlflow_artifacts_dir().as_uri())

    env = {**os.environ, ENV_HOME: str(idmctl_home), ENV_EXPERIMENTS: str(specs)}
    trainings = [subprocess.Popen([sys.executable, "-m", "idmctl", "train", name], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for name in routings]
    for training in trainings:
        output, _ = training.communicate(timeout=300)
        assert training.returncode == 0, output[-3000:]

    result = cli("compare", "routing_a", "routing_b", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["label"]: row for row in json.loads(result.output)["rows"]}
    assert set(rows) == {"routing_a", "routing_b"}
    for name, (selected, goal) in routings.items():
        row = rows[name]
        eef = row["metrics"]["eef_mm_2ep"]
        assert 0 < eef["best"] <= eef["last"]
        assert row["status"] == "finished" and row["steps_done"] == 8 and row["goal"] == goal
        assert row["note"].startswith(f"N=2 blocks {selected[0]}/{selected[1]}, spec ")
    assert rows["routing_a"]["verdict"] == "PASS" and rows["routing_b"]["verdict"] == "FAIL"

    table = cli("compare", "routing_a", "routing_b", "--markdown")
    for name in routings:
        eef = rows[name]["metrics"]["eef_mm_2ep"]
        shown = f"{round(eef['best'], 2):g}" + ("" if eef["best"] == eef["last"] else f" (last {round(eef['last'], 2):g})")
        assert f"| {name} | 8, B=4 | {shown} |" in table.output

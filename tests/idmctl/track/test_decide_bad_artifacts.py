"""decide refuses what it cannot judge: a per-episode artifact damaged on disk after the trainer logged it
(NaN, inf, a negative error, a cut-off file, an episode listed twice) is one line naming the run and the
episode, exit 2, and no verdict is written to the run's tags; a goal on a metric no run logged is refused.

The runs are written by the trainer's own RunLogger into a real MLflow store (as in test_decide.py); the
damage is done to the artifact file in the store's artifact folder, the way a full disk or a crashed
evaluator leaves it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ground import tracking
from ground.contract import ENV_EXPERIMENTS, ENV_HOME
from test_decide import SPEC, _train_run

GOOD = [38.0, 44.5, 41.0, 35.5]


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    specs = tmp_path / "experiments"
    specs.mkdir()
    (specs / "qbad.yaml").write_text(SPEC.format(lr="3.0e-3"))
    home = tmp_path / "home"
    monkeypatch.setenv(ENV_EXPERIMENTS, str(specs))
    monkeypatch.setenv(ENV_HOME, str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_id = _train_run(tmp_path, "qbad", 1, {200: GOOD})
    [artifact] = list(home.glob(f"mlartifacts/**/{run_id}/artifacts/episodes/sim_eef_mm_4ep/step-*.json"))
    return {"id": run_id, "artifact": artifact}


def _damage(artifact: Path, change) -> None:
    document = json.loads(artifact.read_text())
    change(document)
    artifact.write_text(json.dumps(document))  # NaN and Infinity as Python's json writes them


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["episodes"][1].update(error_mm=float("nan")), "episode demo_9: error_mm is nan"),
    (lambda d: d["episodes"][2].update(error_mm=float("inf")), "episode demo_10: error_mm is inf"),
    (lambda d: d["episodes"][0].update(error_mm=-3.5), "episode demo_8: error_mm is -3.5 (an EEF error is finite and ≥ 0"),
    (lambda d: d["episodes"][3].update(error_mm="41 mm"), "episode demo_11: error_mm is not a number: '41 mm'"),
    (lambda d: d["episodes"].append(dict(d["episodes"][0])), "episode demo_8: episode listed twice"),
    (lambda d: d.update(episodes=[]), "no episodes in the per-episode artifact"),
])
def test_a_damaged_artifact_is_one_line_naming_run_and_episode(cli, run, change, expected):
    _damage(run["artifact"], change)
    result = cli("decide", "qbad#1")
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line.startswith(f"error: run qbad#1 ({run['id']}):episodes/sim_eef_mm_4ep/step-") and expected in line, line
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    tags = MlflowClient(tracking_uri=mlflow_tracking_uri()).get_run(run["id"]).data.tags
    assert tracking.decision_tag("verdict") not in tags


def test_a_cut_off_artifact_is_one_line(cli, run):
    text = run["artifact"].read_text()
    run["artifact"].write_text(text[: len(text) // 2])
    result = cli("decide", "qbad#1")
    assert result.exit_code == 2, result.output
    assert "damaged per-episode artifact: JSONDecodeError" in result.output and len(result.output.splitlines()) == 1


def test_a_goal_on_a_metric_no_run_logged_is_refused(cli, run):
    result = cli("decide", "qbad", "--goal", "succes_rate >= 0.8")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --goal: no run of qbad logged succes_rate (a metric they logged: ")

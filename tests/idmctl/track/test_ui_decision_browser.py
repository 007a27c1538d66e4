"""The MLflow UI lands where the decision is, checked in headless Chromium (Debian's package).

A run logged by the trainer's own RunLogger (a spec whose goal is ``sim_eef_mm_4ep <= 60``; it also logs
``eef_mm_4ep``, ``data_wait_frac`` and ``loss``, each of which MLflow's alphabetical order and idmctl's
EEF-first order put before the goal metric), decided by ``idmctl decide``, served by a real
``mlflow server``. The links ``decide`` prints open:
- the experiment's runs page in its model-training view: the page MLflow titles "Runs", with no GenAI
  overview (MLflow 3.17 opens the GenAI overview for a browser that never chose, whatever the
  experiment's kind tag says), and the goal's metric as the first chart;
- the decided run's page, showing the ``idmctl.decision.*`` tags with the verdict and interval decide printed.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from ground import mlflow_view, tracking
from ground.contract import ENV_CHAIN_ID, ENV_EXPERIMENTS
from ground.protocols import Protocol
from net_support import free_port
from test_ui_browser import CHROMIUM, _chart_cards, _chromium

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian chromium (scripts/system_deps.sh)")]

SPEC = """
description: tiny routed DiT for the UI decision test
data: {episodes: /nonexistent/demos.hdf5, cache_root: /nonexistent/cache, cache_format: safetensors,
       cached_layers: [0, 1, 2, 3], frames: 8, token_grid: [4, 4], channels: 32, dtype: float32,
       selected_layer_indices: [0, 2], frame_window: 2, action_horizon: 8, action_dim: 7}
model: {depth: 2, hidden_dim: 32, num_heads: 2, kv_dim: 32}
loader: {batch_size: 4}
train: {steps: 200, lr: 1.0e-3, effective_batch: 8, checkpoint_every: 100}
resources: {qos: core-own, time_limit: "0:30:00"}
eval: {metric: sim_eef_mm_4ep, episodes: [4], simulator: true}
goal: sim_eef_mm_4ep <= 60
"""
GOAL_METRIC = "sim_eef_mm_4ep"
DEMOS = ["demo_8", "demo_9", "demo_10", "demo_11"]
PROTOCOL = Protocol(name="sim:Lift/valid:4ep", kind="simulator", task="Lift", split="valid", episodes=DEMOS,
                    seeds=[0], evaluator="trainers.sim.evaluate:SimEEFEvaluator@0123456789ab")
PAGE_DEADLINE_S = 240.0
"""Chromium on a busy 2-core box: a page is re-read with more virtual time until it shows what is waited for."""


def _train_run(root: Path, experiment: str, chain: int) -> str:
    """One chain's run as the trainer writes it: RunLogger creates it (and the spec's goal view), logs
    the offline and simulator evaluations with their per-episode results."""
    import os

    from ground.spec import load_spec
    from trainers.tracking import RunLogger

    run_dir = root / "runs" / f"{experiment}-{chain}"
    run_dir.mkdir(parents=True)
    resolved = load_spec(experiment)
    os.environ[ENV_CHAIN_ID] = str(chain)
    try:
        logger = RunLogger(run_dir, experiment, resolved.hash, resolved.canonical, "test")
    finally:
        del os.environ[ENV_CHAIN_ID]
    logger.start_attempt(0)
    for step, errors in {100: [52.0, 61.0, 48.0, 70.0], 200: [38.0, 44.5, 41.0, 35.5]}.items():
        logger.log_metrics({"loss": 1.0 / step, tracking.M_DATA_WAIT: 0.1, "eef_mm_4ep": 20.0 + step / 100,
                            GOAL_METRIC: sum(errors) / len(errors)}, step)
        logger.log_episodes(GOAL_METRIC, step, PROTOCOL.to_json(), list(zip(DEMOS, errors)))
    logger.finish("FINISHED")
    return logger.run_id


def _page_until(url: str, markers: list[str], name: str, profile: Path) -> str:
    """The page's DOM once it contains every marker: read again with twice the virtual time until then;
    fails at the deadline naming the markers still missing."""
    deadline = time.monotonic() + PAGE_DEADLINE_S
    budget_ms = 15000
    while True:
        shutil.rmtree(profile, ignore_errors=True)  # a fresh browser: nothing remembered from a run before
        dom = _chromium(url, REPO / "test-artifacts" / f"{name}.png", profile, budget_ms)
        missing = [marker for marker in markers if marker not in dom]
        if not missing:
            return dom
        if time.monotonic() + 2 * budget_ms / 1000 > deadline:
            raise AssertionError(f"{name}: {url} never showed {missing} within {PAGE_DEADLINE_S:.0f} s "
                                 f"(last read: {budget_ms} ms of page time); page text ends: {dom[-1500:]}")
        budget_ms *= 2


def test_the_ui_opens_on_training_runs_with_the_goal_metric_first_and_the_verdict_on_the_run(
        cli, idmctl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri
    from idmctl.track.mlflow_server import start_server
    from idmctl.track.runs_view import goal_view_lines

    specs = tmp_path / "experiments"
    specs.mkdir()
    (specs / "quidecide.yaml").write_text(SPEC)
    monkeypatch.setenv(ENV_EXPERIMENTS, str(specs))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    idmctl_home.mkdir(parents=True, exist_ok=True)
    run_id = _train_run(tmp_path, "quidecide", 1)
    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    experiment_id = client.get_run(run_id).info.experiment_id
    goal_view = client.get_experiment(experiment_id).tags[mlflow_view.TAG_PREFIX + "idmctl-goal-quidecide"]
    assert mlflow_view.charted_keys(goal_view)[0] == GOAL_METRIC  # the trainer wrote it on creating the run
    # What `idmctl ui` prints for it.
    assert goal_view_lines("http://127.0.0.1:5000") == [
        f"quidecide: goal sim_eef_mm_4ep <= 60 first (idmctl): http://127.0.0.1:5000/#/experiments/{experiment_id}"
        "/runs?workflowType=machine_learning&viewStateShareKey=idmctl-goal-quidecide&compareRunsMode=CHART"]

    (REPO / "test-artifacts").mkdir(exist_ok=True)
    server = start_server("127.0.0.1", free_port())
    try:
        result = cli("decide", "quidecide", "--ui-url", server.url)
        assert result.exit_code == 0, result.output
        assert "verdict: PASS (the whole interval [34.0, 47.8] mm is <= 60 mm)" in result.output, result.output
        runs_link = re.search(r"MLflow quidecide runs, goal sim_eef_mm_4ep first: (\S+)", result.output)
        run_link = re.search(r"MLflow run quidecide#1 \(verdict in its tags\): (\S+)", result.output)
        assert runs_link and run_link, result.output
        tags = client.get_run(run_id).data.tags
        interval = tags[tracking.decision_tag("interval_mm")]
        low, high = json.loads(interval)
        assert tags[tracking.decision_tag("verdict")] == "PASS" and f"[{low:.1f}, {high:.1f}]" == "[34.0, 47.8]"

        # The experiment's runs page: model training, not the GenAI overview; the goal's metric charted first.
        dom = _page_until(runs_link.group(1), ['data-testid="experiment-view-compare-runs-card"', "quidecide#1"],
                          "ui_goal_first", tmp_path / "chromium-runs")
        title = re.search(r"<title>([^<]*)</title>", dom)
        assert title and title.group(1).startswith("Runs - "), title and title.group(1)
        assert f"#/experiments/{experiment_id}/overview" not in dom  # no GenAI overview in the side nav
        assert "quidecide: goal sim_eef_mm_4ep &lt;= 60 first (idmctl)" in dom  # the goal view is applied
        titles = [card_title for card_title, _ in _chart_cards(dom)]
        assert titles[:2] == [GOAL_METRIC, "eef_mm_4ep"], titles
        assert "quidecide#1" in _chart_cards(dom)[0][1]  # the goal chart draws the run

        # The decided run's page shows the decision's tags.
        dom = _page_until(run_link.group(1), [tracking.decision_tag("verdict"), interval],
                          "ui_run_verdict", tmp_path / "chromium-run")
        # MLflow draws a tag as <span title="key">key</span><span title="value">: value</span>.
        verdict = re.search(re.escape(tracking.decision_tag("verdict")) + r'</span><span[^>]*title="([^"]*)"', dom)
        assert verdict and verdict.group(1) == "PASS", dom[dom.find(tracking.decision_tag("verdict")) - 200:][:800]
        assert tracking.decision_tag("p_goal") in dom
    finally:
        server.stop()

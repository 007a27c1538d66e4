"""``idmctl decide`` over runs logged by the trainer's own RunLogger into a real MLflow SQLite store.

Each run logs its evaluations as the trainer does (``RunLogger.log_metrics`` + ``RunLogger.log_episodes``:
the per-episode JSON artifact and the protocol tag), so decide reads what a real training run leaves.
The per-episode numbers are chosen so each verdict is clear by hand: 39.75 mm ± ~4 mm against a 60 mm
goal is a PASS, 60.5 mm ± ~5 mm is UNDECIDED.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from ground import tracking
from ground.contract import ENV_CHAIN_ID, ENV_EXPERIMENTS, ENV_HOME
from ground.protocols import Protocol

SPEC = """
description: tiny routed DiT for decide tests
data: {{episodes: /nonexistent/demos.hdf5, cache_root: /nonexistent/cache, cache_format: safetensors,
       cached_layers: [0, 1, 2, 3], frames: 8, token_grid: [4, 4], channels: 32, dtype: float32,
       selected_layer_indices: [0, 2], frame_window: 2, action_horizon: 8, action_dim: 7}}
model: {{depth: 2, hidden_dim: 32, num_heads: 2, kv_dim: 32}}
loader: {{batch_size: 4}}
train: {{steps: 200, lr: {lr}, effective_batch: 8, checkpoint_every: 100}}
resources: {{qos: core-own, time_limit: "0:30:00"}}
eval: {{metric: sim_eef_mm_4ep, episodes: [4], simulator: true}}
goal: sim_eef_mm_4ep <= 60
"""
DEMOS = ["demo_8", "demo_9", "demo_10", "demo_11"]
METRIC = "sim_eef_mm_4ep"
PROTOCOL = Protocol(name="sim:Lift/valid:4ep", kind="simulator", task="Lift", split="valid", episodes=DEMOS,
                    seeds=[0], evaluator="trainers.sim.evaluate:SimEEFEvaluator@0123456789ab")


def _train_run(root: Path, experiment: str, chain: int, evaluations: dict[int, list[float]]) -> str:
    """One chain's MLflow run, written by the trainer's RunLogger exactly as ``validate`` writes it."""
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
    for step, errors in evaluations.items():
        logger.log_metrics({METRIC: sum(errors) / len(errors)}, step)
        logger.log_episodes(METRIC, step, PROTOCOL.to_json(), list(zip(DEMOS, errors)))
    logger.finish("FINISHED")
    return logger.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("decide_store")
    specs = root / "experiments"
    specs.mkdir()
    (specs / "qdecide.yaml").write_text(SPEC.format(lr="3.0e-3"))
    (specs / "qclose.yaml").write_text(SPEC.format(lr="1.0e-3"))
    home = root / "home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV_EXPERIMENTS, str(specs))
        patch.setenv(ENV_HOME, str(home))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        ids = {
            "pass": _train_run(root, "qdecide", 1, {100: [52.0, 61.0, 48.0, 70.0], 200: [38.0, 44.5, 41.0, 35.5]}),
            "repeat": _train_run(root, "qdecide", 2, {200: [40.0, 47.0, 39.5, 36.0]}),
            "close": _train_run(root, "qclose", 3, {100: [41.0, 49.0, 52.5, 47.5], 200: [55.0, 66.0, 58.0, 63.0]}),
        }
    return {"specs": specs, "home": home, "ids": ids}


@pytest.fixture
def tracked(store: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv(ENV_EXPERIMENTS, str(store["specs"]))
    monkeypatch.setenv(ENV_HOME, str(store["home"]))
    return store


def test_a_run_passes_with_its_interval_and_arithmetic(cli, tracked):
    result = cli("decide", "qdecide#1", "--no-tags")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "decide qdecide#1: goal sim_eef_mm_4ep <= 60",
        "  checkpoint: step 200 (the last evaluation, not chosen on these episodes)",
        "  protocol: sim:Lift/valid:4ep (4 episodes demo_8..demo_11; seed 0; "
        "trainers.sim.evaluate:SimEEFEvaluator@0123456789ab)",
        "  per episode (qdecide#1): 38.0, 44.5, 41.0, 35.5 mm",
        "  estimate: mean 39.8 mm = 159.0 mm / 4 episodes",
        "  spread: sd 3.9 mm, standard error 1.9 mm = 3.9 / √4",
        # 4 episodes: 24 of the 2,000 resamples repeat one episode (no spread); kept, at t = ±∞.
        "  95 % interval: [34.0, 47.8] mm (studentized bootstrap (bootstrap-t) over episodes, 2,000 resamples; "
        "Monte-Carlo error of the ends ±0.72 / ±0 mm; 24 without spread kept)",
        "  P(sim_eef_mm_4ep <= 60) = 1.00",
        "  verdict: PASS (the whole interval [34.0, 47.8] mm is <= 60 mm)",
    ]


def test_an_experiment_pools_its_repeats_and_tags_both_runs(cli, tracked):
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    result = cli("decide", "qdecide")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "decide qdecide (2 runs of one spec): goal sim_eef_mm_4ep <= 60"
    assert "  per episode (qdecide#2): 40.0, 47.0, 39.5, 36.0 mm" in lines
    assert "  estimate: mean 40.2 mm = 321.5 mm / (2 × 4)" in lines
    assert lines[-5].startswith("  verdict: PASS")
    assert lines[-4] == "MLflow: 2 run(s) tagged idmctl.decision.* (verdict, interval, P(goal))"
    # Where the UI shows it: the spec's runs with the goal metric first, and each decided run's page.
    assert lines[-3].startswith("MLflow qdecide runs, goal sim_eef_mm_4ep first: http://127.0.0.1:5000/#/experiments/")
    assert lines[-3].endswith("/runs?workflowType=machine_learning&viewStateShareKey=idmctl-goal-qdecide"
                              "&compareRunsMode=CHART")
    for line, key in zip(lines[-2:], ("pass", "repeat")):
        assert line.startswith("MLflow run qdecide#") and line.endswith(f"/runs/{tracked['ids'][key]}"
                                                                        "?workflowType=machine_learning"), line
    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    for key in ("pass", "repeat"):
        tags = client.get_run(tracked["ids"][key]).data.tags
        assert tags[tracking.decision_tag("verdict")] == "PASS"
        assert tags[tracking.decision_tag("protocol")] == "sim:Lift/valid:4ep"
        assert tags[tracking.decision_tag("step")] == "200"
        assert tags[tracking.decision_tag("goal")] == "sim_eef_mm_4ep <= 60"


def test_a_close_run_is_undecided_with_the_episodes_that_would_decide(cli, tracked):
    result = cli("decide", "qclose", "--no-tags", "--json")
    assert result.exit_code == 0, result.output
    decision = json.loads(result.output)["decisions"][0]
    assert decision["verdict"] == "UNDECIDED"
    estimate, verdict = decision["estimate"], decision["decision"]
    assert estimate["mean"] == 60.5 and estimate["low"] < 60 < estimate["high"]
    assert 0.2 < verdict["p_goal"] < 0.8
    # Taken as exact, mean 60.5 and sd ≈ 5 mm would need ~400 episodes (t(n−1)·sd/√n < 0.5 mm); counting
    # that the truth is as likely ±2.5 mm away, 80 % of the futures decide with ~240 (test_decision_power.py).
    assert verdict["power"] == 0.8
    assert 150 < verdict["episodes_to_decide"] < 350
    assert [e["error_mm"] for e in decision["runs"][0]["episodes"]] == [55.0, 66.0, 58.0, 63.0]


def test_two_runs_on_the_same_episodes_are_compared_paired(cli, tracked):
    result = cli("decide", "qclose", "--against", "qdecide#1", "--no-tags")
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("paired ")]
    # qdecide#1 − qclose#3 per episode: 38−55, 44.5−66, 41−58, 35.5−63 = −17, −21.5, −17, −27.5 → mean −20.75 mm.
    assert line.startswith("paired qdecide#1 − qclose#3: -20.8 mm, 95 % interval [")
    # Two of the 4 differences are equal (−17): 119 of 2,000 resamples have no spread, more than a 2.5 % tail,
    # so the bootstrap has no finite end and Student's t (3 degrees of freedom) gives the interval.
    assert line.endswith("on the same 4 episodes under sim:Lift/valid:4ep (t interval, 3 degrees of freedom (119 of "
                         "2,000 resamples had no spread: too few episodes for the bootstrap) of the per-episode "
                         "differences)")


def test_the_best_checkpoint_is_warned_as_chosen_on_the_same_episodes(cli, tracked):
    result = cli("decide", "qclose#3", "--checkpoint", "best", "--no-tags")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == (
        "  warning: checkpoint step 100 was chosen as the best sim_eef_mm_4ep on these same 4 episodes: the "
        "estimate is biased low; decide on `--checkpoint last` or on episodes the choice did not see")


def test_a_goal_under_another_protocol_has_no_result(cli, tracked):
    result = cli("decide", "qdecide#1", "--goal", "sim_eef_mm_4ep <= 60 under card-A/MG-30-sim:5ep", "--no-tags")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == (
        "  no result under card-A/MG-30-sim:5ep: qdecide#1 logged sim_eef_mm_4ep under sim:Lift/valid:4ep only")


def test_card_a_baseline_is_a_point_estimate_without_a_spread(cli):
    result = cli("decide", "latent_a_v1", "--goal", "eef_mm_5ep <= 125")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "decide Latent-A v1 (L27 sliced) (baseline): goal eef_mm_5ep <= 125",
        "  protocol: card-A/MG-30-sim:5ep (card A records the mean only: no per-episode errors, episode list, "
        "seeds or evaluator version)",
        "  eef_mm_5ep = 131.8 mm on 5 episodes: a point estimate without a spread",
        "  the point fails the goal eef_mm_5ep <= 125, but with no spread there is no interval and no P(goal)",
        "  5 episodes decide it only if the per-episode sd is below |131.8 − 125| · √5 / t(4) = 6.8 · 2.236 / 2.776"
        " = 5.5 mm",
        "  verdict: UNDECIDED (a point estimate: a mean without its episodes has no interval; import the "
        "per-episode file with `idmctl eval import FILE --name NAME --protocol card-A/MG-30-sim:5ep` to decide it)",
    ]


def test_plot_draws_a_real_png(cli, tracked, tmp_path: Path):
    out = tmp_path / "decide.png"
    result = cli("decide", "qdecide", "--plot", str(out), "--no-tags")
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (900, 200)
    assert f"plot: {out} ({len(data):,} B)" in result.output


def test_bad_input_is_one_line(cli, tracked):
    result = cli("decide", "qdecide", "--checkpoint", "newest")
    assert (result.exit_code, result.output) == (
        2, "error: --checkpoint: not a checkpoint: 'newest' (last, best, or a step number)\n")
    result = cli("decide", "qdecide", "--goal", "sim_eef_mm_4ep = 60")
    assert result.exit_code == 2 and result.output.startswith("error: --goal: goal 'sim_eef_mm_4ep = 60' is not ")


def test_a_baseline_needs_a_goal(cli):
    result = cli("decide", "latent_a_v1")
    assert (result.exit_code, result.output) == (
        2, "error: --goal: baseline latent_a_v1 has no goal (e.g. --goal \"eef_mm_24ep <= 125\")\n")

"""SimEEFEvaluator on real demos and a real tiny-Cosmos cache: an oracle IDM (the recorded actions)
replays to ~0 mm, an untrained routed DiT lands far off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

STEPS = 22
"""With 8 cache frames the stride is (22 − 1) // 7 = 3; windows of 2 frames predicting 8 actions cover all 22."""


@pytest.fixture(scope="module")
def sim_spec(tmp_path_factory: pytest.TempPathFactory):
    from ground.paths import REPO_ROOT
    from ground.spec import load_spec
    from trainers.build_hidden_cache import build_hidden_cache
    from trainers.sim.demos import make_demos

    root = tmp_path_factory.mktemp("sim_eval")
    make_demos(root / "demos.hdf5", "Lift", 3, seed=1, camera_size=32, horizon=STEPS, valid=2)
    path = root / "sim_eval.yaml"
    path.write_text(yaml.safe_dump({
        "extends": str(REPO_ROOT / "experiments" / "quickstart.yaml"),
        "data": {"episodes": str(root / "demos.hdf5"), "cache_root": str(root / "hidden")},
        "eval": {"metric": "sim_eef_mm_2ep", "episodes": [1, 2], "simulator": True},
    }))
    spec = load_spec(str(path)).spec
    build_hidden_cache(spec)
    return spec


class OraclePolicy:
    """Answers each window with the demo's recorded action chunk (what a perfect IDM would say)."""

    seed = 0

    def __init__(self, dataset) -> None:
        self.by_hidden = {dataset[i]["hidden"].numpy().tobytes(): dataset[i]["actions"] for i in range(len(dataset))}

    def predict(self, hidden: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.stack([self.by_hidden[h.numpy().tobytes()] for h in hidden])


@pytest.mark.slow
def test_oracle_actions_replay_exactly_and_an_untrained_model_does_not(sim_spec) -> None:
    from trainers.evaluate import ChunkPolicy
    from trainers.sim.evaluate import SimEEFEvaluator
    from trainers.sim.scoring import initial_model

    evaluator = SimEEFEvaluator(sim_spec, torch.device("cpu"))
    assert evaluator.demos == ["demo_1", "demo_2"]
    oracle = evaluator.evaluate(OraclePolicy(evaluator.dataset), [1, 2])
    assert set(oracle) == {"sim_eef_mm_1ep", "sim_eef_mm_2ep"}
    # float32 actions in the HDF5 are the only difference from the recording.
    assert oracle["sim_eef_mm_2ep"] < 0.1
    untrained = evaluator.evaluate(ChunkPolicy(initial_model(sim_spec), torch.device("cpu")), [1, 2])
    assert untrained["sim_eef_mm_2ep"] > 20.0
    assert untrained["sim_eef_mm_2ep"] == pytest.approx(np.mean([r.eef_mm for r in evaluator.last_results]))


def test_geometry_that_leaves_steps_without_actions_is_refused(sim_spec) -> None:
    from ground.errors import UserError
    from trainers.sim.evaluate import SimEEFEvaluator

    short = sim_spec.model_copy(update={"data": sim_spec.data.model_copy(update={"action_horizon": 2})})
    with pytest.raises(UserError) as caught:
        SimEEFEvaluator(short, torch.device("cpu"))
    assert caught.value.field == "data.action_horizon"
    assert "demo_1: 7 windows × stride 3 + horizon 2 cover 20 of its 22 steps" in caught.value.what

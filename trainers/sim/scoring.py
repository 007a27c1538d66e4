"""Score a finished run against its own untrained starting point, with every evaluator of the spec.

The untrained model is the trainer's initial weights (same seed): the floor a trained model must
clearly beat. The quickstart prints both; a test holds the trained one to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ground.errors import UserError
from ground.spec.schema import ExperimentSpec
from trainers.checkpoint import latest_checkpoint, state_file
from ground.contract import MLFLOW_RUN_ID_FILE


def initial_model(spec: ExperimentSpec) -> torch.nn.Module:
    """The weights the trainer starts from (it seeds everything with ``train.seed`` before building)."""
    from trainers.registry import build_model

    torch.manual_seed(spec.train.seed)
    return build_model(spec)


def trained_model(spec: ExperimentSpec, run_dir: Path) -> tuple[torch.nn.Module, Path]:
    """The newest checkpoint of ``run_dir`` that verifies, loaded into a fresh model."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise UserError("the run has no complete checkpoint", file=str(run_dir), hint="train it first")
    model = initial_model(spec)
    state = torch.load(state_file(checkpoint), map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    return model, checkpoint


def score(spec: ExperimentSpec, models: dict[str, torch.nn.Module]) -> tuple[dict[str, dict[str, float]], list[Any]]:
    """metric → value for each named model, with the same evaluators (and the same flow noise)."""
    from trainers.evaluate import ChunkPolicy, build_evaluators

    torch.set_num_threads(1)
    device = torch.device("cpu")
    evaluators = build_evaluators(spec, device)
    scores: dict[str, dict[str, float]] = {}
    replays: dict[str, list[Any]] = {}
    for name, model in models.items():
        policy = ChunkPolicy(model, device, seed=spec.train.seed)
        scores[name] = {}
        for evaluator in evaluators:
            scores[name].update(evaluator.evaluate(policy, list(spec.eval.episodes)))
            if hasattr(evaluator, "last_results"):
                replays[name] = list(evaluator.last_results)
    return scores, [replays[name] for name in models if name in replays]


def score_trained_and_untrained(spec: ExperimentSpec, run_dir: Path) -> dict[str, Any]:
    """Both models' metrics, the checkpoint used, the MLflow run id and per-episode simulator errors."""
    trained, checkpoint = trained_model(spec, run_dir)
    scores, replays = score(spec, {"trained": trained, "untrained": initial_model(spec)})
    per_episode = []
    if len(replays) == 2:
        per_episode = [(a.demo, a.eef_mm, b.eef_mm) for a, b in zip(replays[0], replays[1])]
    run_id_file = run_dir / MLFLOW_RUN_ID_FILE
    return {
        "trained": scores["trained"], "untrained": scores["untrained"], "checkpoint": str(checkpoint),
        "mlflow_run_id": run_id_file.read_text().strip() if run_id_file.exists() else None,
        "per_episode": per_episode,
    }

"""MLflow logging for one training chain: every attempt (Slurm requeue) logs to ONE run.

The run id lives in ``<run_dir>/mlflow_run_id``: the first attempt creates the run and writes it
(atomically); later attempts reopen it. Names come from :mod:`ground.tracking`. Only rank 0 logs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ground import tracking as names
from ground.errors import UserError
from ground.contract import ENV_ATTEMPT, ENV_CHAIN_ID, MLFLOW_RUN_ID_FILE
from ground.mlflow_store import store_init_lock
from ground.mlflow_view import ensure_experiment, ensure_goal_view
from ground.paths import atomic_write_text, mlflow_artifacts_dir, mlflow_tracking_uri
from ground.spec.schema import Goal

_MAX_PARAM_CHARS = 6000
"""MLflow's limit on one param value."""


def attempt_tags(env: dict[str, str] | None = None) -> dict[str, str]:
    """Tags that change per attempt: Slurm job id, restart count, attempt number."""
    env = dict(os.environ) if env is None else env
    tags = {}
    if env.get("SLURM_JOB_ID"):
        tags[names.TAG_SLURM_JOB] = env["SLURM_JOB_ID"]
    if env.get("SLURM_RESTART_COUNT"):
        tags[names.TAG_SLURM_RESTARTS] = env["SLURM_RESTART_COUNT"]
    if env.get(ENV_ATTEMPT):
        tags[names.TAG_ATTEMPT] = env[ENV_ATTEMPT]
    elif env.get("SLURM_RESTART_COUNT"):
        tags[names.TAG_ATTEMPT] = str(int(env["SLURM_RESTART_COUNT"]) + 1)
    return tags


def chain_id(env: dict[str, str] | None = None) -> int | None:
    value = (os.environ if env is None else env).get(ENV_CHAIN_ID)
    return int(value) if value else None


class RunLogger:
    """Rank 0's handle on the chain's MLflow run."""

    def __init__(self, run_dir: Path, name: str, spec_hash: str, canonical: dict[str, Any], code_version: str):
        from mlflow.tracking import MlflowClient

        with store_init_lock():  # the first connect seeds or migrates the store
            self.client = MlflowClient(tracking_uri=mlflow_tracking_uri())
            self.client.search_experiments(max_results=1)
        id_file = run_dir / MLFLOW_RUN_ID_FILE
        if id_file.exists():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            self.resumed = True
        else:
            experiment_id = self._experiment_id(name, canonical)
            spec = canonical
            tags = {
                names.TAG_EXPERIMENT: name, names.TAG_SPEC_HASH: spec_hash,
                names.TAG_ROUTING_N: str(len(spec["data"]["selected_layer_indices"])),
                names.TAG_QOS: str(spec["resources"]["qos"]),
            }
            chain = chain_id()
            if chain is not None:
                tags[names.TAG_CHAIN] = str(chain)
            run = self.client.create_run(experiment_id, run_name=names.run_name(name, chain), tags=tags)
            self.run_id = run.info.run_id
            self._log_params(names.flatten(canonical))
            atomic_write_text(id_file, self.run_id + "\n")
            self.resumed = False
        for key, value in {names.TAG_CODE_VERSION: code_version, **attempt_tags()}.items():
            self.client.set_tag(self.run_id, key, value)

    @classmethod
    def attach(cls, run_dir: Path) -> "RunLogger":
        """The chain's existing run, reopened to add results (an evaluation job): its status, attempt tags
        and start points are the training attempts' and stay as they are."""
        from mlflow.tracking import MlflowClient

        id_file = Path(run_dir) / MLFLOW_RUN_ID_FILE
        if not id_file.exists():
            raise UserError("the chain has no MLflow run yet: no training attempt has started", file=str(id_file),
                            hint="an evaluation job runs after the training attempt that writes its checkpoint")
        logger = cls.__new__(cls)
        with store_init_lock():
            logger.client = MlflowClient(tracking_uri=mlflow_tracking_uri())
        logger.run_id, logger.resumed = id_file.read_text().strip(), True
        return logger

    def _experiment_id(self, name: str, canonical: dict[str, Any]) -> str:
        """The ``idmctl`` experiment (created when missing) with idmctl's chart view charting this spec's
        metrics, and the spec's goal view (its goal's metric first) when it has a goal."""
        artifacts = mlflow_artifacts_dir()
        artifacts.mkdir(parents=True, exist_ok=True)
        evaluation = canonical.get("eval") or {}
        episodes = [int(n) for n in evaluation.get("episodes") or []]
        keys = [names.eef_metric(n) for n in episodes] + [names.M_LOSS]
        if evaluation.get("simulator"):
            keys += [names.eef_metric(n, simulator=True) for n in episodes]
        experiment_id = ensure_experiment(self.client, artifacts.as_uri(), keys)
        if canonical.get("goal"):
            goal = Goal.parse(str(canonical["goal"]))
            ensure_goal_view(self.client, experiment_id, name, str(goal), goal.metric, keys)
        return experiment_id

    def _log_params(self, flat: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)[:_MAX_PARAM_CHARS]) for key, value in sorted(flat.items())]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(key, float(value), stamp, step) for key, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_episodes(self, metric: str, step: int, protocol: dict[str, Any], episodes: list[tuple[str, float]]) -> None:
        """One evaluation's per-episode errors as a JSON artifact, and the protocol its metric is under as a tag."""
        document = {"metric": metric, "step": step, "protocol": protocol, "unit": "mm",
                    "episodes": [{"episode": name, "error_mm": float(value)} for name, value in episodes]}
        self.client.log_dict(self.run_id, document, names.episodes_artifact(metric, step))
        self.client.set_tag(self.run_id, names.protocol_tag(metric), str(protocol["name"]))

    def start_attempt(self, start_step: int) -> None:
        """Record that an attempt starts training at ``start_step`` (its checkpoint; 0 when fresh), before
        it logs any point: readers drop the earlier attempts' points past it (ground.tracking.surviving)."""
        from mlflow.entities import Metric

        ordinal = len(self.client.get_metric_history(self.run_id, names.M_ATTEMPT_START)) + 1
        self.client.log_batch(self.run_id, metrics=[
            Metric(names.M_ATTEMPT_START, float(ordinal), int(time.time() * 1000), start_step)])
        self.client.set_tag(self.run_id, names.TAG_ATTEMPT_START_STEP, str(start_step))

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def finish(self, status: str) -> None:
        """``FINISHED``, ``FAILED`` or ``KILLED`` (preempted: a later attempt reopens the run)."""
        self.client.set_terminated(self.run_id, status=status)

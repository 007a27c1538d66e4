"""The links ``idmctl ui``, ``compare`` and ``decide`` print: MLflow's runs chart view with the EEF mm
charts first, each spec's goal view (its goal's metric first), and the pages of the runs decided.

Writes what the links need into the MLflow store first (the ``idmctl`` experiment, its experiment
kind, idmctl's saved views: :mod:`ground.mlflow_view`). Imports mlflow when called.
"""

from __future__ import annotations

import re

from ground import tracking
from ground.mlflow_store import store_init_lock
from ground.mlflow_view import (ensure_experiment, ensure_goal_view, goal_views, run_page_url,
                                runs_chart_url)
from ground.paths import mlflow_artifacts_dir, mlflow_tracking_uri

_CHARTED_FIRST = re.compile(r"^(sim_)?eef_mm_\d+ep$")


def store_metric_keys(client: object, experiment_id: str) -> list[str]:
    """EEF metric keys any run of the experiment has logged (the view orders them; MLflow appends the rest)."""
    keys: set[str] = set()
    for run in client.search_runs([experiment_id], max_results=5000):  # type: ignore[attr-defined]
        keys.update(key for key in run.data.metrics if _CHARTED_FIRST.match(key))
    return sorted(keys)


def runs_chart_link(base_url: str, metric_keys: list[str] | None = None) -> str:
    """Make sure the experiment and its view exist and chart ``metric_keys`` (default: the store's EEF
    metrics), then return the URL of the runs chart view on ``base_url``."""
    from mlflow.tracking import MlflowClient

    with store_init_lock():  # the first connect seeds or migrates the store
        client = MlflowClient(tracking_uri=mlflow_tracking_uri())
        client.search_experiments(max_results=1)
    artifacts = mlflow_artifacts_dir()
    artifacts.mkdir(parents=True, exist_ok=True)
    experiment_id = ensure_experiment(client, artifacts.as_uri(), [])
    keys = store_metric_keys(client, experiment_id) if metric_keys is None else metric_keys
    ensure_experiment(client, artifacts.as_uri(), keys)
    return runs_chart_url(base_url, experiment_id)


def runs_chart_line(label: str, base_url: str, metric_keys: list[str] | None = None) -> str:
    """``label: <url>``, or why there is no link (the table above is still right; this is a convenience)."""
    try:
        return f"{label}: {runs_chart_link(base_url, metric_keys)}"
    except Exception as exc:  # a locked or unreadable store must not turn a report into a traceback
        return f"{label}: not available ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


def goal_view_lines(base_url: str) -> list[str]:
    """``<view name>: <url>`` for each spec's goal view in the store (written by the trainer and decide)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    try:
        experiment = client.get_experiment_by_name(tracking.MLFLOW_EXPERIMENT)
    except Exception as exc:  # a locked or unreadable store must not stop the UI it only adds links to
        return [f"goal views: not available ({type(exc).__name__})"]
    if experiment is None:
        return []
    return [f"{name}: {runs_chart_url(base_url, experiment.experiment_id, key)}"
            for key, name in goal_views(dict(experiment.tags))]


def decision_lines(decided: list[tuple[str, str, str]], base_url: str) -> list[str]:
    """For the runs ``idmctl decide`` tagged, as (run id, goal text, goal metric): bring each spec's goal
    view up to date (the decided goal's metric first) and return its link and each run's page, where
    the ``idmctl.decision.*`` tags are."""
    if not decided:
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    lines: list[str] = []
    views: dict[str, str] = {}
    for run_id, goal, goal_metric in decided:
        run = client.get_run(run_id)
        experiment_id = run.info.experiment_id
        spec = run.data.tags.get(tracking.TAG_EXPERIMENT)
        if spec and spec not in views:
            key = ensure_goal_view(client, experiment_id, spec, goal, goal_metric, [goal_metric])
            views[spec] = runs_chart_url(base_url, experiment_id, key)
            lines.append(f"MLflow {spec} runs, goal {goal_metric} first: {views[spec]}")
        label = run.info.run_name or run_id
        lines.append(f"MLflow run {label} (verdict in its tags): {run_page_url(base_url, experiment_id, run_id)}")
    return lines

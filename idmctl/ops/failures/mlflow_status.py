"""Mark a failed job's MLflow run FAILED/KILLED with the cause: MLflow has no failure reason of its own,
and runs of cancelled jobs otherwise stay RUNNING forever."""

from __future__ import annotations

from idmctl.ops.failures.classify import get_cause
from ground.paths import mlflow_tracking_uri
from ground.tracking import TAG_FAILURE_CAUSE, TAG_SLURM_STATE
from ground.mlflow_store import store_init_lock


def mark_run_failed(run_id: str, cause: str, slurm_state: str, tracking_uri: str | None = None) -> str:
    """Tag the run with ``failure_cause``/``slurm_state`` and end it with the cause's status; returns it."""
    from mlflow.tracking import MlflowClient  # heavy (~1.3 s): only when a run must be marked

    status = get_cause(cause).mlflow_status

    with store_init_lock():
        client = MlflowClient(tracking_uri=tracking_uri or mlflow_tracking_uri())
    client.set_tag(run_id, TAG_FAILURE_CAUSE, cause)
    client.set_tag(run_id, TAG_SLURM_STATE, slurm_state)
    client.set_terminated(run_id, status=status)
    return status

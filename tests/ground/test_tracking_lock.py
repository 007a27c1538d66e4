"""Several processes opening a brand-new MLflow store at once (parallel jobs' first attempts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fork_support import failures_of, start_forked
from ground.contract import ENV_HOME
from ground.mlflow_store import store_init_lock
from ground.paths import mlflow_tracking_uri


def _open_store_and_create_a_run() -> None:
    from mlflow.tracking import MlflowClient

    with store_init_lock():
        client = MlflowClient(tracking_uri=mlflow_tracking_uri())
        client.search_experiments(max_results=1)
    client.create_run(client.get_experiment_by_name("Default").experiment_id)


@pytest.mark.slow
def test_three_processes_initialise_one_new_store_without_crashing(idmctl_home: Path, tmp_path: Path):
    # Forked from this process with MLflow's SQL store already imported (~2.5 s of CPU a fresh interpreter
    # spent first), so the three reach the new store's initialisation together. Imported here, not at the
    # module's top: collection in every worker would pay it.
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: F401
    from mlflow.tracking import MlflowClient

    children = [start_forked(_open_store_and_create_a_run, f"store opener {k}", output=tmp_path / f"open{k}.log",
                             env={ENV_HOME: str(idmctl_home)}) for k in range(3)]
    failures = failures_of(children, deadline_s=180)
    assert not failures, failures[0]
    assert (idmctl_home / "mlflow.sqlite").exists()
    runs = MlflowClient(tracking_uri=f"sqlite:///{idmctl_home / 'mlflow.sqlite'}").search_runs(["0"])
    assert len(runs) == 3

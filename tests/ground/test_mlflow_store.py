"""A new MLflow store starts as a copy of the empty-schema template: the store MLflow would have built."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.mlflow_store import seed_new_store, store_init_lock, template_path
from test_sqlite_template import schema_of


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def test_a_seeded_store_is_the_one_mlflow_builds_with_this_homes_default_experiment(
        own_cache: Path, idmctl_home: Path, tmp_path: Path):
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking import MlflowClient

    built = tmp_path / "built-by-mlflow.sqlite"
    SqlAlchemyStore(f"sqlite:///{built}", str(tmp_path / "built-artifacts")).engine.dispose()

    with store_init_lock():
        client = MlflowClient(tracking_uri=f"sqlite:///{idmctl_home / 'mlflow.sqlite'}")
        default = client.get_experiment("0")
    assert template_path().parent == own_cache / "idmctl" and template_path().exists()
    assert schema_of(idmctl_home / "mlflow.sqlite") == schema_of(built)
    # The template's own default experiment was dropped: MLflow made this home's on first open.
    assert default.name == "Default" and default.artifact_location.startswith(str(Path.cwd()))
    assert str(own_cache) not in default.artifact_location
    run = client.create_run("0")
    assert client.get_run(run.info.run_id).info.status == "RUNNING"


def test_a_store_that_exists_or_is_not_a_sqlite_file_is_left_to_mlflow(own_cache: Path, idmctl_home: Path):
    store = idmctl_home / "mlflow.sqlite"
    store.parent.mkdir(parents=True)
    store.write_bytes(b"kept as it is")
    assert seed_new_store() is False
    assert store.read_bytes() == b"kept as it is"
    assert seed_new_store("postgresql://u@db/mlflow") is False
    assert seed_new_store("sqlite:///:memory:") is False
    assert not (own_cache / "idmctl").exists()  # nothing was built for stores it does not seed


def test_a_cache_that_cannot_be_written_leaves_the_migrations_to_mlflow(tmp_path: Path, idmctl_home: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    from mlflow.tracking import MlflowClient

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the cache directory would go\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert seed_new_store() is False
    assert not (idmctl_home / "mlflow.sqlite").exists()
    with store_init_lock():
        client = MlflowClient(tracking_uri=f"sqlite:///{idmctl_home / 'mlflow.sqlite'}")
        assert client.get_experiment("0").name == "Default"
    assert sorted(p.name for p in idmctl_home.iterdir() if p.name.startswith(".mlflow.sqlite.tmp")) == []

"""Shared fixtures: every test gets its own ``$IDMCTL_HOME``; CLI tests drive typer's CliRunner."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ground.contract import ENV_CLUSTER, ENV_EXPERIMENTS, ENV_HOME

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def idmctl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "idmctl_home"
    monkeypatch.setenv(ENV_HOME, str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(ENV_CLUSTER, raising=False)
    monkeypatch.delenv(ENV_EXPERIMENTS, raising=False)
    return home


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Run the test on the embedded SQLite store and on a fresh database of the real PostgreSQL
    (IDMCTL_DB_URL, as a team sets it): yields the backend's name."""
    from ground.contract import ENV_DB_URL

    if request.param == "sqlite":
        monkeypatch.delenv(ENV_DB_URL, raising=False)
        yield "sqlite"
        return
    from pg_support import fresh_database

    with fresh_database() as url:
        monkeypatch.setenv(ENV_DB_URL, url)
        yield "postgresql"


@pytest.fixture(autouse=True)
def _no_shared_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own IDMCTL_DB_URL must never receive test rows.
    from ground.contract import ENV_DB_URL

    monkeypatch.delenv(ENV_DB_URL, raising=False)


@pytest.fixture(autouse=True)
def signal_dispositions_kept():
    """Every subprocess a test starts inherits the pytest process's signal dispositions: a test that
    leaves SIGTERM ignored makes every later trainer, job script and CPU hog unstoppable by TERM."""
    import signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    changed = [sig.name for sig, handler in before.items() if signal.getsignal(sig) is not handler]
    for sig, handler in before.items():
        signal.signal(sig, handler)
    assert not changed, f"the test left {', '.join(changed)} handled differently in the pytest process"


@pytest.fixture
def cli():
    """Invoke the real CLI in-process: ``cli("exp", "list")`` → click Result."""
    from idmctl.cli.app import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory):
    """A tiny real data set for the routed DiT, shared by the session: a robomimic HDF5 (8 demos of 12
    steps; mask/train 6, mask/valid 2) and safetensors hidden caches (4 layers × 6 frames × 2×2 × 16,
    float32), written with cache.episodes / cache.hidden. ``.spec_path`` is a runnable spec over it;
    ``.spec_file(dir, name, train={...}, ...)`` writes variants. See trainers/tiny_data.py."""
    from trainers.tiny_data import TinyCache

    return TinyCache.create(tmp_path_factory.mktemp("tiny_cache"))

"""Where things live: the repository's shipped files and the user's ``$IDMCTL_HOME``."""

from __future__ import annotations

import os
from pathlib import Path

from ground.contract import ENV_EXPERIMENTS, ENV_HOME

REPO_ROOT = Path(__file__).resolve().parent.parent


def experiments_dir() -> Path:
    """Directory of experiment specs; ``$IDMCTL_EXPERIMENTS`` overrides the shipped one."""
    return Path(os.environ.get(ENV_EXPERIMENTS, REPO_ROOT / "experiments"))


def clusters_dir() -> Path:
    """Directory of shipped cluster profiles."""
    return REPO_ROOT / "clusters"


def home() -> Path:
    """The user's idmctl state: SQLite store, MLflow store, job logs, local checkpoints.

    Defaults to a per-user data directory on the submitting host's local disk (SQLite on NFS corrupts).
    """
    explicit = os.environ.get(ENV_HOME)
    if explicit:
        return Path(explicit).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "idmctl"


def db_path() -> Path:
    return home() / "idmctl.sqlite"


def mlflow_tracking_uri() -> str:
    """MLflow's SQLite store beside ours; trainers log here whether or not ``idmctl ui`` runs."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home() / 'mlflow.sqlite'}"


def mlflow_artifacts_dir() -> Path:
    return home() / "mlartifacts"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def expand_path(text: str) -> Path:
    """A spec path with ``~`` and ``$VARS`` expanded; ``$IDMCTL_HOME`` always has its resolved value."""
    env = dict(os.environ)
    env.setdefault(ENV_HOME, str(home()))
    expanded = text
    for key in sorted(env, key=len, reverse=True):
        expanded = expanded.replace(f"${{{key}}}", env[key]).replace(f"${key}", env[key])
    return Path(expanded).expanduser()

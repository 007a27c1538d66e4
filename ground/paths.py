"""Where things live: the repository's shipped files and the user's ``$IDMCTL_HOME``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from ground.contract import ENV_EXPERIMENTS, ENV_HOME
from ground.processes import alive

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


def runs_root(configured: str | None = None) -> Path:
    """Where run directories (logs, checkpoints, each attempt's script) live: the cluster profile's
    ``runs_root`` when it names one (a shared filesystem compute nodes mount, while the SQLite store stays
    on the login node's local disk), else ``$IDMCTL_HOME/runs``."""
    return expand_path(configured) if configured else home() / "runs"


def user_cache_dir() -> Path:
    """Files derived from the installed packages that any run may rebuild (the empty MLflow store):
    ``$XDG_CACHE_HOME/idmctl``, shared by every ``$IDMCTL_HOME`` of the user."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "idmctl"


def db_path() -> Path:
    return home() / "idmctl.sqlite"


def mlflow_tracking_uri() -> str:
    """MLflow's SQLite store beside ours; trainers log here whether or not ``idmctl ui`` runs."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home() / 'mlflow.sqlite'}"


def mlflow_artifacts_dir() -> Path:
    return home() / "mlartifacts"


def temp_path(path: Path) -> Path:
    """The hidden ``.<name>.tmp<pid>`` a writer fills before renaming it to ``path``."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def temp_files(directory: Path, of: str | None = None) -> list[Path]:
    """Hidden temp files in ``directory`` (only those of the file named ``of`` when given)."""
    if not directory.is_dir():
        return []
    prefix = f".{of}.tmp" if of else "."
    return sorted(p for p in directory.iterdir() if p.name.startswith(prefix) and ".tmp" in p.name)


def sweep_dead_temp_files(directory: Path, of: str | None = None) -> int:
    """Delete temp files and directories whose writer is gone: a killed writer's leftovers (``.tmp<pid>`` of a
    dead pid, or a ``.tmp`` without a pid, which only one writer at a time uses). A live writer's are left alone."""
    removed = 0
    for tmp in temp_files(directory, of):
        pid_text = tmp.name.rpartition(".tmp")[2].split(".")[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and alive(int(pid_text)):
            continue
        try:
            if tmp.is_dir() and not tmp.is_symlink():  # a checkpoint directory being filled (trainers.checkpoint)
                shutil.rmtree(tmp)
            else:
                tmp.unlink()
            removed += 1
        except FileNotFoundError:
            continue
    return removed


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
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


def exists(path: Path) -> bool:
    """Whether ``path`` exists; a name no filesystem can hold (too long, a NUL byte) names nothing:
    ``Path.exists`` raises OSError/ValueError for those (a 5,000-character ``extends:`` or ``--cluster``
    was a traceback)."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def why_not_a_directory(path: Path) -> str:
    """Why ``path`` cannot be used as a directory, in words: a regular file or a symlink to itself was
    reported as "does not exist", which sent people looking for a missing mount."""
    path = Path(path)
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python < 3.13 raises RuntimeError for a loop
            return "is a symlink loop"
        except OSError as exc:
            if exc.errno == 40:  # ELOOP
                return "is a symlink loop"
            return f"is a symlink to {os.readlink(path)}, which does not exist"
    if path.is_file():
        return "is a regular file, not a directory"
    if path.exists() and not path.is_dir():
        return "is not a directory"
    if path.is_dir():
        return "is a directory" if os.access(path, os.R_OK | os.X_OK) else "is a directory this user cannot read"
    return "does not exist"


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing parent: where a file system can be asked about a path not made yet."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def free_bytes(path: Path) -> int | None:
    """Free bytes (for an unprivileged user) of the file system that holds or will hold ``path``;
    None when it cannot be asked."""
    try:
        stats = os.statvfs(nearest_existing(path))
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def drop_from_page_cache(paths: Iterable[str | Path]) -> None:
    """Drop the files' pages from the page cache (``POSIX_FADV_DONTNEED`` after an fsync: the kernel keeps
    dirty pages, so they are written first): the next read of them comes from the disk."""
    for path in dict.fromkeys(paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

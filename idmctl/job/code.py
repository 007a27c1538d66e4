"""The code a chain runs: its snapshot in the code store, and the Python environment recorded beside it.

Submit freezes the tree it gated (``ground.code_snapshot``); every later attempt of the chain (sync's
resubmissions, Slurm's requeues, ``submit --resume``) runs that same snapshot. ``idmctl gc`` removes the
snapshots no unfinished chain uses (``idmctl.job.code_gc``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground import contract
from ground.code_snapshot import (OBJECTS_DIR, SNAPSHOTS_DIR, SnapshotError, Tree, code_tree, default_store,
                                  materialize, record_environment, snapshot_dir)
from ground.class_path import spec_roots
from ground.errors import UserError
from ground.paths import expand_path
from ground.code_snapshot import MANIFEST
from ground.code_snapshot import environment, environment_digest, known_environment

if TYPE_CHECKING:
    from ground.spec.schema import ExperimentSpec
    from idmctl.core.profile import ClusterProfile


@dataclass(frozen=True)
class JobCode:
    """What an attempt runs: the snapshot (by digest and folder) and the environment's digest."""

    version: str
    directory: str
    store: str
    env_digest: str
    commit: str | None = None
    import_dirs: tuple[str, ...] = ()
    """The snapshot's copies of the spec's ``code.roots``: on the job's import path, where class paths resolve."""

    def env(self) -> dict[str, str]:
        """The job script's exports: the trainer checks its code and environment against them."""
        return {contract.ENV_CODE_VERSION: self.version, contract.ENV_SNAPSHOT: self.directory,
                contract.ENV_CODE_STORE: self.store, contract.ENV_ENV_DIGEST: self.env_digest,
                **({contract.ENV_CODE_ROOTS: os.pathsep.join(self.import_dirs)} if self.import_dirs else {})}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, data: dict[str, Any] | None) -> "JobCode | None":
        """From a job row's ``code`` column (None for jobs submitted before snapshots: they ran the live tree)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{k: data[k] for k in ("version", "directory", "store", "env_digest")}, commit=data.get("commit"),
                       import_dirs=tuple(data.get("import_dirs") or ()))
        except (KeyError, TypeError):
            return None


def store_for(profile: "ClusterProfile") -> Path:
    return expand_path(profile.code_store) if profile.code_store else default_store()


def tree_for(spec: "ExperimentSpec") -> Tree:
    """The code a job of ``spec`` would run: the project and the spec's ``code.roots``."""
    try:
        return code_tree(spec_roots(spec))
    except SnapshotError as exc:
        raise UserError(str(exc), field="code.roots", hint="name folders that exist on this machine") from exc


def freeze(snapshot: Tree, profile: "ClusterProfile", spec: "ExperimentSpec") -> JobCode:
    """Materialise the gated tree in the profile's code store and record this Python environment."""
    store = store_for(profile)
    try:
        directory = materialize(snapshot, store)
        env_digest = record_environment(store)
    except (OSError, SnapshotError) as exc:
        raise UserError(f"cannot write the code snapshot: {exc}", field="code_store",
                        hint="point the cluster profile's code_store (or IDMCTL_HOME) at writable storage every node mounts") from exc
    dirs = tuple(str(p) for p in snapshot.import_dirs(directory, spec_roots(spec)))
    return JobCode(snapshot.version, str(directory), str(store), env_digest, snapshot.commit, dirs)


def planned(snapshot: Tree, profile: "ClusterProfile", spec: "ExperimentSpec") -> JobCode:
    """What :func:`freeze` would give, writing nothing (``submit --dry-run``)."""

    store = store_for(profile)
    directory = snapshot_dir(snapshot.snapshot_id, store)
    dirs = tuple(str(p) for p in snapshot.import_dirs(directory, spec_roots(spec)))
    env_digest = known_environment(store) or environment_digest(environment())
    return JobCode(snapshot.version, str(directory), str(store), env_digest, snapshot.commit, dirs)


def require_present(code: JobCode) -> None:
    """A resubmission needs its chain's snapshot still there (gc keeps it while the chain is unfinished)."""

    if not (Path(code.directory) / MANIFEST).exists():
        raise SnapshotError(f"the chain's code snapshot {code.directory} is gone")


# -- clean-up --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StoreUsage:
    store: Path
    snapshots: int
    objects: int
    object_bytes: int
    """Distinct file contents: what the snapshots cost on disk (their hard links cost nothing more)."""


def usage(store: Path | None = None) -> StoreUsage:
    store = store or default_store()
    snapshots = [p for p in (store / SNAPSHOTS_DIR).glob("*") if p.is_dir() and not p.name.startswith(".")] \
        if (store / SNAPSHOTS_DIR).is_dir() else []
    objects = [p for p in (store / OBJECTS_DIR).rglob("*") if p.is_file()] if (store / OBJECTS_DIR).is_dir() else []
    return StoreUsage(store, len(snapshots), len(objects), sum(p.stat().st_size for p in objects))

"""Checkpoints that are whole or ignored: ``<run_dir>/checkpoints/step-<N>.ckpt/``, one directory each.

A checkpoint directory holds the state Fabric saved (``state.ckpt``: one file, or a folder of shards
under a sharded strategy) and ``manifest.json``: every file's size and sha256, the step, the spec hash
and the code version, and the evaluation of that step. It is filled under a hidden temp name, every
file fsynced, the manifest written last, the directory fsynced, renamed into place and the parent
fsynced: after a crash at any point the name is either absent or names a directory whose bytes the
manifest vouches for (a node that dies after an unsynced rename could otherwise leave a complete name
over incomplete bytes).

Resume (:func:`resume`) takes the newest checkpoint whose files match its manifest and that loads; one
that does not is recorded as an event with its evidence (file, expected vs found) and moved aside to
``checkpoints/corrupt/``, so no later attempt loads it again. A single file ``step-<N>.ckpt`` is the
format before manifests: loaded unverified (there is nothing to check it against) with an event saying so.

Retention keeps the newest ``train.keep_last`` and, with ``train.keep_best``, the one with the best
evaluation of the goal's metric. Extras must stay plain Python types: ``fabric.load`` unpickles with
``weights_only=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ground.run_events import (CHECKPOINT, CHECKPOINT_CORRUPT, CHECKPOINT_UNLOADABLE, CHECKPOINT_UNVERIFIED,
                               append_event, record_event)

if TYPE_CHECKING:
    from lightning_fabric import Fabric

    from ground.spec.schema import ExperimentSpec

CHECKPOINT_DIR = "checkpoints"
CORRUPT_DIR = "corrupt"
"""Under ``checkpoints/``: checkpoints resume refused, kept as evidence and never listed again."""
STATE_FILE = "state.ckpt"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
_NAME = re.compile(r"^step-(\d{8})\.ckpt$")
_HASH_CHUNK = 1 << 20


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step-{step:08d}.ckpt"


def state_file(path: Path) -> Path:
    """What ``torch.load``/``fabric.load`` reads: the state inside a checkpoint directory, or a legacy file."""
    return path / STATE_FILE if path.is_dir() else path


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every published checkpoint, oldest first: temp names and ``corrupt/`` never match.
    Published is not verified: :func:`verify` says whether the bytes are the ones written."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), directory / name) for name in os.listdir(directory) if (m := _NAME.fullmatch(name))]
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that verifies (read-only: nothing is moved; :func:`resume` moves)."""
    for _, path in reversed(complete_checkpoints(run_dir)):
        if verify(path) is None:
            return path
    return None


# -- the manifest --------------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _files_under(directory: Path) -> list[Path]:
    """Every regular file below ``directory`` (a sharded state is a folder), in a stable order."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


@dataclass(frozen=True)
class Problem:
    """Why a checkpoint is not whole: the file, what the manifest says, what is there."""

    file: Path
    reason: str
    """``manifest_missing``, ``manifest_not_json``, ``manifest_invalid``, ``file_missing``, ``size``, ``sha256``,
    ``not_published`` (the name points nowhere)."""
    expected: str | None = None
    found: str | None = None

    def fields(self) -> dict[str, str | None]:
        return {"file": str(self.file), "reason": self.reason, "expected": self.expected, "found": self.found}


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A checkpoint directory's manifest, or None when it has none or it does not parse."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def verify(path: Path, step: int | None = None, spec_hash: str | None = None) -> Problem | None:
    """None when every file of ``path`` has the size and sha256 its manifest records (and the manifest's
    step and spec hash are the name's and the run's); else the first problem found. A legacy single
    file has no manifest and verifies only that it is there."""
    if path.is_file():
        return None
    if not path.is_dir():
        target = os.readlink(path) if path.is_symlink() else None
        return Problem(path, "not_published", expected="a checkpoint directory", found=target or "nothing")
    manifest_path = path / MANIFEST_FILE
    try:
        text = manifest_path.read_text()
    except OSError as exc:
        return Problem(manifest_path, "manifest_missing", expected=MANIFEST_FILE, found=exc.strerror or "unreadable")
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        return Problem(manifest_path, "manifest_not_json", expected="JSON", found=f"{exc} ({len(text)} characters)")
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list) or not files or not all(
            isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("bytes"), int)
            and isinstance(f.get("sha256"), str) for f in files):
        return Problem(manifest_path, "manifest_invalid", expected="files: [{path, bytes, sha256}, …]",
                       found=text[:120])
    if step is not None and manifest.get("step") != step:
        return Problem(manifest_path, "manifest_invalid", expected=f"step {step}", found=f"step {manifest.get('step')}")
    if spec_hash is not None and manifest.get("spec_hash") not in (None, spec_hash):
        return Problem(manifest_path, "manifest_invalid", expected=f"spec_hash {spec_hash[:12]}",
                       found=f"spec_hash {str(manifest.get('spec_hash'))[:12]}")
    for entry in files:
        file = path / entry["path"]
        if not file.resolve().is_relative_to(path.resolve()):
            return Problem(file, "manifest_invalid", expected="a path inside the checkpoint", found=entry["path"])
        try:
            size = file.stat().st_size
        except OSError:
            return Problem(file, "file_missing", expected=f"{entry['bytes']} B", found="missing")
        if size != entry["bytes"]:
            return Problem(file, "size", expected=f"{entry['bytes']} B", found=f"{size} B")
        found = sha256_file(file)
        if found != entry["sha256"]:
            return Problem(file, "sha256", expected=entry["sha256"], found=found)
    return None


def checkpoint_bytes(path: Path) -> int:
    """Bytes on disk of one checkpoint (the manifest's sum for a directory; the file's size for a legacy one)."""
    if path.is_file():
        return path.stat().st_size
    manifest = read_manifest(path)
    if manifest and isinstance(manifest.get("files"), list):
        return sum(int(f.get("bytes", 0)) for f in manifest["files"] if isinstance(f, dict))
    return sum(f.stat().st_size for f in _files_under(path))


# -- save ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Retention:
    """What :func:`prune` keeps: the newest ``keep_last``, and the best by ``metric`` when set."""

    keep_last: int = 2
    metric: str | None = None
    lower_is_better: bool = True

    @classmethod
    def of(cls, spec: "ExperimentSpec") -> "Retention":
        """The spec's ``train.keep_last``; with ``train.keep_best`` the goal's metric and direction
        (``<``/``<=``: lower is better), or ``eval.metric`` (an error, lower is better) without a goal."""
        metric, lower = None, True
        if spec.train.keep_best:
            goal = spec.goal_parsed
            metric = goal.metric if goal else spec.eval.metric
            lower = goal.op in ("<", "<=") if goal else True
        return cls(spec.train.keep_last, metric, lower)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest(directory: Path, step: int, spec_hash: str | None, code_version: str | None,
              metrics: dict[str, float] | None) -> dict[str, Any]:
    files = []
    for file in _files_under(directory):
        _fsync_path(file)
        files.append({"path": file.relative_to(directory).as_posix(), "bytes": file.stat().st_size,
                      "sha256": sha256_file(file)})
    return {"format": MANIFEST_FORMAT, "step": step, "spec_hash": spec_hash, "code_version": code_version,
            "written_at": datetime.now(timezone.utc).isoformat(), "metrics": dict(metrics or {}), "files": files}


def publish(tmp: Path, final: Path) -> None:
    """Rename the filled temp directory ``tmp`` to ``final`` durably: the directory, the rename and the
    parent's entry are fsynced. A checkpoint of the same step already there (a step saved again after
    a rollback) is replaced; the name is absent only between the two renames, never half-written."""
    _fsync_path(tmp)
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old.tmp{os.getpid()}")  # swept if killed here
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_path(final.parent)
    if old is not None:
        _remove(old)


def write_checkpoint_dir(final: Path, write_state: Callable[[Path], None], step: int, *,
                         spec_hash: str | None = None, code_version: str | None = None,
                         metrics: dict[str, float] | None = None) -> Path:
    """One process's whole save: a fresh temp directory, ``write_state(tmp / STATE_FILE)``, the manifest,
    :func:`publish`. (The collective :func:`save_checkpoint` splits these around Fabric's barriers.)"""
    tmp = _fresh_temp(final)
    write_state(tmp / STATE_FILE)
    _finish(tmp, final, step, spec_hash, code_version, metrics)
    return final


def _fresh_temp(final: Path) -> Path:
    # No pid in the name: every rank of a collective save must name the same directory. One trainer
    # runs per run directory at a time, so a temp directory found here is a killed attempt's.
    tmp = final.with_name(f".{final.name}.tmp")
    final.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        _remove(tmp)
    tmp.mkdir()
    return tmp


def _finish(tmp: Path, final: Path, step: int, spec_hash: str | None, code_version: str | None,
            metrics: dict[str, float] | None) -> None:
    manifest = _manifest(tmp, step, spec_hash, code_version, metrics)
    with open(tmp / MANIFEST_FILE, "w", encoding="utf-8") as handle:  # last: its presence means the rest is there
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    publish(tmp, final)


def save_checkpoint(fabric: "Fabric", run_dir: Path, step: int, state: dict[str, Any], *,
                    spec_hash: str | None = None, code_version: str | None = None,
                    metrics: dict[str, float] | None = None, retention: Retention = Retention()) -> Path:
    """Collective: every rank calls it. Fabric writes the state into the temp directory (rank 0 alone
    under DDP, every rank its shard under a sharded strategy); rank 0 writes the manifest, publishes,
    records the ``checkpoint`` event and prunes by ``retention``."""
    final = checkpoint_path(run_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    if fabric.global_rank == 0:
        _fresh_temp(final)
    fabric.barrier()
    fabric.save(tmp / STATE_FILE, state)
    fabric.barrier()
    if fabric.global_rank == 0:
        _finish(tmp, final, step, spec_hash, code_version, metrics)
        append_event(run_dir, CHECKPOINT, step=step)  # when work stopped being at risk (the ledger)
        prune(run_dir, retention)
    fabric.barrier()
    return final


def kept(checkpoints: list[tuple[int, Path]], retention: Retention) -> set[Path]:
    """The newest ``keep_last`` and the best by the retention's metric (ties: the newer)."""
    keep = {path for _, path in checkpoints[-retention.keep_last:]}
    if retention.metric:
        scored = []
        for step, path in checkpoints:
            value = (read_manifest(path) or {}).get("metrics", {}).get(retention.metric) if path.is_dir() else None
            if isinstance(value, (int, float)):
                scored.append(((value if retention.lower_is_better else -value), -step, path))
        if scored:
            keep.add(min(scored)[2])
    return keep


def prune(run_dir: Path, retention: Retention) -> list[Path]:
    """Delete the checkpoints :func:`kept` does not keep; returns them."""
    checkpoints = complete_checkpoints(run_dir)
    keep = kept(checkpoints, retention)
    removed = [path for _, path in checkpoints if path not in keep]
    for path in removed:
        _remove(path)
    return removed


def _remove(path: Path) -> None:
    """Delete a checkpoint; a directory is first renamed to a hidden temp name, so a kill during the
    deletion leaves a temp the next attempt sweeps, never a published name over half its files."""
    if path.is_dir() and not path.is_symlink():
        doomed = path if path.name.startswith(".") else path.with_name(f".{path.name}.del.tmp{os.getpid()}")
        if doomed != path:
            os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# -- resume --------------------------------------------------------------------------------------

def move_aside(path: Path) -> Path:
    """Move a refused checkpoint into ``checkpoints/corrupt/`` (a new name if one is there already)."""
    corrupt = path.parent / CORRUPT_DIR
    corrupt.mkdir(exist_ok=True)
    target, n = corrupt / path.name, 1
    while target.exists() or target.is_symlink():
        n += 1
        target = corrupt / f"{path.name}.{n}"
    os.rename(path, target)
    _fsync_path(path.parent)
    return target


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return str(path)


def refuse(run_dir: Path, step: int, path: Path, event: str, **evidence: Any) -> Path:
    """Move ``path`` aside and record why (both the ``events.jsonl`` line and the job log's)."""
    moved = move_aside(path)
    record_event(run_dir, event, step=step, **evidence, moved_to=_relative(moved, run_dir))
    return moved


def newest_whole(run_dir: Path, spec_hash: str | None = None, below: int | None = None) -> tuple[int, Path] | None:
    """The newest checkpoint (under step ``below``, when given) whose files match its manifest; every
    newer one that does not is moved aside with a ``checkpoint_corrupt`` event. Run by one process."""
    for step, path in reversed(complete_checkpoints(run_dir)):
        if below is not None and step >= below:
            continue
        problem = verify(path, step, spec_hash)
        if problem is None:
            return step, path
        evidence = problem.fields()
        evidence["file"] = _relative(problem.file, run_dir)
        refuse(run_dir, step, path, CHECKPOINT_CORRUPT, **evidence)
    return None


@dataclass(frozen=True)
class Resumed:
    path: Path | None
    """The checkpoint loaded; None: a fresh start."""
    state_touched: bool = False
    """A load failed part-way: without a checkpoint loaded after it, the model must be built again."""


def resume(fabric: "Fabric", run_dir: Path, state: dict[str, Any], spec_hash: str | None = None) -> Resumed:
    """Collective: load the newest checkpoint that verifies and loads into ``state``. Rank 0 verifies
    (and moves refused ones aside); every rank loads the one it names; a load that fails on any rank
    refuses that checkpoint and the next older one is tried."""
    below: int | None = None
    touched = False
    while True:
        found = newest_whole(run_dir, spec_hash, below) if fabric.global_rank == 0 else None
        step = fabric.broadcast(found[0] if found else None, src=0) if fabric.world_size > 1 else (
            found[0] if found else None)
        if step is None:
            return Resumed(None, touched)
        path = checkpoint_path(run_dir, step)
        error = ""
        try:
            load_checkpoint(fabric, path, state)
        except Exception as exc:  # noqa: BLE001 (any failure to load is a reason to fall back, not to crash)
            error = f"{type(exc).__name__}: {exc}"[:400]
        failed_ranks = _ranks_with(fabric, bool(error))
        if not failed_ranks:
            if fabric.global_rank == 0 and path.is_file():
                record_event(run_dir, CHECKPOINT_UNVERIFIED, step=step, file=_relative(path, run_dir),
                             reason="written before manifests: loaded without a check of its bytes")
            return Resumed(path, False)
        touched = True
        if fabric.global_rank == 0:
            refuse(run_dir, step, path, CHECKPOINT_UNLOADABLE, file=_relative(state_file(path), run_dir),
                   reason="load", found=error or f"failed on rank(s) {failed_ranks} (their logs say why)")
        elif error:
            print(f"rank {fabric.global_rank}: {path.name} does not load: {error}", file=sys.stderr, flush=True)
        fabric.barrier()
        below = step


def _ranks_with(fabric: "Fabric", flag: bool) -> list[int]:
    """The ranks on which ``flag`` is true (every rank learns the same list)."""
    if fabric.world_size == 1:
        return [0] if flag else []
    import torch

    flags = fabric.all_gather(torch.tensor([float(flag)], device=fabric.device)).reshape(-1)
    return [rank for rank, value in enumerate(flags.tolist()) if value > 0]


def load_checkpoint(fabric: "Fabric", path: Path, state: dict[str, Any]) -> None:
    """Restore ``state`` in place (model, optimizer, counters) from the checkpoint at ``path``."""
    remainder = fabric.load(state_file(path), state)
    state.update(remainder)

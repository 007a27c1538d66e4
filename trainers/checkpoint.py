"""Checkpoints in ``<run_dir>/checkpoints/step-<N>.ckpt``: plain state dicts, written atomically.

A checkpoint is saved to a hidden temp name and renamed into place only once complete, so a job
killed mid-write leaves nothing that reads as a checkpoint; resume picks the newest complete one.
Extras must stay plain Python types: ``fabric.load`` unpickles with ``weights_only=True``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.run_events import CHECKPOINT, append_event

if TYPE_CHECKING:
    from lightning_fabric import Fabric

CHECKPOINT_DIR = "checkpoints"
KEEP_LAST = 2
"""Complete checkpoints kept; older ones are deleted after a newer one is in place."""
_NAME = re.compile(r"^step-(\d{8})\.ckpt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / CHECKPOINT_DIR


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step-{step:08d}.ckpt"


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first; temp files never match."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), directory / name) for name in os.listdir(directory) if (m := _NAME.fullmatch(name))]
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(fabric: "Fabric", run_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Collective: every rank calls it; rank 0 writes ``step-<N>.ckpt`` via temp file + rename."""
    final = checkpoint_path(run_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    if fabric.global_rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
    fabric.barrier()
    fabric.save(tmp, state)
    fabric.barrier()
    if fabric.global_rank == 0:
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        append_event(run_dir, CHECKPOINT, step=step)  # when work stopped being at risk (the ledger)
        for _, old in complete_checkpoints(run_dir)[:-KEEP_LAST]:
            old.unlink(missing_ok=True)
    fabric.barrier()
    return final


def load_checkpoint(fabric: "Fabric", path: Path, state: dict[str, Any]) -> None:
    """Restore ``state`` in place (model, optimizer, counters) from ``path``."""
    remainder = fabric.load(path, state)
    state.update(remainder)

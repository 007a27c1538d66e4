"""Latent files: safetensors written through a temp file and ``os.replace``, so a name is a promise.

A file under its final name was written completely (fsync before the rename); a writer killed at
any point leaves at most a hidden ``.<name>.tmp<pid>`` that no reader counts as cached. Metadata
holds only deterministic values (no timestamps), so two builds of the same inputs are
byte-identical (the header is re-emitted with sorted keys, see :func:`canonical_header`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from ground.errors import UserError
from ground.paths import sweep_dead_temp_files


def write_latent(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Atomically write one sample's tensors; creates the slot directory on this first write."""
    payload = canonical_header(save({name: t.contiguous() for name, t in tensors.items()}, metadata=metadata))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def canonical_header(payload: bytes) -> bytes:
    """Re-emit the safetensors JSON header with sorted keys.

    safetensors writes its header from a hash map whose order changes from process to process, so
    two builds of identical tensors differ in header bytes; sorting makes builds byte-identical.
    Offsets are relative to the data block, so only the header (re-padded to 8 bytes) changes.
    """
    length = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8:8 + length])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + payload[8 + length:]


def read_latent(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a cached sample; a damaged file is a one-line error naming it."""
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"unreadable latent file ({exc})", file=str(path), field="latent",
                        hint="delete it; the next build re-encodes it") from exc


def read_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def remove_dead_temp_files(directory: Path) -> int:
    """Delete temp files whose writer process is gone (a live writer's are left alone)."""
    return sweep_dead_temp_files(directory)

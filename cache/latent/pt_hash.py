"""The PT meta hash: which point-map extractor output a ``_pt__<hash16>/`` directory holds.

Key = canonical JSON of the ``(resolved_path, size, mtime_ns)`` of every PT normalisation file,
the mean/std overrides, the resolved PT cache root and the extractor version; the directory takes
the first 16 hex digits of its sha256. Rewriting the norm file changes its mtime, hence the hash,
hence the directory: stale PT latents are never mixed with new ones, and the old directory stays
intact until someone deletes it (``idmctl cache status`` lists it as stale).

Memoized per process: each norm file is ``stat()``-ed at most once (card B: rank 0 computes it
once, with one stat per file, then every lookup is free). A process that rewrites a norm file
itself must call :func:`forget` for it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache.latent.layout import LatentLayout
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec.schema import LatentCacheSpec

HASH_CHARS = 16
_identity_memo: dict[str, tuple[str, int, int]] = {}


@dataclass(frozen=True)
class PtMeta:
    """The full hash key (written beside the data) and its digest."""

    key: dict[str, Any]
    digest: str

    @property
    def short(self) -> str:
        return self.digest[:HASH_CHARS]

    def sidecar_json(self) -> str:
        return json.dumps({"pt_meta_hash": self.digest, "key": self.key}, indent=2, sort_keys=True) + "\n"


def file_identity(path: Path) -> tuple[str, int, int]:
    """``(resolved_path, size, mtime_ns)`` of one file, stat()-ed once per process."""
    resolved = os.path.realpath(path)
    if resolved not in _identity_memo:
        try:
            info = os.stat(resolved)
        except FileNotFoundError as exc:
            raise UserError("PT normalisation file does not exist", file=str(path), field="latent.pt_norm_path",
                            hint="build the PT slot (`idmctl cache build EXP --mode pt`), which computes it") from exc
        _identity_memo[resolved] = (resolved, info.st_size, info.st_mtime_ns)
    return _identity_memo[resolved]


def forget(path: Path | None = None) -> None:
    """Drop memoized identities (one file, or all): call after rewriting a norm file in this process."""
    if path is None:
        _identity_memo.clear()
    else:
        _identity_memo.pop(os.path.realpath(path), None)


def pt_meta(norm_paths: list[Path], mean: list[float] | None, std: list[float] | None, pt_cache_root: Path,
            extractor_version: str) -> PtMeta:
    key = {
        "norm_files": [list(file_identity(p)) for p in norm_paths],
        "pt_norm_mean": mean,
        "pt_norm_std": std,
        "pt_cache_root": os.path.realpath(pt_cache_root),
        "extractor_version": extractor_version,
    }
    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return PtMeta(key, hashlib.sha256(canonical.encode()).hexdigest())


def norm_path_for(latent: LatentCacheSpec) -> Path:
    """The spec's norm file, or the default beside the PT slot directories."""
    if latent.pt_norm_path:
        return expand_path(latent.pt_norm_path)
    return LatentLayout.from_spec(latent).default_norm_path


def pt_meta_for(latent: LatentCacheSpec) -> PtMeta:
    """The PT meta hash of a spec's latent section (the norm file must exist)."""
    root = expand_path(latent.pt_cache_root or latent.cache_root)
    return pt_meta([norm_path_for(latent)], latent.pt_norm_mean, latent.pt_norm_std, root, latent.extractor_version)

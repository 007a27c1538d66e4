"""Where every latent lives, exactly as card B lays it out, and nothing created before it is written.

::

    <cache_root>/cache/video_latent/robocasa_hdf5/
      <F>x<H>x<W>_rgb/<key>_s<start>.safetensors          reused whatever the PT extractor does
      <F>x<H>x<W>_pt__<hash16>/<key>_s<start>.safetensors  renamed whenever the PT metadata changes
      <F>x<H>x<W>_ff[__<hash16>]/<key>_s<start>.safetensors
      episodes/  prompt_embeddings/

Directories are made by the first write into them (``files.write_latent``), so a PT-only build
leaves no empty ``_rgb/`` behind (the card's cosmetic bug). Episode keys are validated so that no
key can name a file outside its slot directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ground.errors import UserError
from ground.paths import expand_path
from ground.paths import temp_files as ground_temp_files
from ground.spec.schema import ExperimentSpec, LatentCacheSpec

SLOTS = ("rgb", "pt", "ff")
SOURCE = "robocasa_hdf5"
SUFFIX = ".safetensors"
PT_META_FILE = "pt_meta.json"
"""Sidecar in each ``_pt__<hash>/`` (and hashed ``_ff__<hash>/``) holding the full hash key."""
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")


def validate_key(key: str) -> str:
    """An episode key names one file stem inside a slot dir: no separators, no ``..``, no hidden names."""
    if not isinstance(key, str) or not _KEY.fullmatch(key) or ".." in key:
        raise UserError(f"episode key {key!r} is not a plain file name and could escape the cache root",
                        field="key", hint="use letters, digits, '_', '-' and '.' (e.g. demo_12)")
    return key


def sample_name(key: str, start: int) -> str:
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise UserError(f"sample start {start!r} is not a non-negative integer", field="start",
                        hint="starts are episode timesteps")
    return f"{validate_key(key)}_s{start}{SUFFIX}"


@dataclass(frozen=True)
class LatentLayout:
    """Slot directories for one geometry; ``pt_hash`` is needed only for PT (and hashed FF) paths."""

    cache_root: Path
    pt_cache_root: Path
    frames: int
    height: int
    width: int
    pt_hash: str | None = None
    ff_hashed: bool = True
    """FF carries the PT first frame (``use_pointmap``), so its directory follows the PT hash."""

    @classmethod
    def from_spec(cls, latent: LatentCacheSpec, pt_hash: str | None = None) -> "LatentLayout":
        root = expand_path(latent.cache_root)
        pt_root = expand_path(latent.pt_cache_root) if latent.pt_cache_root else root
        return cls(root, pt_root, latent.frames, latent.height, latent.width, pt_hash, latent.use_pointmap)

    @property
    def geometry(self) -> str:
        return f"{self.frames}x{self.height}x{self.width}"

    @property
    def base(self) -> Path:
        return self.cache_root / "cache" / "video_latent" / SOURCE

    @property
    def pt_base(self) -> Path:
        return self.pt_cache_root / "cache" / "video_latent" / SOURCE

    @property
    def episodes_dir(self) -> Path:
        return self.base / "episodes"

    @property
    def prompt_embeddings_dir(self) -> Path:
        return self.base / "prompt_embeddings"

    @property
    def default_norm_path(self) -> Path:
        return self.pt_base / f"{self.geometry}_pt_norm.json"

    def slot_dir(self, slot: str) -> Path:
        if slot == "rgb":
            return self.base / f"{self.geometry}_rgb"
        if slot == "pt":
            return self.pt_base / f"{self.geometry}_pt__{self._need_hash('pt')}"
        if slot == "ff":
            suffix = f"__{self._need_hash('ff')}" if self.ff_hashed else ""
            return self.base / f"{self.geometry}_ff{suffix}"
        raise UserError(f"unknown slot {slot!r}", field="slot", hint=f"one of {', '.join(SLOTS)}")

    def sample_path(self, slot: str, key: str, start: int) -> Path:
        directory = self.slot_dir(slot)
        path = directory / sample_name(key, start)
        # Belt and braces beside the key pattern: the normalised path must stay in its slot dir.
        if os.path.dirname(os.path.normpath(path)) != os.path.normpath(directory):
            raise UserError(f"episode key {key!r} escapes {directory}", field="key", hint="use a plain demo name")
        return path

    def pt_dirs(self) -> list[Path]:
        """Every ``_pt__<hash>/`` of this geometry on disk, current or stale."""
        if not self.pt_base.is_dir():
            return []
        return sorted(p for p in self.pt_base.glob(f"{self.geometry}_pt__*") if p.is_dir())

    def _need_hash(self, slot: str) -> str:
        if not self.pt_hash:
            raise UserError(f"the {slot} slot is named by the PT meta hash, which is not known yet",
                            field="latent.pt_norm_path", hint="build the PT slot first (it writes the norm file)")
        return self.pt_hash


def cached_files(directory: Path) -> list[Path]:
    """Complete latents in a slot dir: temp files (``.<name>.tmp<pid>``) are hidden and never count."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix == SUFFIX and not p.name.startswith("."))


def temp_files(directory: Path) -> list[Path]:
    """Leftovers of killed writers; never read as cached, removed by the next build."""
    return ground_temp_files(directory)


def latent_section(spec: ExperimentSpec) -> LatentCacheSpec:
    if spec.latent is None:
        raise UserError("the spec has no latent section", field="latent",
                        hint="add `latent:` (see experiments/latent_rgbpt_smoke.yaml)")
    return spec.latent


def sample_starts(latent: LatentCacheSpec, steps: int) -> list[int]:
    """Starts whose F frames fit in an episode of ``steps`` timesteps."""
    span = (latent.frames - 1) * latent.frame_stride
    if steps <= span:
        return []
    if latent.start_stride is None:
        return [0]
    return list(range(0, steps - span, latent.start_stride))

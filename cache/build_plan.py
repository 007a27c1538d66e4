"""What a cache build job will do, without torch: its output directory, the files still to build, its
inputs (model weights, the PT norm file) and what it wrote since a moment.

Both planes read it: the build preflight (``idmctl preflight EXP --build MODE``) judges a build from
it, and the build job (``trainers.build_job``) refuses to start on the same findings, printing the
failure marker the classifier knows. One definition, so a check cannot pass while the job fails.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ground.contract import BUILD_MODES, CAUSE_MISSING_WEIGHTS, CAUSE_PT_NORM_MISSING
from ground.errors import UserError
from ground.paths import expand_path, why_not_a_directory
from ground.spec.loader import ResolvedSpec

HIDDEN_SUFFIX = ".safetensors"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class BuildPlan:
    """One build's output and how much of it exists."""

    mode: str
    output_dir: Path
    """Where the files land (for PT before its norm file exists: the PT base, the hash dir is not named yet)."""
    total: int | None
    """Files the finished build holds (None: the episode file is not on this machine)."""
    present: int
    """Files already there (skipped by the build)."""

    @property
    def todo(self) -> int | None:
        return None if self.total is None else max(0, self.total - self.present)


def check_mode(resolved: ResolvedSpec, mode: str) -> None:
    """The mode exists and the spec has what it builds (a latent section for rgb/pt/ff)."""
    if mode not in BUILD_MODES:
        raise UserError(f"unknown build {mode!r}", file="command line", field="--build",
                        hint=f"one of {', '.join(BUILD_MODES)}")
    latent = resolved.spec.latent
    if mode != "hidden" and latent is None:
        raise UserError(f"--build {mode} needs a latent section", file=str(resolved.path), field="latent",
                        hint="add `latent:` (see experiments/latent_rgbpt_smoke.yaml), or --build hidden")
    if mode == "pt" and latent is not None and not latent.use_pointmap:
        raise UserError("--build pt but the spec has use_pointmap: false", file=str(resolved.path),
                        field="latent.use_pointmap", hint="set it to true or build rgb/ff only")
    if mode == "ff" and latent is not None and latent.skip_ff:
        raise UserError("--build ff but the spec has skip_ff: true", file=str(resolved.path), field="latent.skip_ff",
                        hint="set skip_ff: false to build first frames")
    if mode == "hidden" and resolved.spec.data.cache_format != "safetensors":
        raise UserError(f"the builder writes safetensors, the spec says {resolved.spec.data.cache_format}",
                        file=str(resolved.path), field="data.cache_format",
                        hint="set data.cache_format: safetensors (convert a legacy cache with `idmctl cache convert`)")


def plan(resolved: ResolvedSpec, mode: str) -> BuildPlan:
    """Output directory and file counts of ``mode`` (h5py reads the episode file; no torch)."""
    check_mode(resolved, mode)
    if mode == "hidden":
        return _hidden_plan(resolved)
    from cache.latent.layout import LatentLayout
    from cache.latent.status import latent_status

    status = latent_status(resolved)
    row = next(r for r in status["slots"] if r["slot"] == mode)
    if row["dir"] is None:  # PT/FF named by a hash whose norm file does not exist yet: nothing is built
        assert resolved.spec.latent is not None
        return BuildPlan(mode, LatentLayout.from_spec(resolved.spec.latent).pt_base, row["expected"], 0)
    return BuildPlan(mode, Path(row["dir"]), row["expected"], row["present"])


def _hidden_plan(resolved: ResolvedSpec) -> BuildPlan:
    from cache.episodes import EpisodeFile

    data = resolved.spec.data
    root = expand_path(data.cache_root)
    episodes_path = expand_path(data.episodes)
    if not episodes_path.exists():
        return BuildPlan("hidden", root, None, 0)
    episodes = EpisodeFile(episodes_path)
    try:
        demos = episodes.demos("all")
    finally:
        episodes.close()
    # Existence only: the builder also rebuilds files of another geometry or models (a stale cache),
    # which preflight's cache check reports; here a present file counts as skipped.
    present = sum((root / f"{demo}{HIDDEN_SUFFIX}").exists() for demo in demos)
    return BuildPlan("hidden", root, len(demos), present)


@dataclass(frozen=True)
class Problem:
    """Why a build cannot start: the taxonomy cause the job reports, the message, the spec field, the fix."""

    cause: str
    message: str
    field: str
    fix: str


def weights_problem(resolved: ResolvedSpec, mode: str) -> Problem | None:
    """Model weights the build loads are not on this machine (``tiny`` is a seeded config: no weights)."""
    if mode == "hidden":
        return _hidden_models_problem(resolved)
    latent = resolved.spec.latent
    assert latent is not None
    if latent.vae == "tiny":
        return None
    directory = expand_path(latent.vae)
    for candidate in (directory / "vae", directory):
        if candidate.is_dir() and _weights_folder(candidate):
            return None
    what = why_not_a_directory(directory) if not directory.is_dir() else "holds no config.json with weights (vae/ or itself)"
    return Problem(CAUSE_MISSING_WEIGHTS, f"VAE weights directory {directory} {what}", "latent.vae",
                   "point latent.vae at a local diffusers AutoencoderKLWan folder (or 'tiny' for smoke runs)")


def _weights_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(p.suffix in _WEIGHT_SUFFIXES for p in folder.iterdir())


def _hidden_models_problem(resolved: ResolvedSpec) -> Problem | None:
    """``data.models``: both folders with a config and weights, and a transformer as wide and as deep as
    the cache the spec describes. Only the configs are read (the weights are tens of GB); the build
    preflight's encode smoke then loads them with the builder's own ``load_models``."""
    data = resolved.spec.data
    if data.models == "tiny":
        return None
    root = expand_path(data.models)
    fix = "point data.models at a local folder with vae/ and transformer/ (save_pretrained layout), or 'tiny'"
    if not root.is_dir():
        return Problem(CAUSE_MISSING_WEIGHTS, f"model directory {root} {why_not_a_directory(root)}", "data.models", fix)
    for name in ("vae", "transformer"):
        folder = root / name
        if not folder.is_dir() or not _weights_folder(folder):
            return Problem(CAUSE_MISSING_WEIGHTS, f"{folder} holds no config.json with weights", "data.models", fix)
    try:
        config = json.loads((root / "transformer" / "config.json").read_text())
        width = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
        depth = int(config["num_layers"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Problem(CAUSE_MISSING_WEIGHTS, f"{root / 'transformer' / 'config.json'} is not a Cosmos transformer "
                       f"config ({type(exc).__name__}: {exc})", "data.models", fix)
    if width != data.channels or depth <= max(data.cached_layers):
        return Problem(CAUSE_MISSING_WEIGHTS, f"the transformer in {root} has hidden size {width} and {depth} blocks; "
                       f"the spec caches {data.channels} channels of blocks {data.cached_layers}", "data.channels",
                       "use the model the cache is meant for, or fix data.channels / data.cached_layers")
    return None


def norm_problem(resolved: ResolvedSpec, mode: str) -> Problem | None:
    """FF with point maps reads the PT norm file (its directory is named by it) and never computes it."""
    latent = resolved.spec.latent
    if mode != "ff" or latent is None or not latent.use_pointmap:
        return None
    from cache.latent.pt_hash import norm_path_for

    path = norm_path_for(latent)
    if path.exists():
        return None
    return Problem(CAUSE_PT_NORM_MISSING, f"FF needs the PT norm file {path}, which does not exist",
                   "latent.pt_norm_path", "build PT first (`--build pt` computes it), then FF (card B's order)")




def written_since(directory: Path, since: float) -> tuple[int, int]:
    """(files, bytes) of complete cache files in ``directory`` modified at or after ``since`` (epoch s):
    what one attempt wrote (a resumed attempt's skipped files are older)."""
    files = size = 0
    if not directory.is_dir():
        return 0, 0
    for entry in os.scandir(directory):
        if entry.name.startswith(".") or not entry.name.endswith(HIDDEN_SUFFIX) or not entry.is_file():
            continue
        stat = entry.stat()
        if stat.st_mtime >= since:
            files += 1
            size += stat.st_size
    return files, size

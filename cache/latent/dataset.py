"""The latent dataset: each sample's RGB row, PT row and first frame, loaded or built slot by slot.

One class serves training (load what exists, encode what is missing: "lazy fill") and the
standalone builder (``build_only_slot``: touch one slot, return a placeholder). The trainer's
pre-filter asks :meth:`LatentCacheDataset.is_sample_cached` and knows nothing of suffixes or
hashes (card B).

Sample ``(key, start)`` covers episode timesteps ``start + i·frame_stride`` for i < F; its actions
are the ``(F-1)·frame_stride`` actions taken between the first and the last frame.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from cache.episodes import EpisodeFile
from cache.latent.encoder import VideoEncoder, load_encoder
from cache.latent.files import read_latent, write_latent
from cache.latent.layout import PT_META_FILE, SLOTS, LatentLayout, latent_section, sample_starts
from cache.latent.pointmaps import normalise, read_norm_file, window_points
from cache.latent.pt_hash import PtMeta, norm_path_for, pt_meta_for
from ground.errors import UserError
from ground.paths import atomic_write_text, expand_path
from ground.spec.schema import ExperimentSpec, LatentCacheSpec

PT_RANGE = 3.0
"""Standardised points are divided by this and clipped to the VAE's [-1, 1] (±3 std kept)."""
_FROM_SPEC: Any = object()


def needs_pt_hash(latent: LatentCacheSpec, slots: tuple[str, ...]) -> bool:
    return "pt" in slots or ("ff" in slots and latent.use_pointmap)


class LatentCacheDataset(Dataset):
    """Samples of the three-way cache for one spec; ``build_only_slot`` defaults to the spec's."""

    def __init__(self, spec: ExperimentSpec, *, build_only_slot: str | None = _FROM_SPEC,
                 encoder: VideoEncoder | None = None, pt_meta: PtMeta | None = None,
                 device: torch.device | None = None):
        self.latent = latent_section(spec)
        slot = self.latent.build_only_slot if build_only_slot is _FROM_SPEC else build_only_slot
        if slot is not None and slot not in SLOTS:
            raise UserError(f"build_only_slot {slot!r} is not a slot", field="latent.build_only_slot",
                            hint=f"one of {', '.join(SLOTS)}, or leave it unset")
        self.build_only_slot = slot
        self.slots: tuple[str, ...] = (slot,) if slot else self.latent.slots
        if needs_pt_hash(self.latent, self.slots) and pt_meta is None:
            pt_meta = pt_meta_for(self.latent)
        self.pt_meta = pt_meta
        self.layout = LatentLayout.from_spec(self.latent, pt_meta.short if pt_meta else None)
        self.episodes = EpisodeFile(expand_path(spec.data.episodes))
        self.samples: list[tuple[str, int]] = [
            (demo, start) for demo in self.episodes.demos(self.latent.split)
            for start in sample_starts(self.latent, self.episodes.num_samples(demo))]
        self._encoder = encoder
        self._device = device
        """Where the encoder loads when it is not given (a builder rank's device; the CPU when None)."""
        self._norm: tuple[list[float], list[float]] | None = None
        self.encoded: Counter[str] = Counter()
        """Files this process encoded per slot (the builder's report; cached loads do not count)."""

    def __len__(self) -> int:
        return len(self.samples)

    def sample_path(self, slot: str, key: str, start: int) -> Path:
        return self.layout.sample_path(slot, key, start)

    def is_sample_cached(self, key: str, start: int = 0) -> bool:
        """True when every slot this dataset needs (only the built one in build-only mode) is on disk."""
        return all(self.sample_path(slot, key, start).exists() for slot in self.slots)

    def __getitem__(self, index: int) -> dict[str, Any]:
        key, start = self.samples[index]
        if self.build_only_slot:
            built = self.ensure(self.build_only_slot, key, start)
            return {"key": key, "start": start, "slot": self.build_only_slot, "built": built}
        item: dict[str, Any] = {"key": key, "start": start, "actions": self._actions(key, start)}
        for slot in self.slots:
            tensors = self.load_or_build(slot, key, start)
            if slot == "ff":
                item.update({f"ff_{name}": tensor for name, tensor in tensors.items()})
            else:
                item[slot] = tensors["latent"]
        return item

    def ensure(self, slot: str, key: str, start: int) -> bool:
        """Encode and write one slot's file unless it exists; True when this call encoded it."""
        if self.sample_path(slot, key, start).exists():
            return False
        self._build(slot, key, start)
        return True

    def load_or_build(self, slot: str, key: str, start: int) -> dict[str, torch.Tensor]:
        path = self.sample_path(slot, key, start)
        if path.exists():
            return read_latent(path)
        if getattr(self.latent, f"strict_{slot}_must_exist"):
            raise UserError(f"{slot} latent is missing and strict_{slot}_must_exist is set", file=str(path),
                            field=f"latent.strict_{slot}_must_exist",
                            hint=f"build it first: idmctl cache build EXP --mode {slot}")
        return self._build(slot, key, start)

    # -- building ---------------------------------------------------------------------------------

    @property
    def encoder(self) -> VideoEncoder:
        if self._encoder is None:
            self._encoder = load_encoder(self.latent.vae, self._device)
        return self._encoder

    def _build(self, slot: str, key: str, start: int) -> dict[str, torch.Tensor]:
        if slot == "rgb":
            tensors = {"latent": self.encoder.encode(self._rgb_clips(key, start, self.latent.frames))}
        elif slot == "pt":
            tensors = {"latent": self.encoder.encode(self._pt_clips(key, start, self.latent.frames))}
        else:
            tensors = {"rgb": self.encoder.encode(self._rgb_clips(key, start, 1))}
            if self.latent.use_pointmap:
                tensors["pt"] = self.encoder.encode(self._pt_clips(key, start, 1))
        path = self.sample_path(slot, key, start)
        hashed = slot == "pt" or (slot == "ff" and self.layout.ff_hashed)
        if hashed and self.pt_meta is not None:
            sidecar = path.parent / PT_META_FILE
            if not sidecar.exists():
                atomic_write_text(sidecar, self.pt_meta.sidecar_json())
        write_latent(path, tensors, self._metadata(slot, key, start, hashed))
        self.encoded[slot] += 1
        return tensors

    def _metadata(self, slot: str, key: str, start: int, hashed: bool) -> dict[str, str]:
        meta = {"slot": slot, "key": key, "start": str(start), "frames": str(self.latent.frames),
                "height": str(self.latent.height), "width": str(self.latent.width),
                "frame_stride": str(self.latent.frame_stride), "cameras": ",".join(self.latent.cameras),
                "encoder": self.encoder.name, "precision": self.encoder.precision}
        if hashed and self.pt_meta is not None:
            meta["pt_meta_hash"] = self.pt_meta.digest
        return meta

    def _timesteps(self, start: int, frames: int) -> range:
        return range(start, start + (frames - 1) * self.latent.frame_stride + 1, self.latent.frame_stride)

    def _rgb_clips(self, key: str, start: int, frames: int) -> torch.Tensor:
        steps = self._timesteps(start, frames)
        views = []
        for camera in self.latent.cameras:
            images = self.episodes.obs(key, f"{camera}_image", steps.start, steps.stop)[:: self.latent.frame_stride]
            self._check_size(images.shape[1:3], key, f"{camera}_image")
            clip = torch.from_numpy(np.ascontiguousarray(images)).permute(3, 0, 1, 2).float() / 127.5 - 1.0
            views.append(clip)
        return torch.stack(views)

    def _pt_clips(self, key: str, start: int, frames: int) -> torch.Tensor:
        mean, std = self._norm_stats()
        views = []
        for camera in self.latent.cameras:
            maps = []
            for points, valid in window_points(self.episodes, key, camera, self._timesteps(start, frames),
                                               self.latent.pt_max_depth):
                self._check_size(points.shape[:2], key, f"{camera}_depth")
                maps.append(normalise(points, valid, mean, std))
            clip = torch.from_numpy(np.stack(maps)).permute(3, 0, 1, 2) / PT_RANGE
            views.append(clip.clamp(-1.0, 1.0))
        return torch.stack(views)

    def _norm_stats(self) -> tuple[list[float], list[float]]:
        if self._norm is None:
            stats = read_norm_file(norm_path_for(self.latent))
            self._norm = (self.latent.pt_norm_mean or stats.mean, self.latent.pt_norm_std or stats.std)
        return self._norm

    def _check_size(self, shape: tuple[int, ...], key: str, obs_key: str) -> None:
        expected = (self.latent.height, self.latent.width)
        if tuple(shape) != expected:
            raise UserError(f"recorded frames are {shape[0]}×{shape[1]} px but the spec asks for "
                            f"{expected[0]}×{expected[1]} (frames are never resized)",
                            file=str(self.episodes.path), field="latent.height/latent.width",
                            hint=f"set latent.height: {shape[0]}, width: {shape[1]} (data/{key}/obs/{obs_key})")

    def _actions(self, key: str, start: int) -> torch.Tensor:
        stop = start + (self.latent.frames - 1) * self.latent.frame_stride
        return torch.from_numpy(np.asarray(self.episodes.actions(key, start, stop), dtype=np.float32))


def prepare_pt_norm(spec: ExperimentSpec, recompute: bool = False) -> Path:
    """Run the PT extractor's statistics pass when the norm file is missing (or on request).

    Call it on one process only (rank 0): the file's mtime feeds the PT hash, so two ranks writing
    it would name two different directories.
    """
    from cache.latent.pointmaps import compute_norm_stats, write_norm_file

    latent = latent_section(spec)
    path = norm_path_for(latent)
    if path.exists() and not recompute:
        return path
    episodes = EpisodeFile(expand_path(spec.data.episodes))
    try:
        stats = compute_norm_stats(episodes, episodes.demos(latent.split), latent.cameras, latent.frame_stride,
                                   latent.pt_max_depth)
    finally:
        episodes.close()
    write_norm_file(path, stats, latent.extractor_version)
    return path

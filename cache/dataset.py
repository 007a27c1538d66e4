"""Datasets over (episode file, hidden-state cache): what the routed IDM trains on.

A sample is a window of ``frame_window`` consecutive cache frames starting at frame ``s`` of one
demo, plus the action chunk that starts at the window's first timestep. Cache frame ``f`` shows
episode timestep ``f × frame_stride`` (``frame_stride`` is in each cache file's metadata), so the
chunk starts at ``t0 = s × frame_stride``:

- ``hidden``      (N, T_w, H, W, C) in the cache's dtype (bf16 for card A), cache indices
  ``selected_layer_indices``: never converted on the host; the model converts it on its device
- ``actions``     (action_horizon, A) float32, actions ``t0 .. t0 + action_horizon - 1``, zero past the end
- ``action_mask`` (action_horizon,) bool, False past the episode's last action
- ``eef_pos``     (action_horizon + 1, 3) float32, recorded ``robot0_eef_pos`` at ``t0 .. t0 + action_horizon``;
  past the end the last recorded position repeats (the robot holds still)
- ``demo`` str, ``start`` int (the window's first cache frame)

Files are opened lazily inside the process that reads them (each DataLoader worker its own).
The trainer's ``num_workers 0`` path does not go through ``__getitem__`` for the hidden states:
:class:`cache.batches.BatchLoader` reads each sample's :meth:`~HiddenMultiLayerDataset.hidden_ranges`
straight into a preallocated batch buffer and takes the rest from :meth:`~HiddenMultiLayerDataset.targets`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from cache.episodes import EpisodeFile
from cache.hidden import (CacheFileInfo, CacheFormat, cache_file, check_matches, file_positions, inspect_file,
                          read_hidden, selection_ranges)
from ground.errors import UserError

EEF_KEY = "robot0_eef_pos"


@dataclass(frozen=True)
class _EpisodeCache:
    demo: str
    steps: int
    info: CacheFileInfo
    positions: tuple[int, ...] = ()
    """File positions of the dataset's layer indices (a routed-only copy remaps them)."""


class _CacheIndex:
    """Pairs every demo of a split with its validated cache file and enumerates sample windows."""

    def __init__(self, episodes: str | Path, cache_root: str | Path, split: str, frame_window: int,
                 cache_format: CacheFormat, expected: dict[str, Any], action_dim: int | None):
        self.episodes = EpisodeFile(episodes)
        self.frame_window = frame_window
        self._recorded_cache: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
        try:
            demos = self.episodes.demos(split)
            if not demos:
                raise UserError(f"split {split!r} lists no demos", file=str(self.episodes.path),
                                field=f"mask/{split}", hint="pick a split with demos")
            self.entries: list[_EpisodeCache] = []
            for demo in demos:
                path = cache_file(cache_root, demo, cache_format)
                if not path.exists():
                    raise UserError(f"episode {demo} has no cache file", file=str(path), field="data.cache_root",
                                    hint="build it: `idmctl cache build-hidden EXP`")
                info = inspect_file(path)
                check_matches(info, **expected)
                if frame_window > info.frames:
                    raise UserError(f"frame_window {frame_window} is more than the {info.frames} cached frames",
                                    file=str(path), field="data.frame_window", hint="shrink the window")
                self.entries.append(_EpisodeCache(demo, self.episodes.num_samples(demo), info))
            if action_dim is not None:
                got = self.episodes.actions(demos[0], 0, 1).shape[1]
                if got != action_dim:
                    raise UserError(f"actions are {got}-D but the spec says {action_dim}",
                                    file=str(self.episodes.path), field="data.action_dim",
                                    hint=f"set data.action_dim: {got}")
        finally:
            self.episodes.close()  # never carry an open HDF5 handle into forked workers
        self.windows = [(e, start) for e in self.entries for start in range(e.info.frames - frame_window + 1)]

    def check_layer_indices(self, indices: list[int], cached_layers: list[int] | None = None) -> None:
        """Validate ``indices`` against each file and record where they lie in it."""
        for number, entry in enumerate(self.entries):
            cached = cached_layers if cached_layers is not None else entry.info.layers
            for index in indices:
                if not 0 <= index < len(cached):
                    raise UserError(f"selected layer index {index} is outside the {len(cached)} cached layers "
                                    f"{cached}", file=str(entry.info.path), field="data.selected_layer_indices",
                                    hint=f"use indices 0..{len(cached) - 1}")
            self.entries[number] = _EpisodeCache(entry.demo, entry.steps, entry.info,
                                                 tuple(file_positions(entry.info, cached_layers, indices)))
        self.windows = [(e, start) for e in self.entries for start in range(e.info.frames - self.frame_window + 1)]

    def _recorded(self, demo: str) -> tuple[np.ndarray, np.ndarray]:
        """A demo's actions and eef positions, read from the HDF5 once per process and kept: a few KB a
        demo, and the batch loader's reader thread then slices arrays instead of calling into h5py (which
        holds the GIL the training step needs) for every sample."""
        key = (os.getpid(), demo)
        if key not in self._recorded_cache:
            self._recorded_cache[key] = (self.episodes.actions(demo).astype(np.float32),
                                         self.episodes.obs(demo, EEF_KEY).astype(np.float32))
        return self._recorded_cache[key]

    def targets(self, entry: _EpisodeCache, start: int, horizon: int) -> dict[str, torch.Tensor]:
        t0 = min(start * entry.info.frame_stride, entry.steps - 1)
        stop = min(t0 + horizon, entry.steps)
        all_actions, all_eef = self._recorded(entry.demo)
        recorded = all_actions[t0:stop]
        actions = np.zeros((horizon, recorded.shape[1]), dtype=np.float32)
        actions[: len(recorded)] = recorded
        mask = np.zeros(horizon, dtype=bool)
        mask[: len(recorded)] = True
        eef = all_eef[t0:min(t0 + horizon + 1, entry.steps)]
        eef = np.concatenate([eef, np.repeat(eef[-1:], horizon + 1 - len(eef), axis=0)])
        return {"actions": torch.from_numpy(actions), "action_mask": torch.from_numpy(mask),
                "eef_pos": torch.from_numpy(eef)}


class _WindowSamples(Dataset):
    """What both datasets share: a sample is a window of one demo's cache file; its ``hidden`` is the
    exact byte ranges of the chosen layers (:meth:`hidden_ranges`), the rest comes from the episodes."""

    index: _CacheIndex
    frame_window: int
    action_horizon: int

    def __len__(self) -> int:
        return len(self.index.windows)

    def hidden_shape(self) -> tuple[tuple[int, ...], torch.dtype]:
        """One sample's ``hidden`` shape and dtype (the cache's: every file was checked against the spec)."""
        info, positions = self.index.entries[0].info, self.index.entries[0].positions
        return (len(positions), self.frame_window, info.height, info.width, info.channels), info.torch_dtype

    def hidden_ranges(self, item: int) -> tuple[CacheFileInfo, list[tuple[int, int, str]]]:
        """The file and the exact byte ranges of sample ``item``'s ``hidden``, in its memory order."""
        entry, start = self.index.windows[item]
        return entry.info, selection_ranges(entry.info, list(entry.positions), start, self.frame_window)

    def targets(self, item: int) -> dict[str, Any]:
        """Everything of sample ``item`` but ``hidden`` (small: actions, mask, eef, demo, start)."""
        entry, start = self.index.windows[item]
        return {**self.index.targets(entry, start, self.action_horizon), "demo": entry.demo, "start": start}


class HiddenMultiLayerDataset(_WindowSamples):
    """N routed Cosmos layers per sample, read as N exact byte ranges (card A's N=4 sparse routing)."""

    def __init__(self, episodes: str | Path, cache_root: str | Path, split: str, selected_layer_indices: list[int],
                 frame_window: int, action_horizon: int, *, cache_format: CacheFormat = "safetensors",
                 mmap: bool = True, expected_layers: list[int] | None = None, frames: int | None = None,
                 token_grid: tuple[int, int] | None = None, channels: int | None = None,
                 dtype: str | None = None, action_dim: int | None = None):
        routed = [expected_layers[i] for i in selected_layer_indices
                  if 0 <= i < len(expected_layers)] if expected_layers else None
        expected = {"layers": expected_layers, "frames": frames, "token_grid": token_grid, "channels": channels,
                    "dtype": dtype, "routed": routed}
        self.index = _CacheIndex(episodes, cache_root, split, frame_window, cache_format, expected, action_dim)
        self.index.check_layer_indices(selected_layer_indices, expected_layers)
        self.selected_layer_indices = list(selected_layer_indices)
        self.frame_window = frame_window
        self.action_horizon = action_horizon
        self.mmap = mmap

    def __getitem__(self, item: int) -> dict[str, Any]:
        entry, start = self.index.windows[item]
        hidden = read_hidden(entry.info.path, list(entry.positions), start, self.frame_window,
                             mmap=self.mmap, info=entry.info)
        return {"hidden": hidden, **self.targets(item)}


class HiddenSingleLayerDataset(_WindowSamples):
    """Latent-A style: ONE cached layer (``layer_index``, default the deepest), ``hidden`` (T_w, H, W, C).

    Deliberately not a drop-in for :class:`HiddenMultiLayerDataset` (no ``selected_layer_indices``):
    a spec that names it with a routed model fails at construction, as card A's job 6321 did.
    """

    def __init__(self, episodes: str | Path, cache_root: str | Path, split: str, frame_window: int,
                 action_horizon: int, layer_index: int | None = None, *, cache_format: CacheFormat = "safetensors",
                 mmap: bool = True, expected_layers: list[int] | None = None, frames: int | None = None,
                 token_grid: tuple[int, int] | None = None, channels: int | None = None,
                 dtype: str | None = None, action_dim: int | None = None):
        expected = {"layers": expected_layers, "frames": frames, "token_grid": token_grid, "channels": channels,
                    "dtype": dtype}
        self.index = _CacheIndex(episodes, cache_root, split, frame_window, cache_format, expected, action_dim)
        if layer_index is None:  # Latent-A v1 read the deepest cached layer ("L27 sliced")
            layer_index = len(self.index.entries[0].info.layers) - 1
        self.index.check_layer_indices([layer_index], expected_layers)
        self.layer_index = layer_index
        self.frame_window = frame_window
        self.action_horizon = action_horizon
        self.mmap = mmap

    def __getitem__(self, item: int) -> dict[str, Any]:
        entry, start = self.index.windows[item]
        hidden = read_hidden(entry.info.path, list(entry.positions), start, self.frame_window, mmap=self.mmap,
                             info=entry.info)
        return {"hidden": hidden[0], **self.targets(item)}

    def hidden_shape(self) -> tuple[tuple[int, ...], torch.dtype]:
        shape, dtype = super().hidden_shape()
        return shape[1:], dtype  # one layer, no layer axis

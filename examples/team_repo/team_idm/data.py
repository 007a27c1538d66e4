"""Datasets over the multi-layer Cosmos hidden-state cache (the team's own reader).

Episodes: a robomimic HDF5 (``data/<demo>/actions``, ``mask/<split>`` lists of demo names).
Hidden states: one safetensors file per demo, ``<cache_root>/<demo>.safetensors``, one tensor
``layer_<block>`` of shape (T, H, W, C) per cached block; its metadata (JSON strings) lists
``layers`` and ``frame_stride`` (cache frame f shows timestep f * frame_stride).

A sample is a window of ``frame_window`` cache frames and the ``action_horizon`` actions that follow
the window's first frame.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import torch
from safetensors import safe_open
from torch.utils.data import Dataset


def _path(text: str) -> str:
    # Specs name data under shared roots with $VARS (cluster-specific mounts).
    return os.path.expanduser(os.path.expandvars(str(text)))


def _read_actions(episodes: str, split: str) -> dict[str, np.ndarray]:
    with h5py.File(_path(episodes), "r") as handle:
        names = [raw.decode() for raw in handle["mask"][split][()]]
        return {name: handle["data"][name]["actions"][()].astype(np.float32) for name in names}


def _cache_meta(cache_root: str, demo: str) -> tuple[str, dict]:
    path = os.path.join(_path(cache_root), f"{demo}.safetensors")
    with safe_open(path, framework="pt") as handle:
        meta = {key: json.loads(value) for key, value in handle.metadata().items()}
    return path, meta


def _action_chunk(actions: np.ndarray, start: int, horizon: int) -> torch.Tensor:
    # Past the episode's end the last action repeats (the robot holds still).
    index = np.minimum(np.arange(start, start + horizon), len(actions) - 1)
    return torch.from_numpy(actions[index])


class RobocasaLatentIDMDatasetHiddenRaw(Dataset):
    """Selected cached layers concatenated on channels: one (T_w, H, W, N*C) stream per sample."""

    def __init__(self, episodes: str, cache_root: str, split: str = "train", frame_window: int = 2,
                 action_horizon: int = 4, selected_layer_indices: list[int] | None = None):
        self.cache_root = cache_root
        self.frame_window = frame_window
        self.action_horizon = action_horizon
        self.selected_layer_indices = selected_layer_indices
        self.actions = _read_actions(episodes, split)
        self.samples: list[tuple[str, int]] = []
        self.files: dict[str, tuple[str, dict]] = {}
        for demo in self.actions:
            self.files[demo] = _cache_meta(cache_root, demo)
            frames = int(self.files[demo][1]["frames"])
            self.samples += [(demo, start) for start in range(frames - frame_window + 1)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        demo, start = self.samples[index]
        path, meta = self.files[demo]
        layers = meta["layers"]
        picked = [layers[i] for i in self.selected_layer_indices] if self.selected_layer_indices else layers
        with safe_open(path, framework="pt") as handle:
            hidden = [handle.get_slice(f"layer_{block}")[start:start + self.frame_window] for block in picked]
        t0 = start * int(meta.get("frame_stride", 1))
        return {"hidden": torch.cat(hidden, dim=-1).float(),
                "actions": _action_chunk(self.actions[demo], t0, self.action_horizon)}


class RobocasaLatentIDMDatasetHiddenMultiLayer(Dataset):
    """Cached layers kept apart: (N, T_w, H, W, C) per sample, one slice per routed DiT block."""

    def __init__(self, episodes: str, cache_root: str, split: str = "train", frame_window: int = 2,
                 action_horizon: int = 4, mmap: bool = False):
        self.cache_root = cache_root
        self.frame_window = frame_window
        self.action_horizon = action_horizon
        self.mmap = mmap
        self.actions = _read_actions(episodes, split)
        self.samples: list[tuple[str, int]] = []
        self.files: dict[str, tuple[str, dict]] = {}
        for demo in self.actions:
            self.files[demo] = _cache_meta(cache_root, demo)
            frames = int(self.files[demo][1]["frames"])
            self.samples += [(demo, start) for start in range(frames - frame_window + 1)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        demo, start = self.samples[index]
        path, meta = self.files[demo]
        picked = meta["layers"]
        window = slice(start, start + self.frame_window)
        with safe_open(path, framework="pt") as handle:
            if self.mmap:  # only the window's bytes of each layer
                hidden = [handle.get_slice(f"layer_{block}")[window] for block in picked]
            else:  # every layer whole, then sliced: all of the file is read
                hidden = [handle.get_tensor(f"layer_{block}")[window] for block in picked]
        t0 = start * int(meta.get("frame_stride", 1))
        return {"hidden": torch.stack(hidden).float(),
                "actions": _action_chunk(self.actions[demo], t0, self.action_horizon)}

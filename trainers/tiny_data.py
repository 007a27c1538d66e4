"""A tiny, learnable routed-IDM data set written with the cache's real writers (tests, benches).

Fake only in content, not in format: a real robomimic HDF5 (``cache.episodes.write_episodes``) and
real safetensors hidden caches (``cache.hidden.write_hidden``). Each demo follows a smooth random
action path; the end effector integrates it (``eef[t+1] = eef[t] + EEF_GAIN_M · a[t, :3]``); every
cached "Cosmos layer" at frame f is a fixed random projection of the actions that follow timestep
f·stride — so, like a video world model's features, the hidden states show the motion to come and
an IDM can learn it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

EEF_GAIN_M = 0.02
"""Metres of end-effector motion per unit of action (robosuite's OSC moves a fraction of ±5 cm)."""


def write_tiny_routed_data(root: Path, *, demos: int = 8, valid: int = 2, steps: int = 12, frames: int = 6,
                           frame_stride: int = 2, layers: int = 4, grid: tuple[int, int] = (2, 2),
                           channels: int = 16, action_dim: int = 7, seed: int = 0) -> dict[str, object]:
    """Write ``root/episodes.hdf5`` and ``root/hidden/<demo>.safetensors``; returns the data section."""
    from cache.episodes import Demo, write_episodes
    from cache.hidden import cache_file, write_hidden

    rng = np.random.default_rng(seed)
    lookahead = 4
    projection = rng.normal(size=(layers, grid[0] * grid[1], lookahead * action_dim, channels)) / np.sqrt(
        lookahead * action_dim)
    written = []
    for index in range(demos):
        name = f"demo_{index}"
        phase, speed = rng.uniform(0, 2 * np.pi, size=action_dim), rng.uniform(0.2, 0.6, size=action_dim)
        t = np.arange(steps)[:, None]
        actions = np.sin(speed * t + phase).astype(np.float32)
        eef = np.zeros((steps, 3), dtype=np.float32)
        eef[0] = rng.uniform(-0.1, 0.1, size=3)
        for step in range(1, steps):
            eef[step] = eef[step - 1] + EEF_GAIN_M * actions[step - 1, :3]
        padded = np.concatenate([actions, np.repeat(actions[-1:], lookahead, axis=0)])
        hidden = np.zeros((layers, frames, grid[0], grid[1], channels), dtype=np.float32)
        for frame in range(frames):
            t0 = min(frame * frame_stride, steps - 1)
            future = padded[t0:t0 + lookahead].reshape(-1)
            tokens = np.tanh(np.einsum("k,lgkc->lgc", future, projection))
            hidden[:, frame] = tokens.reshape(layers, grid[0], grid[1], channels)
        episodes_demo = Demo(name, actions, np.zeros((steps, 2)), obs={"robot0_eef_pos": eef})
        written.append(episodes_demo)
        write_hidden(cache_file(root / "hidden", name, "safetensors"), torch.from_numpy(hidden),
                     list(range(layers)), {"demo": name, "frame_stride": frame_stride, "encoder": "tiny_data"})
    names = [d.name for d in written]
    write_episodes(root / "episodes.hdf5", written, env_args={"env_name": "tiny"},
                   splits={"train": names[: demos - valid], "valid": names[demos - valid:]})
    return {"episodes": str(root / "episodes.hdf5"), "cache_root": str(root / "hidden"),
            "cache_format": "safetensors", "cached_layers": list(range(layers)), "frames": frames,
            "token_grid": list(grid), "channels": channels, "dtype": "float32", "action_dim": action_dim}


def tiny_spec(data_section: dict[str, object], /, **overrides: dict[str, object]) -> dict[str, dict[str, object]]:
    """A runnable spec (as a dict) over ``data_section``; ``overrides`` merge into each named section."""
    spec: dict[str, dict[str, object]] = {
        "data": {**data_section, "selected_layer_indices": [0, 2], "frame_window": 2, "action_horizon": 4},
        "model": {"depth": 2, "hidden_dim": 16, "num_heads": 2, "kv_dim": 16, "mlp_ratio": 2.0,
                  "timestep_dim": 16, "inference_steps": 4},
        "loader": {"batch_size": 2, "num_workers": 0},
        "train": {"steps": 8, "lr": 3.0e-3, "effective_batch": 4, "checkpoint_every": 4, "log_every": 2},
        "resources": {"gpus_per_node": 0, "cpu_ranks": 1, "cpus": 1, "mem": "2GB", "qos": "core-own",
                      "time_limit": "0:10:00"},
        "eval": {"metric": "eef_mm_2ep", "episodes": [2]},
    }
    for section, values in overrides.items():
        spec[section] = {**spec.get(section, {}), **values}
    return spec


@dataclass(frozen=True)
class TinyCache:
    """A written tiny data set and a spec over it; ``spec_file`` writes variants (other steps, ranks...)."""

    root: Path
    data: dict[str, object]
    spec_path: Path

    @classmethod
    def create(cls, root: Path) -> "TinyCache":
        data = write_tiny_routed_data(root / "data")
        spec_path = root / "tiny_routed.yaml"
        spec_path.write_text(yaml.safe_dump(tiny_spec(data), sort_keys=False))
        return cls(root, data, spec_path)

    def spec_file(self, directory: Path, name: str = "tiny_routed", **overrides: dict[str, object]) -> Path:
        path = Path(directory) / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(tiny_spec(self.data, **overrides), sort_keys=False))
        return path

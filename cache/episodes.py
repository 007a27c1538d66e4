"""Robomimic / RoboCasa episode files (HDF5): a writer, plain readers, and a lazy per-process handle.

Layout (the one robomimic and RoboCasa ship)::

    data/                      attrs: env_args (JSON str), total (sum of num_samples)
      demo_0/                  attrs: num_samples, model_file (robosuite XML, optional)
        actions   (T, A) float32   RoboCasa A=12: eef_pos 0:3, eef_rot 3:6, gripper 6, base 7:11, mode 11
        states    (T, S) float64   flattened MuJoCo state, for exact replay
        obs/<key> (T, ...)         e.g. robot0_eef_pos (T, 3), robot0_agentview_left_image (T, H, W, 3) uint8
    mask/<split>               byte strings naming demos, e.g. b"demo_0"

Demos are always listed in numeric order (demo_10 follows demo_9, not demo_1).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ground.errors import UserError
from ground.paths import sweep_dead_temp_files, temp_path

ALL_SPLIT = "all"
"""Split name meaning every demo in ``data/``."""
_DEMO_NUMBER = re.compile(r"(\d+)$")


@dataclass
class Demo:
    """One episode: T timesteps of actions, simulator states and observations."""

    name: str
    actions: np.ndarray
    """(T, A) float32."""
    states: np.ndarray
    """(T, S) float64 flattened simulator states."""
    obs: dict[str, np.ndarray] = field(default_factory=dict)
    """Observation key → (T, ...) array."""
    model_file: str | None = None
    """robosuite model XML, needed to rebuild the scene for exact replay."""

    @property
    def num_samples(self) -> int:
        return int(self.actions.shape[0])


def demo_sort_key(name: str) -> tuple[int, str]:
    """``demo_10`` after ``demo_9``: sort by the trailing number, then by name."""
    match = _DEMO_NUMBER.search(name)
    return (int(match.group(1)) if match else -1, name)


def sorted_demos(names: list[str]) -> list[str]:
    return sorted(names, key=demo_sort_key)


def _validate_demo(demo: Demo, path: Path) -> None:
    steps = demo.num_samples
    if demo.actions.ndim != 2:
        raise UserError(f"actions must be (T, A), got shape {demo.actions.shape}", file=str(path),
                        field=f"data/{demo.name}/actions", hint="pass a 2-D array")
    if demo.states.shape[0] != steps:
        raise UserError(f"states has {demo.states.shape[0]} steps but actions has {steps}", file=str(path),
                        field=f"data/{demo.name}/states", hint="record one state per action")
    for key, value in demo.obs.items():
        if value.shape[0] != steps:
            raise UserError(f"obs has {value.shape[0]} steps but actions has {steps}", file=str(path),
                            field=f"data/{demo.name}/obs/{key}", hint="record one observation per action")


def write_episodes(path: str | Path, demos: list[Demo], env_args: dict[str, Any],
                   splits: dict[str, list[str]]) -> None:
    """Write ``demos`` in the robomimic layout, atomically (temp file in the same folder + rename)."""
    path = Path(path)
    names = [demo.name for demo in demos]
    if len(set(names)) != len(names):
        raise UserError("two demos share a name", file=str(path), field="data", hint="name demos demo_0, demo_1, ...")
    for split, members in splits.items():
        unknown = sorted(set(members) - set(names))
        if unknown:
            raise UserError(f"split names unknown demos {unknown[:3]}", file=str(path), field=f"mask/{split}",
                            hint="list only demos that are written")
    for demo in demos:
        _validate_demo(demo, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead_temp_files(path.parent, of=path.name)  # what a killed earlier `data demos` left
    tmp = temp_path(path)
    try:
        with h5py.File(tmp, "w") as handle:
            data = handle.create_group("data")
            data.attrs["env_args"] = json.dumps(env_args)
            data.attrs["total"] = int(sum(demo.num_samples for demo in demos))
            for demo in sorted(demos, key=lambda d: demo_sort_key(d.name)):
                group = data.create_group(demo.name)
                group.attrs["num_samples"] = demo.num_samples
                if demo.model_file is not None:
                    group.attrs["model_file"] = demo.model_file
                group.create_dataset("actions", data=np.asarray(demo.actions, dtype=np.float32))
                group.create_dataset("states", data=np.asarray(demo.states, dtype=np.float64))
                obs = group.create_group("obs")
                for key, value in demo.obs.items():
                    # Images dominate file size; gzip them as robomimic's converters do.
                    compression = "gzip" if value.dtype == np.uint8 and value.ndim >= 3 else None
                    obs.create_dataset(key, data=value, compression=compression)
            mask = handle.create_group("mask")
            for split, members in splits.items():
                mask.create_dataset(split, data=np.array([m.encode() for m in sorted_demos(members)], dtype="S"))
            handle.flush()
        with open(tmp, "rb") as raw:
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _open(path: Path) -> h5py.File:
    if not path.exists():
        raise UserError("episode file does not exist", file=str(path), field="data.episodes",
                        hint="write demos first (idmctl quickstart) or fix the path")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise UserError(f"not a readable HDF5 file ({exc})", file=str(path), field="data.episodes",
                        hint="regenerate the episode file") from exc


def _list_demos(handle: h5py.File, path: Path, split: str) -> list[str]:
    if "data" not in handle:
        raise UserError("no data/ group: not a robomimic episode file", file=str(path), field="data",
                        hint="write it with cache.episodes.write_episodes")
    if split == ALL_SPLIT:
        return _with_actions(handle, path, sorted_demos(list(handle["data"].keys())))
    mask = handle.get("mask")
    if mask is None or split not in mask:
        available = sorted(mask.keys()) if mask is not None else []
        raise UserError(f"no split {split!r}", file=str(path), field=f"mask/{split}",
                        hint=f"available splits: {', '.join([ALL_SPLIT, *available])}")
    names = [raw.decode() if isinstance(raw, bytes) else str(raw) for raw in mask[split][()]]
    return _with_actions(handle, path, sorted_demos(names))


def _with_actions(handle: h5py.File, path: Path, names: list[str]) -> list[str]:
    """``names``, each checked to be a demo with an ``actions`` dataset: an episode file whose demos had
    none passed preflight and failed the run at its first sample (a group-membership test per demo)."""
    for name in names:
        group = handle["data"].get(name)
        if not isinstance(group, h5py.Group):
            raise UserError(f"the split lists demo {name!r}, which is not a group under data/", file=str(path),
                            field=f"data/{name}", hint="regenerate the episode file or fix its mask")
        if not isinstance(group.get("actions"), h5py.Dataset):
            raise UserError(f"demo {name!r} has no actions dataset", file=str(path), field=f"data/{name}/actions",
                            hint="a robomimic demo holds data/<demo>/actions (T, action_dim); regenerate the file")
    return names


def _read_demo(handle: h5py.File, path: Path, name: str) -> Demo:
    group = handle.get(f"data/{name}")
    if group is None:
        raise UserError(f"no demo {name!r}", file=str(path), field=f"data/{name}", hint="see list_demos(path, 'all')")
    obs = {key: group["obs"][key][()] for key in group["obs"]} if "obs" in group else {}
    model_file = group.attrs.get("model_file")
    return Demo(name=name, actions=group["actions"][()], states=group["states"][()], obs=obs,
                model_file=str(model_file) if model_file is not None else None)


def list_demos(path: str | Path, split: str) -> list[str]:
    """Demo names of ``mask/<split>`` (``"all"``: every demo), in numeric order."""
    path = Path(path)
    with _open(path) as handle:
        return _list_demos(handle, path, split)


def read_demo(path: str | Path, name: str) -> Demo:
    """One whole demo, loaded into memory."""
    path = Path(path)
    with _open(path) as handle:
        return _read_demo(handle, path, name)


def read_env_args(path: str | Path) -> dict[str, Any]:
    """``data.attrs["env_args"]`` parsed from JSON (robosuite env name, kwargs)."""
    path = Path(path)
    with _open(path) as handle:
        return json.loads(handle["data"].attrs.get("env_args", "{}"))


class EpisodeFile:
    """A lazy, fork-safe handle: h5py opens the file on first access inside the process using it.

    The handle is never pickled (DataLoader workers each open their own) and is reopened if the
    object finds itself in a different process from the one that opened it.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._handle: h5py.File | None = None
        self._pid: int | None = None
        self._obs_datasets: dict[tuple[str, str], h5py.Dataset] = {}
        """(demo, key) → its dataset in the open handle: a cache builder reads the same few arrays
        thousands of times, and each lookup through the groups costs more than a small read."""

    @property
    def handle(self) -> h5py.File:
        if self._handle is None or self._pid != os.getpid():
            self._handle = _open(self.path)
            self._pid = os.getpid()
            self._obs_datasets = {}
        return self._handle

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_handle": None, "_pid": None, "_obs_datasets": {}}

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle, self._pid, self._obs_datasets = None, None, {}

    def demos(self, split: str) -> list[str]:
        return _list_demos(self.handle, self.path, split)

    def num_samples(self, name: str) -> int:
        attrs = self._group(name).attrs
        if "num_samples" not in attrs:
            raise UserError("demo has no num_samples attribute", file=str(self.path), field=f"data/{name}",
                            hint="robomimic files set data/<demo>.attrs['num_samples'] = len(actions)")
        return int(attrs["num_samples"])

    def actions(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._group(name)["actions"][start:stop]

    def obs(self, name: str, key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        self.handle  # noqa: B018 -- (re)opens in this process, which also empties the dataset cache
        dataset = self._obs_datasets.get((name, key))
        if dataset is None:
            group = self._group(name)
            if "obs" not in group or key not in group["obs"]:
                raise UserError(f"demo has no observation {key!r}", file=str(self.path),
                                field=f"data/{name}/obs/{key}", hint="record it when writing the demos")
            dataset = self._obs_datasets[(name, key)] = group["obs"][key]
        return dataset[start:stop]

    def read_demo(self, name: str) -> Demo:
        return _read_demo(self.handle, self.path, name)

    @property
    def env_args(self) -> dict[str, Any]:
        return json.loads(self.handle["data"].attrs.get("env_args", "{}"))

    def _group(self, name: str) -> h5py.Group:
        group = self.handle.get(f"data/{name}")
        if group is None:
            raise UserError(f"no demo {name!r}", file=str(self.path), field=f"data/{name}",
                            hint="see list_demos(path, 'all')")
        return group

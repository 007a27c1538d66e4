"""Robomimic episode files: written in the real HDF5 layout, read back, lazily opened per process."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from cache.episodes import Demo, EpisodeFile, list_demos, read_demo, read_env_args, write_episodes
from ground.errors import UserError


def _demo(index: int, steps: int, rng: np.random.Generator) -> Demo:
    return Demo(
        name=f"demo_{index}",
        actions=rng.standard_normal((steps, 12)).astype(np.float32),
        states=rng.standard_normal((steps, 9)),
        obs={
            "robot0_eef_pos": rng.standard_normal((steps, 3)),
            "robot0_agentview_left_image": rng.integers(0, 255, (steps, 8, 8, 3), dtype=np.uint8),
        },
        model_file=f"<mujoco model='demo{index}'/>",
    )


@pytest.fixture
def episode_file(tmp_path: Path) -> tuple[Path, list[Demo]]:
    rng = np.random.default_rng(0)
    demos = [_demo(i, 5 + i, rng) for i in (0, 1, 2, 9, 10, 11)]
    path = tmp_path / "demos.hdf5"
    splits = {"train": ["demo_10", "demo_0", "demo_9", "demo_2"], "valid": ["demo_1", "demo_11"]}
    write_episodes(path, demos, {"env_name": "Lift", "env_kwargs": {"robots": ["Panda"]}}, splits)
    return path, demos


def test_layout_matches_robomimic(episode_file: tuple[Path, list[Demo]]) -> None:
    path, demos = episode_file
    with h5py.File(path, "r") as handle:
        assert json.loads(handle["data"].attrs["env_args"])["env_name"] == "Lift"
        assert handle["data"].attrs["total"] == sum(d.num_samples for d in demos)
        assert handle["data/demo_10"].attrs["num_samples"] == 15
        assert handle["data/demo_10/actions"].dtype == np.float32
        assert handle["data/demo_10/states"].dtype == np.float64
        assert handle["data/demo_10/obs/robot0_agentview_left_image"].dtype == np.uint8
        assert list(handle["mask/valid"][()]) == [b"demo_1", b"demo_11"]


def test_demos_sorted_numerically(episode_file: tuple[Path, list[Demo]]) -> None:
    path, _ = episode_file
    assert list_demos(path, "all") == ["demo_0", "demo_1", "demo_2", "demo_9", "demo_10", "demo_11"]
    assert list_demos(path, "train") == ["demo_0", "demo_2", "demo_9", "demo_10"]


def test_round_trip(episode_file: tuple[Path, list[Demo]]) -> None:
    path, demos = episode_file
    for original in demos:
        loaded = read_demo(path, original.name)
        np.testing.assert_array_equal(loaded.actions, original.actions)
        np.testing.assert_array_equal(loaded.states, original.states)
        assert set(loaded.obs) == set(original.obs)
        for key in original.obs:
            np.testing.assert_array_equal(loaded.obs[key], original.obs[key])
        assert loaded.model_file == original.model_file
    assert read_env_args(path)["env_kwargs"] == {"robots": ["Panda"]}


def test_unknown_split_and_demo_are_user_errors(episode_file: tuple[Path, list[Demo]], tmp_path: Path) -> None:
    path, _ = episode_file
    with pytest.raises(UserError) as exc:
        list_demos(path, "test")
    assert exc.value.line() == f"error: {path}:mask/test: no split 'test' (available splits: all, train, valid)"
    with pytest.raises(UserError, match="no demo 'demo_7'"):
        read_demo(path, "demo_7")
    with pytest.raises(UserError, match="episode file does not exist"):
        list_demos(tmp_path / "missing.hdf5", "all")
    garbage = tmp_path / "garbage.hdf5"
    garbage.write_bytes(b"not hdf5" * 100)
    with pytest.raises(UserError, match="not a readable HDF5 file"):
        list_demos(garbage, "all")


def test_bad_demo_is_rejected_and_nothing_written(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    demo = _demo(0, 6, rng)
    demo.states = demo.states[:4]
    target = tmp_path / "bad.hdf5"
    with pytest.raises(UserError, match="states has 4 steps but actions has 6"):
        write_episodes(target, [demo], {}, {"train": ["demo_0"]})
    assert list(tmp_path.iterdir()) == []


def test_lazy_handle_pickles_closed(episode_file: tuple[Path, list[Demo]]) -> None:
    path, demos = episode_file
    handle = EpisodeFile(path)
    assert handle._handle is None  # nothing opened at construction
    assert handle.num_samples("demo_9") == 14
    assert handle._handle is not None
    clone = pickle.loads(pickle.dumps(handle))
    assert clone._handle is None
    np.testing.assert_array_equal(clone.actions("demo_9", 2, 5), demos[3].actions[2:5])
    handle.close()
    clone.close()


class _FirstActions(Dataset):
    def __init__(self, path: Path):
        self.file = EpisodeFile(path)
        self.names = self.file.demos("all")  # leaves the parent's handle open on purpose

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.file.actions(self.names[index], 0, 1)[0])


def test_workers_open_their_own_handle(episode_file: tuple[Path, list[Demo]]) -> None:
    path, demos = episode_file
    dataset = _FirstActions(path)
    serial = torch.cat(list(DataLoader(dataset, batch_size=2, num_workers=0)))
    # Forked workers inherit the parent's open h5py handle; they must notice and open their own.
    assert dataset.file._handle is not None
    forked = torch.cat(list(DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context="fork")))
    expected = torch.stack([torch.from_numpy(d.actions[0]) for d in sorted(demos, key=lambda d: int(d.name[5:]))])
    torch.testing.assert_close(serial, expected)
    torch.testing.assert_close(forked, expected)

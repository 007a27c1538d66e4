"""Exact replay in robosuite and the simulator EEF metric (``sim_eef_mm_<n>ep``).

Replay rebuilds the sim from the demo's own MJCF (``reset_from_xml_string``), restores the first
flattened state, refreshes the observation cache, then executes actions. With the demo's recorded
actions the EEF track matches the recording to 0.000 mm; the error of a model's actions is the
simulator's verdict on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ground.errors import UserError
from trainers.sim.env import make_env, settle_controllers

EEF_KEY = "robot0_eef_pos"
ActionPredictor = Callable[[str], np.ndarray]
"""demo name → the model's actions for that episode, shape (T, action_dim)."""


@dataclass(frozen=True)
class ReplayResult:
    """One episode replayed: the EEF track it produced and its mean distance to the recorded one."""

    demo: str
    eef_mm: float
    steps: int
    seconds: float


class Replayer:
    """A camera-less env (replay needs no pixels: ~10× faster) that replays demos of one env kind."""

    def __init__(self, env_name: str) -> None:
        self.env_name = env_name
        self.env = make_env(env_name)

    def eef_track(self, model_file: str, initial_state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """EEF positions (T, 3) before each of the T actions, starting from ``initial_state``."""
        env = self.env
        env.reset()
        env.reset_from_xml_string(model_file)
        env.sim.reset()
        env.sim.set_state_from_flattened(initial_state)
        settle_controllers(env)
        obs = env._get_observations(force_update=True)
        track = [np.array(obs[EEF_KEY])]
        for action in actions[:-1]:
            obs, _, _, _ = env.step(np.asarray(action, dtype=np.float64))
            track.append(np.array(obs[EEF_KEY]))
        return np.stack(track)

    def close(self) -> None:
        self.env.close()


def eef_error_mm(track: np.ndarray, recorded: np.ndarray) -> float:
    """Mean Euclidean distance between two EEF tracks, in mm (steps 1.. only: step 0 is the shared start)."""
    steps = min(len(track), len(recorded))
    if steps < 2:
        raise ValueError("an EEF track needs at least 2 steps to compare")
    return float(np.linalg.norm(track[1:steps] - recorded[1:steps], axis=-1).mean() * 1000.0)


@dataclass(frozen=True)
class RecordedEpisode:
    """What replay needs from one demo of the HDF5 file."""

    name: str
    model_file: str
    initial_state: np.ndarray
    actions: np.ndarray
    eef: np.ndarray


def read_episodes(path: Path, names: Sequence[str]) -> tuple[str, list[RecordedEpisode]]:
    """The env name (from ``env_args``) and the named demos; a demo without its MJCF cannot be replayed."""
    from cache.episodes import read_demo, read_env_args

    env_name = read_env_args(path).get("env_name")
    if not env_name:
        raise UserError("data.attrs['env_args'] names no env_name", file=str(path), field="data/env_args",
                        hint="write demos with `idmctl data demos`")
    episodes = []
    for name in names:
        demo = read_demo(path, name)
        if not demo.model_file or EEF_KEY not in demo.obs:
            raise UserError(f"demo {name} has no model_file or no obs/{EEF_KEY}: it cannot be replayed",
                            file=str(path), field=f"data/{name}", hint="write demos with `idmctl data demos`")
        episodes.append(RecordedEpisode(name, demo.model_file, np.asarray(demo.states[0], dtype=np.float64),
                                        np.asarray(demo.actions, dtype=np.float64),
                                        np.asarray(demo.obs[EEF_KEY], dtype=np.float64)))
    return env_name, episodes


def replay_episodes(
    path: Path,
    names: Sequence[str],
    predict: ActionPredictor | None = None,
    progress: Callable[[ReplayResult], None] | None = None,
    replayer: Replayer | None = None,
) -> list[ReplayResult]:
    """Replay each demo with ``predict(name)``'s actions (the recorded ones when None).

    Pass a ``replayer`` to reuse its env across calls (building one costs seconds); it is then left open.
    """
    env_name, episodes = read_episodes(path, names)
    owned = replayer is None
    replayer = replayer or Replayer(env_name)
    if replayer.env_name != env_name:
        raise UserError(f"demos are from {env_name!r} but the replayer runs {replayer.env_name!r}",
                        file=str(path), field="data/env_args")
    results = []
    try:
        for episode in episodes:
            started = time.perf_counter()
            actions = episode.actions if predict is None else np.asarray(predict(episode.name))
            if actions.shape != episode.actions.shape:
                raise ValueError(f"{episode.name}: predicted actions {actions.shape} != recorded {episode.actions.shape}")
            track = replayer.eef_track(episode.model_file, episode.initial_state, actions)
            result = ReplayResult(episode.name, eef_error_mm(track, episode.eef), len(actions),
                                  time.perf_counter() - started)
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        if owned:
            replayer.close()
    return results


def summarize(results: Sequence[ReplayResult]) -> dict[str, Any]:
    values = [r.eef_mm for r in results]
    return {"episodes": len(values), "eef_mm": float(np.mean(values)) if values else float("nan"),
            "per_episode": {r.demo: r.eef_mm for r in results}}

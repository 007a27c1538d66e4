"""Scripted Lift demos in robosuite, recorded in the robomimic layout with camera frames.

The policy is a four-phase proportional controller on the OSC pose deltas (the Panda's default
controller): hover above the cube, descend, close the gripper, lift. Every demo runs exactly
``horizon`` steps (the last phase holds the cube up), so episodes line up with the cache's frames.
Deterministic: one env seeded with ``seed`` places the cube for demo i on its i-th reset.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainers.sim.env import CAMERA, Camera, env_kwargs, make_env, settle_controllers

SUPPORTED_ENVS = ("Lift",)
HOVER_M = 0.08
"""Height above the cube at which the gripper lines up before descending."""
ALIGN_TOL_M = 0.01
"""Position error under which a phase counts as reached."""
CLOSE_STEPS = 8
"""Steps the gripper is commanded closed before lifting (the fingers take ~6 to close)."""
LIFT_M = 0.15
"""Height above the table the cube is lifted to."""
GAIN = 10.0
"""Proportional gain: metres of error → OSC input units (±1 is ±5 cm per step)."""
DEFAULT_HORIZON = 50
"""Steps per demo: the policy has the cube up by ~step 40 and holds it (50 = 1 + 7·7: 8 cache frames)."""
OBS_KEYS = ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos", "cube_pos")
"""Low-dimensional observations stored per step besides the camera frames."""


@dataclass
class RecordedDemo:
    """One episode as recorded: T actions, T flattened sim states, T observations (before each action)."""

    name: str
    actions: np.ndarray
    states: np.ndarray
    obs: dict[str, np.ndarray]
    model_file: str
    lifted: bool
    seconds: float


@dataclass
class DemoSet:
    """What ``collect_demos`` produced, ready for ``write_demos``."""

    env_name: str
    demos: list[RecordedDemo]
    env_args: dict[str, Any]
    camera_size: int
    seed: int
    splits: dict[str, list[str]] = field(default_factory=dict)


class LiftPolicy:
    """hover → descend → grasp → lift, on the gripper site's position (no orientation change)."""

    def __init__(self) -> None:
        self.phase = "hover"
        self.closed_steps = 0

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        eef, cube = obs["robot0_eef_pos"], obs["cube_pos"]
        gripper = -1.0
        if self.phase == "hover":
            target = cube + np.array([0.0, 0.0, HOVER_M])
            if np.linalg.norm(target - eef) < ALIGN_TOL_M:
                self.phase = "descend"
        if self.phase == "descend":
            target = cube.copy()
            if np.linalg.norm(target - eef) < ALIGN_TOL_M:
                self.phase = "grasp"
        if self.phase == "grasp":
            target, gripper = eef.copy(), 1.0
            self.closed_steps += 1
            if self.closed_steps >= CLOSE_STEPS:
                self.phase = "lift"
                self.lift_target = eef + np.array([0.0, 0.0, LIFT_M])
        if self.phase == "lift":
            target, gripper = self.lift_target, 1.0
        delta = np.clip(GAIN * (target - eef), -1.0, 1.0)
        return np.concatenate([delta, np.zeros(3), [gripper]])


def _record_one(env: Any, camera: Camera, name: str, horizon: int, image_key: str) -> RecordedDemo:
    started = time.perf_counter()
    env.reset()
    camera.follow(env.sim)  # a hard reset built a new model (the cube's size changes; meshes do not)
    settle_controllers(env)
    obs = env._get_observations(force_update=True)
    table_z = float(obs["cube_pos"][2])
    policy = LiftPolicy()
    model_file = env.sim.model.get_xml()
    actions, states, observations = [], [], {key: [] for key in (*OBS_KEYS, image_key)}
    for _ in range(horizon):
        states.append(np.array(env.sim.get_state().flatten()))
        for key in OBS_KEYS:
            observations[key].append(np.array(obs[key]))
        observations[image_key].append(camera.frame())
        action = policy.act(obs)
        actions.append(action)
        obs, _, _, _ = env.step(action)
    lifted = float(obs["cube_pos"][2]) > table_z + 0.04
    return RecordedDemo(
        name=name,
        actions=np.asarray(actions, dtype=np.float64),
        states=np.asarray(states, dtype=np.float64),
        obs={key: np.stack(values) for key, values in observations.items()},
        model_file=model_file,
        lifted=lifted,
        seconds=time.perf_counter() - started,
    )


def collect_demos(
    env_name: str,
    n: int,
    *,
    seed: int = 0,
    camera_size: int = 64,
    horizon: int = DEFAULT_HORIZON,
    valid: int | None = None,
    progress: Callable[[RecordedDemo, int, int], None] | None = None,
) -> DemoSet:
    """Run the scripted policy ``n`` times; the last ``valid`` demos (default n // 4, ≥ 1) are held out."""
    import torch

    torch.set_num_threads(1)
    if env_name not in SUPPORTED_ENVS:
        raise ValueError(f"env {env_name!r} has no scripted policy (supported: {', '.join(SUPPORTED_ENVS)})")
    env = make_env(env_name, seed=seed)
    image_key = f"{CAMERA}_image"
    demos = []
    camera = None
    try:
        # One camera for every demo: its render context outlives the hard resets (~1 s of CPU a demo saved).
        camera = Camera(env.sim, camera_size)
        for index in range(n):
            demo = _record_one(env, camera, f"demo_{index}", horizon, image_key)
            demos.append(demo)
            if progress is not None:
                progress(demo, index, n)
        env_args = {"env_name": env_name, "type": 1, "env_version": _robosuite_version(),
                    "env_kwargs": env_kwargs(env, camera_size)}
    finally:
        if camera is not None:
            camera.close()
        env.close()
    n_valid = default_valid(n) if valid is None else valid
    names = [d.name for d in demos]
    splits = {"train": names[: n - n_valid], "valid": names[n - n_valid:]}
    return DemoSet(env_name, demos, env_args, camera_size, seed, splits)


def default_valid(n: int) -> int:
    """Held-out demos when not given: a quarter, at least one (none when there is only one demo)."""
    return max(1, n // 4) if n > 1 else 0


def _robosuite_version() -> str:
    import robosuite

    return str(robosuite.__version__)


def write_demos(demo_set: DemoSet, path: Path) -> None:
    """Write the robomimic layout with the data plane's writer (atomic: temp file + rename)."""
    from cache.episodes import Demo, write_episodes

    demos = [Demo(d.name, d.actions, d.states, d.obs, d.model_file) for d in demo_set.demos]
    write_episodes(path, demos, env_args=demo_set.env_args, splits=demo_set.splits)


def make_demos(out: Path, env_name: str = "Lift", n: int = 8, *, seed: int = 0, camera_size: int = 64,
               horizon: int = DEFAULT_HORIZON, valid: int | None = None,
               progress: Callable[[RecordedDemo, int, int], None] | None = None) -> dict[str, Any]:
    """Collect and write ``n`` demos to ``out``; returns a summary with counts, sizes and timings."""
    started = time.perf_counter()
    demo_set = collect_demos(env_name, n, seed=seed, camera_size=camera_size, horizon=horizon, valid=valid,
                             progress=progress)
    write_demos(demo_set, out)
    return {
        "path": str(out), "env": env_name, "demos": n, "seed": seed, "steps_per_demo": horizon,
        "camera": f"{CAMERA}_image {camera_size}×{camera_size}",
        "lifted": sum(d.lifted for d in demo_set.demos),
        "splits": {k: len(v) for k, v in demo_set.splits.items()},
        "bytes": out.stat().st_size, "seconds": time.perf_counter() - started,
    }

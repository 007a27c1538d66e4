"""``sim_eef_mm_<n>ep``: the model's actions executed in robosuite from each held-out demo's start.

For every held-out demo the policy predicts one action chunk per cache window (window ``s`` sees
cache frames ``s .. s + T_w − 1`` and predicts the actions from timestep ``s × frame_stride``). The
episode's action sequence takes each window's first ``frame_stride`` actions and lets the last
window run to the end; the simulator then replays that sequence open-loop from the demo's first
recorded state (:mod:`trainers.sim.replay`) and the metric is the mean distance, in mm, between
the simulated and the recorded EEF tracks. Same :class:`~trainers.evaluate.Evaluator` interface as
the offline metric; the trainer logs both when ``eval.simulator`` is on.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from ground.errors import UserError
from ground.paths import expand_path
from ground.spec.schema import ExperimentSpec
from trainers.evaluate import ChunkPolicy, Evaluator, episodes_task
from trainers.sim.replay import Replayer, ReplayResult, replay_episodes


def tile_chunks(chunks: np.ndarray, starts: list[int], stride: int, steps: int) -> np.ndarray:
    """(W, A, a) chunks predicted at timesteps ``starts`` → (steps, a) actions, one per timestep.

    Each chunk supplies the actions up to the next window's start; the last supplies the rest.
    Raises ValueError when the chunks cannot cover every timestep (horizon too short for the stride).
    """
    horizon = chunks.shape[1]
    actions = np.full((steps, chunks.shape[2]), np.nan, dtype=np.float64)
    for index, start in enumerate(starts):
        stop = starts[index + 1] if index + 1 < len(starts) else steps
        take = min(stop - start, horizon, steps - start)
        actions[start:start + take] = chunks[index, :take]
    missing = np.flatnonzero(np.isnan(actions[:, 0]))
    if missing.size:
        raise ValueError(f"chunks of {horizon} actions every {stride} steps leave timesteps "
                         f"{missing[0]}..{missing[-1]} of {steps} without an action")
    return actions


class SimEEFEvaluator(Evaluator):
    """Replays the policy's actions in robosuite on the first n held-out demos."""

    KIND = "simulator"
    SOURCES = ("trainers.sim.replay", "trainers.sim.env")

    def __init__(self, spec: ExperimentSpec, device: torch.device):
        from cache.registry import build_dataset

        self.spec = spec
        self.episodes_path = expand_path(spec.data.episodes)
        self.dataset = build_dataset(spec, "eval")
        self.by_demo: dict[str, list[int]] = defaultdict(list)
        self.geometry: dict[str, tuple[int, int]] = {}
        for item, (entry, _) in enumerate(self.dataset.index.windows):
            self.by_demo[entry.demo].append(item)
            self.geometry[entry.demo] = (entry.info.frame_stride, entry.steps)
        for demo, (stride, steps) in self.geometry.items():
            windows = len(self.by_demo[demo])
            covered = (windows - 1) * stride + spec.data.action_horizon
            if stride > spec.data.action_horizon or covered < steps:
                raise UserError(
                    f"{demo}: {windows} windows × stride {stride} + horizon {spec.data.action_horizon} "
                    f"cover {covered} of its {steps} steps; the simulator needs an action for every step",
                    field="data.action_horizon", hint="raise action_horizon or data.frames, or set eval.simulator: false")
        self.last_results: list[ReplayResult] = []
        self._replayer: Replayer | None = None  # built on first use, reused by every later evaluation

    @property
    def demos(self) -> list[str]:
        return list(self.by_demo)

    def episode_actions(self, policy: ChunkPolicy, demo: str, generator: torch.Generator) -> np.ndarray:
        """The policy's (T, a) action sequence for one demo, from its cache windows in time order."""
        samples = sorted((self.dataset[i] for i in self.by_demo[demo]), key=lambda s: s["start"])
        batch = self.spec.loader.batch_size
        chunks = []
        for first in range(0, len(samples), batch):
            hidden = torch.stack([s["hidden"] for s in samples[first:first + batch]])
            chunks.append(policy.predict(hidden, generator).numpy())
        stride, steps = self.geometry[demo]
        return tile_chunks(np.concatenate(chunks), [s["start"] * stride for s in samples], stride, steps)

    def evaluate(self, policy: ChunkPolicy, episode_counts: list[int]) -> dict[str, float]:
        available = len(self.by_demo)
        too_many = [n for n in episode_counts if n > available]
        if too_many:
            raise UserError(f"eval asks for {max(too_many)} episodes but split {self.spec.data.eval_split!r} has "
                            f"{available}", field="eval.episodes", hint=f"use counts ≤ {available} or add held-out demos")
        generator = torch.Generator().manual_seed(policy.seed)
        demos = self.demos[: max(episode_counts)]
        predicted = {demo: self.episode_actions(policy, demo, generator) for demo in demos}
        if self._replayer is None:
            from cache.episodes import read_env_args

            self._replayer = Replayer(read_env_args(self.episodes_path)["env_name"])
        self.last_results = replay_episodes(self.episodes_path, demos, predict=predicted.__getitem__,
                                            replayer=self._replayer)
        errors = [r.eef_mm for r in self.last_results]
        return self.record(policy, demos, errors, episode_counts, episodes_task(self.episodes_path))


SimEvaluator = SimEEFEvaluator
"""The name the simulator issue uses for it."""

"""Evaluation behind one interface: an :class:`Evaluator` scores a :class:`ChunkPolicy` on held-out demos.

``offline_eef`` (here): for every sample window of the first n held-out demos, predict the action
chunk, roll its position part forward from the recorded start, and measure the distance to the
recorded ``robot0_eef_pos`` track. ``eef_mm_<n>ep`` = mean over the n demos of each demo's mean
error, in millimetres. Rolling forward uses one gain per axis (metres per action unit) fitted by
least squares on the training demos' recorded (action, Δeef) pairs, because the OSC controller
moves the arm by a fraction of the commanded delta. The robosuite replay evaluator (``sim_eef``)
plugs in behind the same interface.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ground.errors import UserError
from ground.paths import expand_path
from ground.spec.schema import ExperimentSpec
from ground.protocols import Protocol, protocol_name
from ground.tracking import eef_metric

EVALUATORS: dict[str, str] = {
    "offline_eef": "trainers.evaluate:OfflineEEFEvaluator",
    "sim_eef": "trainers.sim.evaluate:SimEEFEvaluator",
}
"""Name → ``module:Class``; every class takes ``(spec, device)``."""
GAIN_FIT_DEMOS = 64
"""Training demos read to fit the action → EEF gain (actions and EEF only, no hidden states)."""


class ChunkPolicy:
    """The model as evaluators see it: hidden states (B, N, T_w, H, W, C) → action chunks (B, A, a)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, seed: int = 0):
        self.model, self.device, self.seed = model, device, seed

    @torch.no_grad()
    def predict(self, hidden: Tensor, generator: torch.Generator | None = None) -> Tensor:
        was_training = self.model.training
        self.model.eval()
        try:
            return self.model.sample(hidden.to(self.device), generator=generator).float().cpu()
        finally:
            self.model.train(was_training)


class Evaluator(ABC):
    """Scores a policy on held-out episodes; returns metric name → value (e.g. ``eef_mm_24ep``).

    After each call, ``last_episodes`` holds every metric's per-episode errors (episode, mm) and
    ``last_protocols`` the protocol each metric was measured under (:mod:`ground.protocols`)."""

    KIND = "offline"
    SOURCES: tuple[str, ...] = ()
    """Modules besides the class's own whose code decides the numbers (their digest is the evaluator version)."""

    last_episodes: dict[str, list[tuple[str, float]]]
    last_protocols: dict[str, Protocol]

    @abstractmethod
    def evaluate(self, policy: ChunkPolicy, episode_counts: list[int]) -> dict[str, float]:
        ...

    def record(self, policy: ChunkPolicy, demos: list[str], errors_mm: list[float], episode_counts: list[int],
               task: str) -> dict[str, float]:
        """Metric → mean over the first n episodes, keeping each metric's episodes and protocol beside it."""
        simulator = self.KIND == "simulator"
        self.last_episodes, self.last_protocols, means = {}, {}, {}
        for n in episode_counts:
            metric = eef_metric(n, simulator=simulator)
            self.last_episodes[metric] = list(zip(demos[:n], errors_mm[:n]))
            self.last_protocols[metric] = Protocol(
                name=protocol_name(self.KIND, task, self.spec.data.eval_split, n), kind=self.KIND, task=task,
                split=self.spec.data.eval_split, episodes=list(demos[:n]), seeds=[policy.seed],
                evaluator=evaluator_version(type(self)))
            means[metric] = float(np.mean(errors_mm[:n]))
        return means


def evaluator_version(cls: type) -> str:
    """``trainers.evaluate:OfflineEEFEvaluator@<12 hex>``: the digest of the source files that compute its numbers."""
    import hashlib
    import inspect

    digest = hashlib.sha256()
    for name in (cls.__module__, *getattr(cls, "SOURCES", ())):
        digest.update(open(inspect.getsourcefile(importlib.import_module(name)) or "", "rb").read())
    return f"{cls.__module__}:{cls.__name__}@{digest.hexdigest()[:12]}"


def episodes_task(path: "str | os.PathLike[str]") -> str:
    """The environment the episodes were recorded in (robomimic's ``env_args.env_name``), else the file's stem."""
    from pathlib import Path

    from cache.episodes import read_env_args

    try:
        return str(read_env_args(path).get("env_name") or Path(path).stem)
    except (OSError, KeyError, ValueError):
        return Path(path).stem


def build_evaluators(spec: ExperimentSpec, device: torch.device) -> list[Evaluator]:
    """Offline EEF always; the simulator replay too when ``eval.simulator``."""
    wanted = ["offline_eef", *(["sim_eef"] if spec.eval.simulator else [])]
    evaluators = []
    for name in wanted:
        module_name, class_name = EVALUATORS[name].split(":")
        evaluators.append(getattr(importlib.import_module(module_name), class_name)(spec, device))
    return evaluators


def fit_eef_gain(actions: list[np.ndarray], eef: list[np.ndarray]) -> np.ndarray:
    """Per-axis g minimising Σ (Δeef − g·a[:, :3])² over consecutive steps: (3,) metres per action unit."""
    a = np.concatenate([x[:-1, :3] for x in actions])
    delta = np.concatenate([np.diff(x, axis=0) for x in eef])
    return (a * delta).sum(axis=0) / np.maximum((a * a).sum(axis=0), 1e-12)


def rollout_eef(start: Tensor, actions: Tensor, gain: Tensor) -> Tensor:
    """(B, 3) start + (B, A, a) actions → (B, A + 1, 3) positions: start, then cumulative g·a[:, :, :3]."""
    steps = torch.cumsum(actions[..., :3] * gain, dim=1)
    return torch.cat([start[:, None], start[:, None] + steps], dim=1)


class OfflineEEFEvaluator(Evaluator):
    """``eef_mm_<n>ep`` from the held-out split, offline (no simulator)."""

    def __init__(self, spec: ExperimentSpec, device: torch.device):
        from cache.episodes import EpisodeFile
        from cache.registry import build_dataset

        self.spec = spec
        from ground.contract import ENV_CACHE_ROOT

        self.dataset = build_dataset(spec, "eval", cache_root=os.environ.get(ENV_CACHE_ROOT))
        self.by_demo: dict[str, list[int]] = defaultdict(list)
        for item, (entry, _) in enumerate(self.dataset.index.windows):
            self.by_demo[entry.demo].append(item)
        episodes = EpisodeFile(expand_path(spec.data.episodes))
        try:
            train = episodes.demos(spec.data.train_split)[:GAIN_FIT_DEMOS]
            gain = fit_eef_gain([episodes.actions(d) for d in train], [episodes.obs(d, "robot0_eef_pos") for d in train])
        finally:
            episodes.close()
        self.gain = torch.from_numpy(gain.astype(np.float32))
        self.task = episodes_task(expand_path(spec.data.episodes))
        self._check_counts(list(spec.eval.episodes))  # at start-up, not after hours of training

    def _check_counts(self, episode_counts: list[int]) -> None:
        available = len(self.by_demo)
        if episode_counts and max(episode_counts) > available:
            raise UserError(f"eval asks for {max(episode_counts)} episodes but split {self.spec.data.eval_split!r} "
                            f"has {available}", field="eval.episodes",
                            hint=f"use counts ≤ {available} or add held-out demos")

    @property
    def demos(self) -> list[str]:
        return list(self.by_demo)

    def evaluate(self, policy: ChunkPolicy, episode_counts: list[int]) -> dict[str, float]:
        self._check_counts(episode_counts)
        demos = self.demos[: max(episode_counts)]
        return self.record(policy, demos, self.per_demo_error_mm(policy, demos), episode_counts, self.task)

    def per_demo_error_mm(self, policy: ChunkPolicy, demos: list[str]) -> list[float]:
        generator = torch.Generator().manual_seed(policy.seed)
        errors = []
        batch = self.spec.loader.batch_size
        for demo in demos:
            items = self.by_demo[demo]
            demo_errors: list[Tensor] = []
            for start in range(0, len(items), batch):
                samples = [self.dataset[i] for i in items[start:start + batch]]
                demo_errors.append(self._window_errors(policy, samples, generator))
            errors.append(float(torch.cat(demo_errors).mean()) * 1000.0)
        return errors

    def _window_errors(self, policy: ChunkPolicy, samples: list[dict[str, Any]],
                       generator: torch.Generator) -> Tensor:
        hidden = torch.stack([s["hidden"] for s in samples])
        true_eef = torch.stack([s["eef_pos"] for s in samples])
        mask = torch.stack([s["action_mask"] for s in samples])
        predicted = policy.predict(hidden, generator)
        track = rollout_eef(true_eef[:, 0], predicted, self.gain)
        distance = (track[:, 1:] - true_eef[:, 1:]).norm(dim=-1)
        return distance[mask]

"""The progress file a trainer keeps in its run directory (``progress.json``, written atomically by rank 0).

It is the ETA's only source (``idmctl jobs``/``watch`` need neither MLflow nor the cluster's
accounting) and the record of measured step times that later preflights derive limits from: a run
with the same code version and the same :func:`timing_key` is expected to step as fast.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ground.contract import PROGRESS_FILE
from ground.paths import atomic_write_text
from ground.spec.schema import ExperimentSpec

WINDOW_STEPS = 20
"""Steps in the recent window the s/step is measured over: long enough to smooth one slow batch, short
enough to see a run slow down (a node's disk filling, another tenant's job)."""
WRITE_EVERY_S = 10.0
"""The trainer writes at least this often (and at every log line and checkpoint); the file stays tiny."""

_TIMING_FIELDS: dict[str, tuple[str, ...] | None] = {
    "data": ("cache_format", "dataset", "cached_layers", "frames", "token_grid", "channels", "dtype",
             "selected_layer_indices", "frame_window", "action_horizon", "action_dim"),
    "model": None,
    "loader": None,
    "train": ("effective_batch", "precision"),
    "resources": ("nodes", "gpus_per_node", "cpu_ranks", "cpus"),
    "stage": ("enabled",),
}
"""What decides seconds per step: geometry, model, loader, batch, ranks and where the bytes come from.
``None`` takes the whole section. Steps, learning rate, QoS or time limit change nothing per step."""


def timing_key(spec: ExperimentSpec) -> str:
    """16 hex characters naming everything that sets the step time."""
    dumped = spec.model_dump(mode="json")
    picked = {section: dumped[section] if keys is None else {k: dumped[section][k] for k in keys}
              for section, keys in _TIMING_FIELDS.items()}
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Progress:
    step: int
    """Optimizer steps done."""
    total: int
    """``train.steps``."""
    window_s_per_step: float | None
    """Mean seconds per step over the last ``window_steps`` steps of this attempt."""
    window_steps: int
    attempt_start_step: int
    """The step this attempt resumed at."""
    attempt_started_at: float
    """Epoch seconds the attempt's training loop started."""
    updated_at: float
    spec_hash: str
    code_version: str
    timing_key: str
    checkpoint_write_s: float | None = None
    """Seconds the last checkpoint took to write (what the signal lead must cover)."""
    checkpoint_bytes: int | None = None

    @property
    def remaining_steps(self) -> int:
        return max(0, self.total - self.step)

    @property
    def eta_s(self) -> float | None:
        if self.window_s_per_step is None:
            return None
        return self.remaining_steps * self.window_s_per_step

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_progress(run_dir: Path, progress: Progress) -> None:
    atomic_write_text(Path(run_dir) / PROGRESS_FILE, json.dumps(progress.as_dict(), sort_keys=True) + "\n")


def read_progress(run_dir: Path) -> Progress | None:
    """The run's progress, or None when not written yet (a job still staging) or unreadable."""
    try:
        document = json.loads((Path(run_dir) / PROGRESS_FILE).read_text())
        known = {f.name for f in fields(Progress)}
        return Progress(**{k: v for k, v in document.items() if k in known})
    except (OSError, ValueError, TypeError):
        return None


def now() -> float:
    return time.time()

"""The trainer's own totals for the efficiency report (``RUN_DIR/trainer_stats.json``).

Rank 0 keeps one entry per run of an attempt, keyed ``"<attempt>.<restart>"`` (a Slurm requeue reruns
the same attempt): steps, seconds in steps, seconds waiting for data, peak memory and, on a GPU, the
mean utilisation sampled at each log line. Sync sums a job's entries when the job ends and sets them
beside sacct's CPU and memory figures. Written atomically; a few hundred bytes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ground.contract import TRAINER_STATS_FILE
from ground.paths import atomic_write_text


@dataclass
class RunStats:
    steps: int = 0
    step_s: float = 0.0
    """Seconds inside optimizer steps (data wait included)."""
    data_wait_s: float = 0.0
    """Seconds the steps waited for the next batch."""
    peak_mem_bytes: int = 0
    """GPU memory allocated at peak on a GPU, else the host process's peak RSS."""
    device: str = "cpu"
    host_peak_rss_bytes: int = 0
    """Rank 0's peak resident memory (VmHWM) whatever the device: the memory figure when sacct has no MaxRSS."""
    gpu_util_sum: float = 0.0
    gpu_util_samples: int = 0

    @property
    def data_wait_frac(self) -> float | None:
        return self.data_wait_s / self.step_s if self.step_s > 0 else None

    @property
    def gpu_util(self) -> float | None:
        """Mean GPU utilisation (0–1) over the samples, None off a GPU or without NVML."""
        return self.gpu_util_sum / self.gpu_util_samples / 100 if self.gpu_util_samples else None

    def add(self, other: "RunStats") -> "RunStats":
        return RunStats(self.steps + other.steps, self.step_s + other.step_s, self.data_wait_s + other.data_wait_s,
                        max(self.peak_mem_bytes, other.peak_mem_bytes), other.device if other.steps else self.device,
                        max(self.host_peak_rss_bytes, other.host_peak_rss_bytes), self.gpu_util_sum + other.gpu_util_sum, self.gpu_util_samples + other.gpu_util_samples)


def run_key(attempt: int | str, restart: int | str) -> str:
    return f"{attempt}.{restart}"


def read_all(run_dir: Path) -> dict[str, RunStats]:
    try:
        document = json.loads((Path(run_dir) / TRAINER_STATS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    known = {f.name for f in fields(RunStats)}
    return {key: RunStats(**{k: v for k, v in value.items() if k in known}) for key, value in document.items()
            if isinstance(value, dict)}


def write_run(run_dir: Path, key: str, stats: RunStats) -> None:
    document: dict[str, Any] = {k: asdict(v) for k, v in read_all(run_dir).items()}
    document[key] = asdict(stats)
    atomic_write_text(Path(run_dir) / TRAINER_STATS_FILE, json.dumps(document, sort_keys=True) + "\n")


def attempt_totals(run_dir: Path, attempt: int) -> RunStats | None:
    """Every run of ``attempt`` summed; None when the trainer never reached a log line."""
    runs = [stats for key, stats in read_all(run_dir).items() if key.split(".")[0] == str(attempt)]
    if not runs:
        return None
    total = RunStats(device=runs[0].device)
    for stats in runs:
        total = total.add(stats)
    return total

"""The trainer's heartbeat, as the hang watchdog reads it: ``RUN_DIR/progress.json`` (rank 0 rewrites it
atomically with the step and the recent s/step) whose mtime rank 0 also bumps after every optimizer step
(:func:`beat`: one ``utime``, so a fast loop costs no file write per step).

The beat time is the later of the file's mtime and its ``updated_at``; the step time the watchdog
scales by k is the file's ``window_s_per_step`` (measured by the trainer), None before the first step.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ground.contract import PROGRESS_FILE


@dataclass(frozen=True)
class Heartbeat:
    step: int
    at: float
    """Epoch seconds of the last beat."""
    s_per_step: float | None


def beat(run_dir: Path) -> None:
    """Move the heartbeat's time to now (after an optimizer step); nothing before the file exists."""
    try:
        os.utime(Path(run_dir) / PROGRESS_FILE)
    except OSError:
        pass


def read(run_dir: Path) -> Heartbeat | None:
    path = Path(run_dir) / PROGRESS_FILE
    try:
        mtime = path.stat().st_mtime
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pace = document.get("window_s_per_step")
    return Heartbeat(step=int(document.get("step", 0)), at=max(mtime, float(document.get("updated_at") or 0.0)),
                     s_per_step=float(pace) if pace else None)


def threshold_s(heartbeat: Heartbeat, k: float, floor: float) -> float:
    """Silence that makes a hang: max(k × measured s/step, floor); the floor alone before a step was timed.
    One home for the job's watchdog and for sync's look at the jobs it sees."""
    return max(k * heartbeat.s_per_step, floor) if heartbeat.s_per_step else floor


def start_deadline_s(stage_bytes: int, bandwidth_bps: float | None, build_s: float | None, margin: float,
                     floor: float) -> float:
    """Seconds from the watchdog's start to the first beat before the start-up counts as hung: margin × (the
    stage-in still to come, bytes ÷ bandwidth, + the smoke's measured build time), at least ``floor``. An
    unmeasured part counts as nothing and the floor stands for it (the job script starts the watchdog
    after its stage-in: only the build counts there)."""
    stage = stage_bytes / bandwidth_bps if stage_bytes and bandwidth_bps else 0.0
    return max(floor, margin * (stage + (build_s or 0.0)))

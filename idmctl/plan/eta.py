"""Live ETA of a running job from its run directory's ``progress.json`` (written atomically by rank 0):
step / total, s/step over the recent window, ETA, and the predicted finish against the attempt's time
limit and the chain's remaining retry budget. Needs neither MLflow nor the cluster's accounting."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ground.progress import Progress, read_progress
from ground.errors import UserError
from ground.units import format_duration, parse_duration
from idmctl.record.stored_json import job_options


@dataclass(frozen=True)
class Eta:
    step: int
    total: int
    s_per_step: float | None
    window_steps: int
    eta_s: float | None
    finish_at: float | None
    """Epoch seconds of the predicted finish."""
    limit_at: float | None
    """Epoch seconds this attempt's time limit ends (start + limit)."""
    attempts_needed: int
    """Attempts after this one the remaining steps need at this pace (0 when it finishes within the limit)."""
    retries_left: int | None
    updated_s_ago: float
    warning: str | None

    @property
    def progress_text(self) -> str:
        return f"{self.step:,}/{self.total:,}"

    def finish_text(self, now: float) -> str:
        """``ETA 12.0 min, 8.0 min before the limit`` or the WARN."""
        if self.eta_s is None:
            return "measuring"
        text = f"ETA {format_duration(self.eta_s)}"
        if self.warning:
            return f"{text}; WARN {self.warning}"
        if self.limit_at is not None and self.finish_at is not None:
            text += f", {format_duration(self.limit_at - self.finish_at)} before the limit"
        return text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _epoch(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def estimate(progress: Progress, *, started_at: float | None, time_limit_s: float | None, retries_left: int | None,
             now: float) -> Eta:
    """The arithmetic: ETA = (total − step) × s/step; finish = now + ETA; vs start + limit; the overshoot
    ÷ a whole limit per attempt = further attempts, against the retries left."""
    rate = progress.window_s_per_step
    eta = progress.eta_s
    finish = now + eta if eta is not None else None
    start = started_at if started_at is not None else progress.attempt_started_at
    limit_at = start + time_limit_s if time_limit_s else None
    needed, warning = 0, None
    if finish is not None and limit_at is not None and finish > limit_at and time_limit_s:
        # Each requeue gets a fresh limit and resumes from the last checkpoint.
        needed = math.ceil((finish - limit_at) / time_limit_s)
        warning = (f"finish {format_duration(finish - limit_at)} past the time limit "
                   f"({progress.remaining_steps:,} steps × {rate:.3g} s/step = {format_duration(eta or 0)}, "
                   f"{format_duration(max(limit_at - now, 0))} left): needs {needed} more attempt(s)")
        if retries_left is not None:
            warning += f", retry budget {retries_left}" + (" — NOT ENOUGH" if needed > retries_left else "")
    return Eta(progress.step, progress.total, rate, progress.window_steps, eta, finish, limit_at, needed, retries_left,
               max(0.0, now - progress.updated_at), warning)


def eta_for_job(job: Any, chain: Any | None, now: float) -> Eta | None:
    """ETA of a running job (store rows ``Job``/``Chain``), or None when it has no progress yet."""
    if not job.script_path:
        return None
    progress = read_progress(Path(job.script_path).parent)  # the run directory holds every attempt's script
    if progress is None:
        return None
    try:
        limit = job_options(job.options_json, job.id).get("time_limit")
        limit_s = parse_duration(limit) if limit else None
    except (UserError, ValueError, TypeError):  # a damaged row shows no ETA against the limit, not an error
        limit_s = None
    retries_left = chain.retries_budget - chain.retries_used if chain is not None else None
    # A requeued job keeps its first start in the store, but each run gets a fresh limit: after a
    # requeue the limit counts from this attempt's start (the trainer's, a lower bound on Slurm's).
    started = _epoch(job.started_at) if not job.restarts else None
    return estimate(progress, started_at=started, time_limit_s=limit_s, retries_left=retries_left, now=now)

"""A finish date with its range (P10 / P50 / P90), from the team's own history per QoS and GPU count.

``jobs`` gives a point ETA from the step time. A chain on a preemptible QoS finishes later than that by
what the queue, the preemptions and every restart cost, and none of those is a constant:

- **queue wait**: the submit → start waits of past jobs on the same QoS and GPU count, resampled as they
  were (the store records submit and start; the split into submit → eligible and eligible → start needs
  Slurm's EligibleTime, which sync does not record yet, so the wait is counted whole and the forecast
  says so);
- **preemptions**: a rate per running hour, λ ~ Gamma(k + ½, H) for k preemptions in H running hours
  (Jeffreys' prior: the rate's own uncertainty, not a point rate, drives the draws);
- **each restart**: a queue wait again (resampled), the stage-in again, and the steps since the last
  checkpoint (uniform over one checkpoint interval);
- **the work**: steps × step time (measured: smoke or the running job).

Each of :data:`DRAWS` simulated chains runs those to the end; the finish date's P10/P50/P90 are the
quantiles of their wall times. With fewer than :data:`MIN_HISTORY` past jobs for the QoS and GPU count it
says so and shows the range its stated assumptions give (never a range it does not have).

Numpy only, pure (no I/O): the backtest test drives it with a history of known rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ground.units import format_duration
from idmctl.core.job_state import JobState
from idmctl.plan.budget import fmt_seconds
from idmctl.record.records import JobRecord

DRAWS = 4000
SEED = 0
MIN_HISTORY = 3
"""Past jobs on the QoS × GPU count below which the history is too thin to stand on its own."""
ASSUMED_WAIT_S = (600.0, 86_400.0)
"""Without history: the queue wait is taken anywhere from 10 min to a day (log-uniform), and said so."""
ASSUMED_PREEMPTIONS_PER_H = {True: (0.2, 2.0), False: (0.0, 0.0)}
"""Without history: a preemptible QoS preempts 0.2–2 times per running hour (card A's sub: ~1 h cycle)."""


@dataclass(frozen=True)
class PastJob:
    """One past attempt, as the store records it."""

    qos: str
    gpus: int
    waited_s: float | None
    """Submit → start (None: never started)."""
    ran_s: float
    """Start → end (0 when it never started)."""
    preemptions: int
    """Times it was preempted while running (its PREEMPTED state and requeues)."""


@dataclass(frozen=True)
class Plan:
    """What the chain still has to do."""

    steps: int
    step_s: float
    checkpoint_every: int
    stage_in_s: float = 0.0
    qos: str = ""
    gpus: int = 1
    preemptible: bool = False
    step_source: str = "estimate"
    """Where the step time comes from (``smoke on …``, ``running job …``, ``estimate``)."""
    assumed_preemptions_per_h: tuple[float, float] | None = None
    """Without running history: the range of preemption rates assumed (the profile's preempt cycle ½–2×)."""


@dataclass
class Forecast:
    """P10 / P50 / P90 of the wall time to finish, and what it rests on."""

    p10_s: float
    p50_s: float
    p90_s: float
    history_jobs: int
    preemptions_per_h: float | None
    """The history's rate (k / H), None when it has no running hours."""
    assumptions: list[str] = field(default_factory=list)
    """What the figures rest on, each with its source (history, measurement, assumption)."""

    @property
    def from_history(self) -> bool:
        return self.history_jobs >= MIN_HISTORY

    def to_json(self) -> dict[str, Any]:
        return {"p10_s": self.p10_s, "p50_s": self.p50_s, "p90_s": self.p90_s, "history_jobs": self.history_jobs,
                "from_history": self.from_history, "preemptions_per_h": self.preemptions_per_h,
                "assumptions": self.assumptions}


def forecast(plan: Plan, history: list[PastJob], draws: int = DRAWS, seed: int = SEED) -> Forecast:
    """Simulate ``draws`` chains of ``plan`` on what ``history`` says about its QoS and GPU count."""
    if plan.steps < 0 or not plan.step_s > 0 or plan.checkpoint_every < 1:
        raise ValueError("a plan needs steps ≥ 0, a step time > 0 and a checkpoint interval ≥ 1")
    rng = np.random.default_rng(seed)
    same = [j for j in history if j.qos == plan.qos and j.gpus == plan.gpus]
    waits = np.array([j.waited_s for j in same if j.waited_s is not None], dtype=float)
    hours = sum(j.ran_s for j in same) / 3600
    preempted = sum(j.preemptions for j in same)
    notes = [f"work: {plan.steps:,} steps × {fmt_seconds(plan.step_s)}/step ({plan.step_source}) = {format_duration(plan.steps * plan.step_s)}",
             f"checkpoint every {plan.checkpoint_every:,} steps; stage-in {format_duration(plan.stage_in_s)} after each start"]
    enough = len(same) >= MIN_HISTORY
    if enough and len(waits):
        wait = lambda n: rng.choice(waits, n)  # noqa: E731 (resampled as they were)
        notes.append(f"queue wait: {len(waits)} past submit → start waits on {plan.qos} × {plan.gpus} GPU, resampled "
                     f"(median {format_duration(float(np.median(waits)))}; submit → eligible not recorded: counted whole)")
    else:
        low, high = ASSUMED_WAIT_S
        wait = lambda n: np.exp(rng.uniform(math.log(low), math.log(high), n))  # noqa: E731
        notes.append(f"queue wait: ASSUMED 10 min – 1 d (only {len(same)} past jobs on {plan.qos} × {plan.gpus} GPU; "
                     f"{MIN_HISTORY} needed)")
    if enough and hours > 0:
        rate = rng.gamma(preempted + 0.5, 1 / hours, draws)
        notes.append(f"preemptions: {preempted} in {hours:.1f} running hours = {preempted / hours:.2f}/h "
                     "(the rate drawn from its Gamma(k + ½, H) posterior)")
    else:
        low_rate, high_rate = plan.assumed_preemptions_per_h or ASSUMED_PREEMPTIONS_PER_H[plan.preemptible]
        rate = rng.uniform(low_rate, high_rate, draws)
        notes.append(f"preemptions: ASSUMED {low_rate:g}–{high_rate:g}/h ({'preemptible' if plan.preemptible else 'not preemptible'}"
                     f" QoS, no running history on {plan.qos} × {plan.gpus} GPU)")
    total = _simulate(plan, wait, rate, rng)
    # inverted_cdf: an order statistic, never an interpolation between a finite time and ∞ (NaN).
    p10, p50, p90 = (float(v) for v in np.quantile(total, [0.1, 0.5, 0.9], method="inverted_cdf"))
    return Forecast(p10, p50, p90, len(same), preempted / hours if hours > 0 else None, notes)


MAX_RESTARTS = 10_000
"""A chain that would be preempted more often than this never finishes: its draw counts as infinite."""


def _simulate(plan: Plan, wait: Any, rate: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Wall seconds to finish, one per draw: vectorised over draws, one loop turn per restart."""
    draws = len(rate)
    remaining = np.full(draws, plan.steps * plan.step_s)
    total = wait(draws) + plan.stage_in_s
    active = remaining > 0
    interval = plan.checkpoint_every * plan.step_s
    for _ in range(MAX_RESTARTS):
        if not active.any():
            break
        index = np.flatnonzero(active)
        with np.errstate(divide="ignore"):
            until = rng.exponential(1 / np.where(rate[index] > 0, rate[index], np.nan)) * 3600
        until = np.where(np.isnan(until), np.inf, until)
        finishes = until >= remaining[index]
        done = index[finishes]
        total[done] += remaining[done]
        remaining[done] = 0
        cut = index[~finishes]
        ran = until[~finishes]
        kept = np.floor(ran / interval) * interval  # the work up to the last checkpoint survives
        total[cut] += ran + wait(len(cut)) + plan.stage_in_s
        remaining[cut] -= kept
        active = remaining > 0
    total[active] = np.inf
    return total


def history_from_jobs(jobs: list[JobRecord]) -> list[PastJob]:
    """Past attempts from the store's job records."""
    past = []
    for job in jobs:
        if job.submitted_at is None or job.ended_at is None:
            continue
        waited = (job.started_at - job.submitted_at).total_seconds() if job.started_at else None
        ran = (job.ended_at - job.started_at).total_seconds() if job.started_at else 0.0
        preempted = int(job.state is JobState.PREEMPTED) + int(job.restarts or 0)
        past.append(PastJob(qos=job.qos or "", gpus=int(job.gpus or 0), waited_s=waited, ran_s=max(0.0, ran),
                            preemptions=preempted))
    return past


def lines(result: Forecast, start_epoch: float | None = None) -> list[str]:
    """The forecast as the card and the checks print it."""
    from datetime import datetime, timezone

    def date(seconds: float) -> str:
        if not math.isfinite(seconds):
            return "never (preempted faster than it checkpoints)"
        if start_epoch is None:
            return format_duration(seconds)
        return f"{datetime.fromtimestamp(start_epoch + seconds, timezone.utc):%Y-%m-%d %H:%M} UTC (+{format_duration(seconds)})"

    basis = (f"from {result.history_jobs} past jobs" if result.from_history
             else f"too little history ({result.history_jobs} past jobs): the range its assumptions give")
    return [f"finish P10 {date(result.p10_s)}, P50 {date(result.p50_s)}, P90 {date(result.p90_s)} ({basis})",
            *[f"  {note}" for note in result.assumptions]]


def finish_note(ctx: Any, limits: Any, tier: Any, gpus: int) -> tuple[str, dict[str, Any]]:
    """preflight's qos check: the finish date's range for this spec before submit, from the recorded queue
    waits on its QoS × GPU count and the tier's preemptions (its preempt cycle ½–2× when preemptible)."""
    from idmctl.plan.budget import staging  # start-up: only where a preflight runs

    spec = ctx.spec
    stage = staging(ctx)
    cycle_h = (tier.preempt_cycle_seconds or 0) / 3600 if tier.preemptible else 0
    plan = Plan(steps=spec.train.steps, step_s=limits.step_s, checkpoint_every=max(1, int(limits.checkpoint_every.effective)),
                stage_in_s=stage.seconds if stage.enabled else 0.0, qos=spec.resources.qos, gpus=gpus,
                preemptible=tier.preemptible, step_source=limits.step_source,
                assumed_preemptions_per_h=(0.5 / cycle_h, 2 / cycle_h) if cycle_h else None)
    history = [PastJob(w.qos, w.gpus, w.seconds, 0.0, 0) for w in ctx.measurements.queue_waits]
    result = forecast(plan, history, draws=1000)
    head, *rest = lines(result)
    return head + " [" + "; ".join(r.strip() for r in rest[2:]) + "]", result.to_json()

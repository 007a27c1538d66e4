"""Limits derived from measurement: the time limit, the checkpoint interval and the signal lead.

Inputs, best first: the step and checkpoint-write times earlier runs recorded in their
``progress.json`` (same code version, same :func:`ground.progress.timing_key`), then the smoke's
measured compute and checkpoint write (the latest recorded smoke of this spec), then the static
estimate (bytes per step ÷ bandwidth). A value set in the spec (or on the command line) wins; the
io and qos checks WARN when it disagrees badly with the derivation.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ground.paths import runs_root
from ground.progress import read_progress, timing_key
from ground.provenance import Basis, DeviceKind, Provenance
from ground.units import format_duration, slurm_time
from idmctl.plan.budget import fmt_seconds, fmt_span, step_estimate
from idmctl.core.checks import PreflightContext, RecordedRun
from ground.paths import expand_path
from ground.units import parse_duration
from idmctl.core.checks import Measurements
from idmctl.core.checks import SmokeMeasurement
from idmctl.record.memo import tree_fingerprint
from idmctl.record.preflights import latest_smoke_numbers
from idmctl.record.preflights import version_for

if TYPE_CHECKING:
    from ground.spec.loader import ResolvedSpec
    from idmctl.core.profile import ClusterProfile

TIME_MARGIN = 1.25
"""Time limit = estimated wall clock × this: one slow node or a requeue's restart must still fit."""
MIN_TIME_LIMIT_S = 30 * 60.0
"""Start-up, evaluation and teardown are not in the per-step estimate; no derived limit is shorter."""
LOST_FRACTION = 0.10
"""On a preemptible tier the expected work lost per preemption (half an interval) stays under this
share of the preempt cycle (card jobs 6054/6108/6158 lost whole attempts to a 1 h cycle)."""
STEADY_INTERVAL_S = 4 * 3600.0
"""On a non-preemptible tier a node failure loses at most this much work (2 h on average). Young's
optimum sqrt(2 × write × MTBF) is ~1 h for a 10 s write and a week between failures; failures of a
steady tier are rarer than that, and retries are budgeted."""
WRITE_FRACTION = 0.02
"""Writing a checkpoint costs at most this share of the interval between checkpoints."""
SIGNAL_MARGIN = 3.0
"""Signal lead = (one step, which the trainer finishes first, + one checkpoint write) × this."""
SIGNAL_FLOOR_S = 60.0
"""Slurm checks time limits on a 30 s timer and may signal up to 60 s early: never lead by less."""
DISAGREE_FACTOR = 2.0
"""A spec value is WARNed when it breaks a stated criterion by this factor (or asks for this many times
the derived time limit)."""
MEANINGFUL_RUN_S = 3600.0
"""Runs estimated shorter than this are not WARNed about limits: the whole run is cheaper than the fuss."""


@dataclass(frozen=True)
class Derived:
    """One derived value, what the spec says, and which one the job gets."""

    name: str
    derived: float
    """Seconds (time limit, signal lead) or steps (checkpoint interval)."""
    arithmetic: str
    spec_value: float | None
    spec_text: str | None

    @property
    def effective(self) -> float:
        return self.spec_value if self.spec_value is not None else self.derived

    @property
    def source(self) -> str:
        return self.spec_text or "spec" if self.spec_value is not None else "derived"


@dataclass(frozen=True)
class Limits:
    step_s: float
    step_source: str
    step_provenance: Provenance
    """Measured (an earlier run, or the smoke on the job's device kind) or the data time alone."""
    write_s: float | None
    write_source: str
    wall_s: float
    time_limit: Derived
    checkpoint_every: Derived
    signal_lead: Derived
    checkpoint_warning: str | None
    time_warning: str | None
    loader_direct: bool = False
    """The plan's read path (``CacheFigures.reads_direct``): the job's loader reads O_DIRECT, told by
    ``contract.ENV_LOADER_DIRECT=1`` in the job's environment; False: the page cache."""

    @property
    def time_limit_slurm(self) -> str:
        """What the job gets: the spec's (or --time's) limit, else the derived one."""
        return slurm_time(self.time_limit.effective)

    @property
    def derived_time_limit_slurm(self) -> str:
        return slurm_time(self.time_limit.derived)

    def lines(self) -> list[str]:
        """One line per value: ``name = value (source): arithmetic``, for exp show and the job script."""
        out = [f"step time {fmt_seconds(self.step_s)}/step ({self.step_provenance.label}; {self.step_source}); checkpoint write "
               + (f"{fmt_seconds(self.write_s)} ({self.write_source})" if self.write_s is not None else
                  f"unknown ({self.write_source})")]
        for item, shown in ((self.time_limit, slurm_time(self.time_limit.effective)),
                            (self.checkpoint_every, f"{int(self.checkpoint_every.effective):,} steps"),
                            (self.signal_lead, f"{int(self.signal_lead.effective)} s")):
            if item.spec_value is None:
                out.append(f"{item.name} = {shown} (derived): {item.arithmetic}")
            else:
                out.append(f"{item.name} = {shown} (from {item.source}); derived would be: {item.arithmetic}")
        return out + [w for w in (self.time_warning, self.checkpoint_warning) if w]


def recorded_runs(runs_root: Path) -> list[RecordedRun]:
    """Every run directory's progress under ``$IDMCTL_HOME/runs/<experiment>/<chain>`` that measured a step."""
    found: list[RecordedRun] = []
    if not runs_root.is_dir():
        return found
    for run_dir in sorted(runs_root.glob("*/*")):
        progress = read_progress(run_dir)
        if progress is not None and progress.window_s_per_step:
            found.append(RecordedRun(f"{run_dir.parent.name}/{run_dir.name}", progress.code_version,
                                     progress.timing_key, progress.window_s_per_step, progress.checkpoint_write_s))
    return found


def _step_time(ctx: PreflightContext, version: str | None) -> tuple[float, str, Provenance, list[RecordedRun]]:
    """Recorded runs of this geometry (and ``version`` when given: the runner keeps only its own code's).

    The timing key holds ``resources.gpus_per_node`` and the trainer refuses a GPU spec without CUDA,
    so a recorded run with this key ran on the job's device kind."""
    key = timing_key(ctx.spec)
    same = [r for r in ctx.measurements.recorded_runs if r.timing_key == key and (version is None or r.code_version == version)]
    estimate = step_estimate(ctx)
    if same:
        median = statistics.median(r.s_per_step for r in same)
        names = ", ".join(r.run for r in same[:3]) + (" …" if len(same) > 3 else "")
        versions = ", ".join(sorted({r.code_version for r in same}))
        kind = DeviceKind.of_job(ctx.spec.resources.gpus_per_node)
        provenance = Provenance(Basis.MEASURED, f"{len(same)} earlier run(s) on {kind.label}: {names}", kind)
        return median, f"median of {len(same)} earlier run(s) with code {versions} and this geometry: {names}", provenance, same
    source = f"estimate: {estimate.step_formula()}"
    return estimate.step_s, source, estimate.provenance, []


def derive(ctx: PreflightContext, version: str | None = None, *, time_override: float | None = None) -> Limits:
    """The three limits for the job ``ctx`` describes; ``time_override`` is a ``--time`` flag, which wins too."""
    spec, res = ctx.spec, ctx.spec.resources
    step_s, step_source, step_provenance, same = _step_time(ctx, version)
    estimate = step_estimate(ctx)
    # A new job's page cache starts cold whatever step time it measured before (a steady window).
    warmup = estimate.cache.served_warmup_s if estimate.cache is not None else 0.0
    wall = estimate.stage_s + spec.train.steps * step_s + warmup

    writes = [r.checkpoint_write_s for r in same if r.checkpoint_write_s]
    smoke = ctx.measurements.smoke
    if writes:
        write_s, write_source = statistics.median(writes), f"median of {len(writes)} earlier run(s)"
    elif smoke is not None and smoke.ok and smoke.checkpoint_s is not None:
        write_s, write_source = smoke.checkpoint_s, "measured by the smoke"
    else:
        write_s, write_source = None, "no smoke or earlier run measured one"

    tier = ctx.profile.qos.get(res.qos)
    max_wall = tier.max_wall_seconds if tier is not None else math.inf
    raw = wall * TIME_MARGIN
    derived_time = min(max(raw, MIN_TIME_LIMIT_S), max_wall)
    derived_time = math.ceil(derived_time / 60) * 60  # Slurm limits are whole minutes
    stage = f"stage-in {fmt_span(estimate.stage_s)} + " if estimate.stage_s else ""
    cold = f" + cold page cache {fmt_span(warmup)}" if warmup else ""
    time_text = (f"({stage}{spec.train.steps:,} steps × {fmt_seconds(step_s)}/step{cold}) × {TIME_MARGIN} margin = "
                 f"{format_duration(raw)}")
    if raw < MIN_TIME_LIMIT_S:
        time_text += f", at least {format_duration(MIN_TIME_LIMIT_S)} for start-up and evaluation"
    if raw > max_wall:
        time_text += f", capped at QoS {res.qos} max wall {format_duration(max_wall)}"
    time_text += f" → {slurm_time(derived_time)}"
    if not step_provenance.measured:
        time_text += " (a lower bound: the step time holds no compute)"
    spec_time = time_override if time_override is not None else res.time_limit_seconds
    spec_time_text = f"resources.time_limit {res.time_limit}" if time_override is None else f"--time {slurm_time(time_override)}"
    time_limit = Derived("time limit", derived_time, time_text, spec_time, spec_time_text)

    cycle = tier.preempt_cycle_seconds if tier is not None and tier.preemptible else None
    if cycle is not None:
        upper = 2 * LOST_FRACTION * cycle
        upper_text = (f"preemptible {res.qos}: expected loss interval/2 ≤ {LOST_FRACTION:.0%} of the "
                      f"{format_duration(cycle)} cycle → interval ≤ {format_duration(upper)}")
    else:
        upper = STEADY_INTERVAL_S
        upper_text = f"non-preemptible {res.qos}: lose at most {format_duration(upper)} to a failure → interval ≤ {format_duration(upper)}"
    lower = write_s / WRITE_FRACTION if write_s else 0.0
    parts = [upper_text]
    if write_s:
        parts.append(f"write {fmt_seconds(write_s)} ≤ {WRITE_FRACTION:.0%} of interval → interval ≥ {format_duration(lower)}")
    interval_s = max(upper, lower)
    steps = max(1, min(spec.train.steps, int(interval_s // step_s) if step_s > 0 else spec.train.steps))
    parts.append(f"{format_duration(interval_s)} ÷ {fmt_seconds(step_s)}/step = {steps:,} steps"
                 + (" (the whole run)" if steps == spec.train.steps else ""))
    checkpoint = Derived("checkpoint interval", steps, "; ".join(parts),
                         spec.train.checkpoint_every, f"train.checkpoint_every {spec.train.checkpoint_every}"
                         if spec.train.checkpoint_every is not None else None)

    covered = step_s + (write_s or 0.0)
    raw_lead = covered * SIGNAL_MARGIN
    lead = max(SIGNAL_FLOOR_S, math.ceil(raw_lead))
    lead_text = (f"({fmt_seconds(step_s)} step + {fmt_seconds(write_s) + ' write' if write_s else 'unmeasured write'}) "
                 f"× {SIGNAL_MARGIN:g} = {fmt_seconds(raw_lead)}")
    lead_text += f", at least {SIGNAL_FLOOR_S:.0f} s (Slurm's timer)" if raw_lead < SIGNAL_FLOOR_S else ""
    lead_text += f" → {lead} s"
    spec_lead = None if res.signal_lead is None else _seconds(res.signal_lead)
    signal = Derived("signal lead", lead, lead_text, spec_lead, f"resources.signal_lead {res.signal_lead}"
                     if res.signal_lead is not None else None)

    return Limits(step_s, step_source, step_provenance, write_s, write_source, wall, time_limit, checkpoint, signal,
                  _checkpoint_warning(checkpoint, step_s, write_s, upper, wall),
                  _time_warning(time_limit, wall),
                  estimate.cache is not None and estimate.cache.reads_direct)


def _seconds(text: str) -> float:

    return parse_duration(text)


def _time_warning(time_limit: Derived, wall: float) -> str | None:
    if time_limit.spec_value is None or wall < MEANINGFUL_RUN_S:
        return None
    if time_limit.spec_value > DISAGREE_FACTOR * time_limit.derived:
        return (f"{time_limit.source} asks for {format_duration(time_limit.spec_value)}, "
                f"{time_limit.spec_value / time_limit.derived:.1f}× the derived {format_duration(time_limit.derived)}: "
                "a longer queue wait and a hung job found late")
    return None


def _checkpoint_warning(checkpoint: Derived, step_s: float, write_s: float | None, upper: float, wall: float) -> str | None:
    if checkpoint.spec_value is None or wall < MEANINGFUL_RUN_S:
        return None
    interval = checkpoint.spec_value * step_s
    if interval > DISAGREE_FACTOR * upper:
        return (f"{checkpoint.source} = {format_duration(interval)} of work, > {DISAGREE_FACTOR:g}× the "
                f"{format_duration(upper)} the derivation allows: a failure loses {format_duration(interval / 2)} on average")
    if write_s and write_s > DISAGREE_FACTOR * WRITE_FRACTION * interval:
        return (f"{checkpoint.source}: writing takes {fmt_seconds(write_s)} = {write_s / interval:.0%} of the "
                f"{format_duration(interval)} interval (> {DISAGREE_FACTOR * WRITE_FRACTION:.0%})")
    return None


def latest_smoke(spec_hash: str) -> "SmokeMeasurement | None":
    """The newest recorded smoke of this spec (any cluster): its measured compute and checkpoint write.
    Plain sqlite3 when the store is at head (submit imports no ORM), else the ORM."""
    import json

    text, run_id = latest_smoke_numbers(spec_hash)
    if not text:
        return None
    numbers = {**json.loads(text), "preflight_run": run_id}
    known = set(SmokeMeasurement.__dataclass_fields__)
    try:
        return SmokeMeasurement(**{k: v for k, v in numbers.items() if k in known})
    except TypeError:
        return None


def limits_for(resolved: "ResolvedSpec", profile: "ClusterProfile", *, qos: str | None = None,
               time_override: float | None = None, version: str | None = None) -> Limits:
    """Derive outside a preflight (exp show, submit): this machine's measurements, the latest recorded
    smoke of this spec, and earlier runs of this code. ``qos`` is a ``--qos`` flag (its preempt cycle counts)."""

    if qos is not None and qos != resolved.spec.resources.qos:
        spec = resolved.spec.model_copy(update={"resources": resolved.spec.resources.model_copy(update={"qos": qos})})
        resolved = type(resolved)(resolved.name, resolved.path, spec, resolved.chain)
    # Only what the derivation reads: the cache's size for stage-in, earlier runs, the latest smoke. No
    # cache inspection (it imports torch) and no queue history: submit stays light.
    root = expand_path(resolved.spec.data.cache_root)
    cache_bytes, files = tree_fingerprint(root)[:2] if root.is_dir() else (None, None)
    version = version or version_for(resolved.spec)  # a caller that has it (submit) saves hashing the tree
    measured = Measurements(cache_present=cache_bytes is not None, cache_bytes=cache_bytes, cache_file_count=files,
                            recorded_runs=recorded_runs(runs_root(profile.runs_root)), smoke=latest_smoke(resolved.hash))
    return derive(PreflightContext(resolved, profile, measured), version, time_override=time_override)


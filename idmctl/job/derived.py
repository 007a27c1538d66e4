"""A job's open limits filled in from the plan: the time limit, the checkpoint interval and the signal
lead a spec and its flags leave open (``idmctl.plan.limits`` derives them)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ground.heartbeat import start_deadline_s
from ground.units import parse_duration
from idmctl.core.job_options import JobOptions
from idmctl.plan.limits import latest_smoke, limits_for

if TYPE_CHECKING:
    from ground.spec.loader import ResolvedSpec
    from idmctl.core.profile import ClusterProfile


def job_limits(resolved: ResolvedSpec, profile: ClusterProfile, options: JobOptions,
               version: str | None = None) -> JobOptions:
    """Fill what the spec and flags leave open (time limit, checkpoint interval, signal lead) with the
    derived values, and note every value's arithmetic for the script's header."""
    flag_time = parse_duration(options.time_limit) if options.time_limit and options.time_limit != resolved.spec.resources.time_limit else None
    limits = limits_for(resolved, profile, qos=options.qos, time_override=flag_time, version=version)
    return replace(options, time_limit=options.time_limit or limits.derived_time_limit_slurm,
                   signal_lead=int(limits.signal_lead.effective),
                   checkpoint_every=None if resolved.spec.train.checkpoint_every else int(limits.checkpoint_every.derived),
                   loader_direct=limits.loader_direct, derivation=limits.lines())


def start_deadline(resolved: "ResolvedSpec", profile: "ClusterProfile") -> float:
    """The watchdog's start-up deadline for this job: the profile's ``hang.start_floor``, or
    ``hang.start_margin`` × the latest smoke's build (dataset + model) when that is longer."""
    smoke = latest_smoke(resolved.hash)
    build = sum(part for part in (smoke.dataset_s, smoke.model_s) if part) if smoke is not None and smoke.ok else None
    return start_deadline_s(0, None, build or None, profile.hang.start_margin, profile.hang.start_floor_seconds)

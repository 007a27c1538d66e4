"""Check ``io``: bytes read per step ÷ the read bandwidth of the tier the job reads from → seconds
per step → wall clock for ``train.steps``, against the job's time limit and the QoS's max wall.

Card A: N=12 dense reads ~808 GB/step at NVMe 8 GB/s ≈ 100 s/step ≈ 70 days for 60K steps;
N=4 sparse ≈ 270 GB/step ≈ 34 s/step of data alone with a cold cache (the card estimated 25–30 s;
without a GPU smoke the step time is shown as a data-bound lower bound, ``ground.provenance``).
The job's page cache (``plan.page_cache``: --mem 1600GB against a 2.38 TB routed working set) serves
63 % of it from memory in steady state: 21.1 s/step.
"""

from __future__ import annotations

from idmctl.plan.budget import fmt_seconds, fmt_span, step_estimate
from idmctl.plan.limits import derive
from idmctl.core.checks import CheckResult, PreflightContext, Status
from ground.units import format_duration

NAME = "io"
WARN_FRACTION = 0.9
"""A run planned to finish within the last 10% of its limit dies to one slow node."""


def check(ctx: PreflightContext) -> CheckResult:
    spec = ctx.spec
    estimate = step_estimate(ctx)
    limits = derive(ctx)
    if spec.resources.time_limit is not None:
        limit, limit_name = limits.time_limit.effective, f"resources.time_limit {spec.resources.time_limit}"
    else:
        limit, limit_name = limits.time_limit.derived, f"derived time limit {limits.derived_time_limit_slurm}"
    tier = ctx.profile.qos.get(spec.resources.qos)
    if tier is not None and tier.max_wall_seconds < limit:
        limit, limit_name = tier.max_wall_seconds, f"QoS {spec.resources.qos} max wall {tier.max_wall}"
    numbers = {"sample_bytes": estimate.sample_bytes, "step_bytes": estimate.step_bytes, "nodes": estimate.nodes,
               "per_node": estimate.per_node, "bandwidth_bps": estimate.bandwidth,
               "data_s_per_step": estimate.data_s, "compute_s_per_step": estimate.compute_s,
               "loader_s_per_step": estimate.loader_s, "overlapped": estimate.overlapped, "bound": estimate.bound,
               "step_s": estimate.step_s,
               "train_s": estimate.train_s, "stage_s": estimate.stage_s, "wall_s": estimate.wall_s, "limit_s": limit,
               "derived_time_limit_s": limits.time_limit.derived,
               "step_provenance": limits.step_provenance.as_dict(),
               "page_cache": estimate.cache.as_dict() if estimate.cache is not None else None}
    at_least = "" if limits.step_provenance.measured else "≥ "
    verdict = f"{at_least}{fmt_span(estimate.wall_s)} vs {limit_name} ({format_duration(limit)})"
    summary = f"{estimate.arithmetic()}; {verdict}"
    if estimate.wall_s > limit:
        affordable = int(max(limit - estimate.stage_s, 0) / estimate.step_s)
        stage = "" if spec.stage.enabled else ", or stage the cache to NVMe (stage.enabled)"
        fix = (f"read less per step: repeat each sample (loader.repeats), fewer routed layers (N), a smaller frame "
               f"window or effective batch{stage}; "
               f"at {fmt_seconds(estimate.step_s)}/step only {affordable:,} steps fit")
        return CheckResult(NAME, Status.FAIL, f"too slow: {summary}", numbers, fix)
    if estimate.wall_s > WARN_FRACTION * limit:
        return CheckResult(NAME, Status.WARN, f"tight: {summary}", numbers,
                           "leave headroom: raise the time limit or lower steps")
    if limits.time_warning:
        return CheckResult(NAME, Status.WARN, f"{summary}; {limits.time_warning}", numbers,
                           f"set resources.time_limit: {limits.derived_time_limit_slurm} or leave it unset to derive it "
                           f"({limits.time_limit.arithmetic})")
    return CheckResult(NAME, Status.PASS, summary, numbers)

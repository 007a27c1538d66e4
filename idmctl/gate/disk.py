"""Check ``disk``: node-local staging space holds the stage-in copy (the card copies 6.6 TB of
cache to /tmp before training; too little scratch is ENOSPC two hours in)."""

from __future__ import annotations

from idmctl.plan.budget import routed_staging_fix, staging
from idmctl.core.checks import CheckResult, PreflightContext, Status
from ground.units import format_bytes

NAME = "disk"


def check(ctx: PreflightContext) -> CheckResult:
    spec = ctx.spec
    stage = staging(ctx)
    if not stage.enabled:
        return CheckResult(NAME, Status.PASS, "stage.enabled false: nothing is copied to node-local disk",
                           {"stage_bytes": 0})
    if ctx.is_this_machine and ctx.measurements.scratch_free_bytes is not None:
        capacity = ctx.measurements.scratch_free_bytes
        source = f"free under {spec.stage.dest} on this machine (statvfs)"
    else:
        capacity = ctx.profile.node.scratch_bytes
        source = f"scratch of a {ctx.profile.name} node"
    numbers = {"stage_bytes": stage.bytes, "capacity_bytes": capacity, "measured": stage.measured, "nodes": stage.nodes,
               "reused": stage.reused}
    if stage.reused:
        return CheckResult(NAME, Status.PASS, f"already staged, nothing to copy: {stage.formula}", numbers)
    if not stage.measured and not spec.data.cache_files:
        return CheckResult(NAME, Status.WARN,
                           f"cannot size the stage-in: {stage.cache_root} is not on this machine and data.cache_files "
                           "is unset", numbers, "set data.cache_files, or run preflight where the cache is mounted")
    arithmetic = f"stage-in {stage.formula} vs {format_bytes(capacity)} {source}"
    if stage.nodes > 1:
        arithmetic += " (per node)"
    if stage.bytes > capacity:
        routed_fix = routed_staging_fix(ctx, lambda routed: routed.bytes <= capacity)
        fix = "stage fewer layers/episodes, use a node with more scratch, or read from NAS (stage.enabled: false; see the io check)"
        if routed_fix:
            fix = f"{routed_fix}, fits in {format_bytes(capacity)}; or {fix}"
        return CheckResult(NAME, Status.FAIL, f"does not fit → ENOSPC during stage-in: {arithmetic}", numbers, fix)
    return CheckResult(NAME, Status.PASS, f"fits ({stage.bytes / capacity:.0%}): {arithmetic}", numbers)

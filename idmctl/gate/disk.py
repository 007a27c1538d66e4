"""Check ``disk``: node-local staging space holds the stage-in copy (the card copies 6.6 TB of
cache to /tmp before training; too little scratch is ENOSPC two hours in), and the run directory's
file system holds the checkpoints retention keeps, at the size the smoke measured."""

from __future__ import annotations

from idmctl.plan.budget import routed_staging_fix, staging
from idmctl.core.checks import CheckResult, PreflightContext, Status
from ground.stage import node_named
from ground.units import format_bytes

NAME = "disk"
_SEVERITY = (Status.PASS, Status.SKIP, Status.WARN, Status.FAIL)


def check(ctx: PreflightContext) -> CheckResult:
    stage, checkpoints = stage_check(ctx), checkpoint_check(ctx)
    status = max(stage.status, checkpoints.status, key=_SEVERITY.index)
    fix = "; ".join(r.fix for r in (stage, checkpoints) if r.fix and r.status is not Status.PASS)
    return CheckResult(NAME, status, f"{stage.summary}; {checkpoints.summary}",
                       {**stage.numbers, **checkpoints.numbers}, fix)


def checkpoint_check(ctx: PreflightContext) -> CheckResult:
    """(kept + best + the one being written, before the oldest goes) × the smoke's checkpoint bytes vs
    the free space of the file system the run directories are on."""
    train, smoke = ctx.spec.train, ctx.measurements.smoke
    count = train.keep_last + int(train.keep_best) + 1
    size = smoke.checkpoint_bytes if smoke is not None and smoke.ok and smoke.checkpoint_bytes else None
    free = ctx.measurements.runs_free_bytes
    numbers = {"checkpoints_kept": count, "checkpoint_bytes": size, "runs_free_bytes": free}
    terms = f"({train.keep_last} last{' + 1 best' if train.keep_best else ''} + 1 being written)"
    if size is None:
        return CheckResult(NAME, Status.PASS, f"checkpoints {terms} not sized: no smoke measured one", numbers)
    total = count * size
    numbers["checkpoints_bytes"] = total
    arithmetic = f"checkpoints {terms} × {format_bytes(size)} = {format_bytes(total)}"
    if free is None:
        return CheckResult(NAME, Status.PASS, f"{arithmetic}; the run directory's free space is not known here",
                           numbers)
    arithmetic += f" vs {format_bytes(free)} free for run directories"
    if total > free:
        return CheckResult(NAME, Status.FAIL, f"does not fit → ENOSPC at a checkpoint: {arithmetic}", numbers,
                           "free space where run directories live ($IDMCTL_HOME/runs), or lower train.keep_last / "
                           "set train.keep_best: false")
    return CheckResult(NAME, Status.PASS, f"{arithmetic} ({total / free:.0%})", numbers)


def stage_check(ctx: PreflightContext) -> CheckResult:
    spec = ctx.spec
    stage = staging(ctx)
    if not stage.enabled:
        return CheckResult(NAME, Status.PASS, "stage.enabled false: nothing is copied to node-local disk",
                           {"stage_bytes": 0})
    on_node = node_named(spec.stage.dest)
    if on_node is not None:
        # The node expands it when the job runs: this machine's disks say nothing about it.
        capacity = ctx.profile.node.scratch_bytes
        source = (f"scratch of a {ctx.profile.name} node ({on_node.shown} is named by the node, not measurable "
                  f"here: `idmctl doctor --nodes --scratch '{on_node.shown}'` checks it on each node)")
    elif ctx.is_this_machine and ctx.measurements.scratch_free_bytes is not None:
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

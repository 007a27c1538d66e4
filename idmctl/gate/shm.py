"""Check ``shm``: DataLoader worker batches pass through ``/dev/shm``; per node they need
ranks × workers × prefetch × batch × bytes per sample (card job 5845: 792 MB/sample × the prefetch
queue × 8 ranks → ENOSPC). ``num_workers 0`` keeps batches in the rank's own memory."""

from __future__ import annotations

from cache.prefetch import PREFETCH_DEPTH, buffer_slots
from ground.geometry import sample_io
from idmctl.core.checks import CheckResult, PreflightContext, Status
from idmctl.plan.shm import need_bytes
from ground.units import format_bytes

NAME = "shm"
WARN_FRACTION = 0.8
"""Above this share of /dev/shm other tenants of the node (and pinned copies) can tip it over."""


def check(ctx: PreflightContext) -> CheckResult:
    spec = ctx.spec
    loader, res = spec.loader, spec.resources
    if ctx.is_this_machine and ctx.measurements.shm_free_bytes is not None:
        capacity, source = ctx.measurements.shm_free_bytes, "free on this machine's /dev/shm (statvfs)"
    else:
        capacity, source = ctx.profile.node.shm_bytes, f"/dev/shm of a {ctx.profile.name} node"
    if loader.num_workers == 0:
        return CheckResult(NAME, Status.PASS,
                           f"num_workers 0: batches never pass through /dev/shm (0 B of {format_bytes(capacity)} {source}); "
                           f"the rank's batch loader holds its {buffer_slots(0)} buffers ({PREFETCH_DEPTH} read ahead + 1 "
                           "in use) in its own memory (check loader)",
                           {"need_bytes": 0, "capacity_bytes": capacity})
    # What a worker hands the rank is the sliced sample, whatever mmap did to the read.
    sample = sample_io(spec.data, mmap=True)
    # Workers carry distinct samples only; repeats are made on the rank's device (cache.registry.repeat_samples).
    ranks, workers, prefetch, batch = (res.ranks_per_node, loader.num_workers, loader.effective_prefetch,
                                       loader.samples_per_batch)
    need = need_bytes(spec)
    batch_text = (f"batch {batch}" if loader.repeats == 1
                  else f"(batch {loader.batch_size} ÷ repeats {loader.repeats} = {batch} samples)")
    arithmetic = (f"{ranks} ranks × {workers} workers × {prefetch} prefetch × {batch_text} × {sample.bytes:,} B/sample "
                  f"= {need:,} B ({format_bytes(need)}) vs {format_bytes(capacity)} {source}")
    numbers = {"need_bytes": need, "capacity_bytes": capacity, "sample_bytes": sample.bytes, "ranks_per_node": ranks,
               "num_workers": workers, "prefetch": prefetch, "batch_size": batch}
    fits = capacity // (ranks * prefetch * batch * sample.bytes)
    fix = (f"num_workers ≤ {fits} fits; num_workers 0 needs none (the card's fix)" if fits
           else "set loader.num_workers: 0 (the card's fix)")
    if need > capacity:
        return CheckResult(NAME, Status.FAIL, f"overflow → ENOSPC: {arithmetic}", numbers, fix)
    if need > WARN_FRACTION * capacity:
        return CheckResult(NAME, Status.WARN, f"{need / capacity:.0%} full: {arithmetic}", numbers, fix)
    return CheckResult(NAME, Status.PASS, f"fits ({need / capacity:.0%}): {arithmetic}", numbers)

"""Check ``loader``: DataLoader settings that torch rejects or silently ignores (card job 6262:
``persistent_workers=True`` hard-coded against ``num_workers 0`` → ValueError after a 2 h stage), and
whether the batch buffers of the trainer's loader fit the node's memory (``cache.prefetch``: with
``num_workers 0`` each rank holds ``PREFETCH_DEPTH + 1`` batches in the cache's dtype, pinned on GPU)."""

from __future__ import annotations

from cache.prefetch import PREFETCH_DEPTH, buffer_bytes, buffer_slots
from ground.geometry import sample_io
from ground.units import format_bytes
from idmctl.core.checks import CheckResult, PreflightContext, Status

NAME = "loader"
BUFFER_WARN_FRACTION = 0.5
"""Buffers above half of ``--mem`` leave too little for the model, the optimizer and the page cache."""

# torch.utils.data.DataLoader.__init__'s own messages, quoted so the operator recognises them in logs.
TORCH_PERSISTENT = "ValueError: persistent_workers option needs num_workers > 0"
TORCH_PREFETCH = ("ValueError: prefetch_factor option could only be specified in multiprocessing."
                  "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.")


def check(ctx: PreflightContext) -> CheckResult:
    spec = ctx.spec
    loader, res = spec.loader, spec.resources
    derived = loader.derived_persistent_workers
    fails: list[str] = []
    warns: list[str] = []
    fixes: list[str] = []
    if loader.persistent_workers is not None:
        if loader.persistent_workers and loader.num_workers == 0:
            fails.append(f"loader.persistent_workers: true with num_workers 0 → torch raises {TORCH_PERSISTENT} "
                         "(card job 6262)")
            fixes.append("delete loader.persistent_workers: it is derived as num_workers > 0")
        elif loader.persistent_workers != derived:
            fails.append(f"loader.persistent_workers: {str(loader.persistent_workers).lower()} disagrees with the "
                         f"derived num_workers > 0 = {str(derived).lower()}")
            fixes.append("delete loader.persistent_workers: it is derived as num_workers > 0")
        else:
            warns.append(f"loader.persistent_workers: {str(loader.persistent_workers).lower()} is set by hand")
            fixes.append("remove it; derived as num_workers > 0")
    if loader.prefetch_factor is not None and loader.num_workers == 0:
        fails.append(f"loader.prefetch_factor: {loader.prefetch_factor} with num_workers 0 → torch raises {TORCH_PREFETCH}")
        fixes.append("delete loader.prefetch_factor, or set num_workers > 0")
    if loader.pin_memory and res.gpus_per_node == 0:
        warns.append("loader.pin_memory: true on a CPU job → torch warns 'no accelerator is found' and ignores it")
        fixes.append("set pin_memory: false for CPU runs")
    workers_per_node = loader.num_workers * res.ranks_per_node
    if workers_per_node and workers_per_node + res.ranks_per_node > res.cpus:
        warns.append(f"{res.ranks_per_node} ranks × {loader.num_workers} workers + {res.ranks_per_node} ranks = "
                     f"{workers_per_node + res.ranks_per_node} processes on resources.cpus {res.cpus}")
        fixes.append("lower num_workers or ask for more CPUs")
    buffers = buffer_arithmetic(ctx)
    if buffers is not None:
        need, text = buffers
        if need > res.mem_bytes:
            fails.append(f"the loader's buffers do not fit the node's memory: {text}")
            fixes.append(f"lower loader.batch_size (or raise loader.repeats, which reads fewer samples), or raise "
                         f"resources.mem above {format_bytes(need)}")
        elif need > BUFFER_WARN_FRACTION * res.mem_bytes:
            warns.append(f"the loader's buffers take {need / res.mem_bytes:.0%} of the node's memory: {text}")
            fixes.append("lower loader.batch_size or raise resources.mem")
    numbers = {"num_workers": loader.num_workers, "persistent_workers": derived,
               "persistent_workers_set": loader.persistent_workers, "prefetch_per_worker": loader.effective_prefetch,
               "pin_memory": loader.pin_memory, "buffer_bytes": buffers[0] if buffers else None}
    settings = (f"num_workers {loader.num_workers}, persistent_workers {str(derived).lower()} (derived), "
                f"prefetch {loader.effective_prefetch}/worker, pin_memory {str(loader.pin_memory).lower()}")
    if fails:
        return CheckResult(NAME, Status.FAIL, "; ".join(fails + warns), numbers, "; ".join(fixes))
    if warns:
        return CheckResult(NAME, Status.WARN, f"{settings}; " + "; ".join(warns), numbers, "; ".join(fixes))
    held = f"; {buffers[1]}" if buffers else ""
    return CheckResult(NAME, Status.PASS, f"consistent: {settings}{held}", numbers)


def buffer_arithmetic(ctx: PreflightContext) -> tuple[int, str] | None:
    """Per node: the batch loader's buffers (``num_workers 0``), with the arithmetic; None with workers
    (their batches are in /dev/shm: check ``shm``)."""
    spec = ctx.spec
    loader, res = spec.loader, spec.resources
    if loader.num_workers:
        return None
    sample = sample_io(spec.data, mmap=True).bytes  # the cache's dtype: nothing is converted on the host
    per_rank = buffer_bytes(loader.samples_per_batch, sample, 0)
    need = res.ranks_per_node * per_rank
    pinned = " pinned" if res.gpus_per_node else ""
    text = (f"{res.ranks_per_node} ranks × {buffer_slots(0)} batch buffers ({PREFETCH_DEPTH} read ahead + 1 in use) × "
            f"{loader.samples_per_batch} samples × {sample:,} B/sample ({spec.data.dtype}) = {format_bytes(need)}{pinned} "
            f"vs resources.mem {format_bytes(res.mem_bytes)}")
    return need, text

"""The arithmetic io, qos and disk share: bytes staged, bytes read per step, seconds per step.

One place computes them so the three checks can never disagree about the same run.

Per node: a job of ``resources.nodes`` nodes stages the whole cache onto each node's
own NVMe (the sampler may hand any sample to any rank), and each node reads only its ranks' share
of an optimizer step's samples from its own copy, at its own NVMe bandwidth. The NAS is shared:
the nodes' concurrent stage-in copies split ``nas_read``, and so do unstaged reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ground.geometry import HiddenGeometry, sample_io
from ground.paths import expand_path
from ground.provenance import Basis, DeviceKind, Provenance, compute_unmeasured
from ground.spec.schema import ExperimentSpec
from ground.stage import node_named, reuses, spec_identity
from cache.prefetch import PREFETCH_DEPTH
from idmctl.core.checks import PreflightContext
from idmctl.plan.page_cache import FAR_LARGER, ASSUMPTIONS, CacheFigures, figures
from ground.units import format_bytes, format_duration


def fmt_bandwidth(bytes_per_s: float) -> str:
    return f"{format_bytes(bytes_per_s)}/s"


def fmt_seconds(seconds: float) -> str:
    """Per-step times span 1e-5 s (quickstart) to 100 s (N=12 dense): keep three significant digits."""
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 0.01:
        return f"{seconds:.3f} s"
    return f"{seconds * 1000:.3g} ms"


def fmt_span(seconds: float) -> str:
    """Wall-clock spans: '23.6 d', '2.2 h'; sub-10 s spans keep their digits instead of '0.0 s'."""
    return fmt_seconds(seconds) if seconds < 10 else format_duration(seconds)


@dataclass(frozen=True)
class Staging:
    """What stage-in copies to each node's local disk, and how long the nodes' copies take from the NAS."""

    enabled: bool
    bytes: int
    """Bytes one node copies (the whole cache): what one node's scratch must hold."""
    formula: str
    measured: bool
    """True when ``bytes`` is the cache's measured size on this machine, False when estimated."""
    seconds: float
    cache_root: str
    nodes: int = 1
    """Nodes staging at once; they share the NAS, so the copy takes ``nodes × bytes ÷ nas_read``."""
    reused: bool = False
    """``stage.dest`` on this machine already holds a finished copy with this spec's key
    (``ground.stage``): stage-in copies nothing, takes no time. ``bytes`` stays what a copy would need."""
    restaged: str = ""
    """Why no copy outlives the job (``$SLURM_TMPDIR`` is the job's own; /tmp is private to each job on this
    cluster): every attempt copies again. Empty: a requeued attempt on the same node finds the copy."""

    @property
    def copied(self) -> str:
        """``2 nodes × 7.2 TB``: what crosses the NAS during stage-in."""
        return f"{self.nodes} nodes × {format_bytes(self.bytes)}" if self.nodes > 1 else format_bytes(self.bytes)


def staging(ctx: PreflightContext, layers: str | None = None) -> Staging:
    """What stage-in copies; ``layers`` (``all``/``routed``) overrides ``stage.layers`` for what-ifs."""
    data, stage = ctx.spec.data, ctx.spec.stage
    layers = layers or stage.layers
    nas = ctx.profile.storage.nas_read_bps
    measured = ctx.measurements
    geometry = HiddenGeometry.from_spec(data)
    n = data.routing_n
    if measured.cache_present and measured.cache_bytes is not None:
        count = measured.cache_file_count
        size = measured.cache_bytes
        formula = f"{format_bytes(size)} measured under {data.cache_root} ({count:,} files)"
        if layers == "routed":
            size = count * n * geometry.layer_bytes
            formula = (f"routed layers only: {count:,} files × {n} layers × {geometry.layer_bytes:,} B = {size:,} B "
                       f"({format_bytes(size)}) of the {format_bytes(measured.cache_bytes)} measured under "
                       f"{data.cache_root}")
        is_measured = True
    else:
        files = data.cache_files or 0
        if layers == "routed":
            size = files * n * geometry.layer_bytes
            formula = (f"routed layers only: {files:,} files × {n} layers × {geometry.layer_bytes:,} B = {size:,} B "
                       f"({format_bytes(size)}; estimated from data.cache_files)")
        else:
            file_bytes = geometry.file_bytes
            size = files * file_bytes
            formula = (f"{files:,} files × {file_bytes:,} B = {size:,} B ({format_bytes(size)}, "
                       f"{format_bytes(size, binary=True)}; estimated from data.cache_files, the cache is not on "
                       "this machine)")
        is_measured = False
    nodes = ctx.spec.resources.nodes
    # Judged for this very spec and layer set (a what-if of other layers or blocks is another key).
    state = None
    restaged = restaged_why(ctx) if stage.enabled else ""
    if stage.enabled and ctx.is_this_machine and node_named(stage.dest) is None and not restaged:  # not here, or gone
        layer_words, model = spec_identity(layers, data)
        same = reuses(measured.staged_copy, expand_path(data.cache_root), layer_words, model)
        state = None if same is None else "reuse" if same else "replace"
    reused = state == "reuse"
    seconds = nodes * size / nas if stage.enabled and not reused else 0.0
    if nodes > 1:
        formula += f", per node (each of {nodes} nodes stages its own copy)"
    if reused:
        formula += f"; {stage.dest} already holds this copy (same source, layers, model, files): nothing to copy"
    elif state == "replace":
        formula += f"; the copy at {stage.dest} is of another key (layer set, cache files or model): replaced"
    if restaged:
        formula += f"; copied again on every attempt ({restaged})"
    return Staging(stage.enabled, size, formula, is_measured, seconds, data.cache_root, nodes, reused, restaged)


def restaged_why(ctx: PreflightContext) -> str:
    """Why a staged copy would not outlive its job, in words; empty when it may (a shared /tmp, a site's
    scratch the job does not own). ``$SLURM_TMPDIR`` is per job by definition; a ``stage.dest`` under /tmp or
    /dev/shm is where the cluster makes those private to each job (``Measurements.private_tmp``)."""
    dest = ctx.spec.stage.dest
    named = node_named(dest)
    if named is not None:
        return f"${named.variable} is the job's own directory, removed when it ends" if named.per_job else ""
    private = ctx.measurements.private_tmp
    path = expand_path(dest)
    if private and any(path == Path(d) or Path(d) in path.parents for d in ("/tmp", "/dev/shm")):
        return f"/tmp is private to each job on this cluster: {private}"
    return ""


def stage_attempts(ctx: PreflightContext, stage: Staging, train_s: float) -> tuple[float, str]:
    """Expected attempts of a run whose copy is made again on every attempt (``Staging.restaged``), and the
    line with its arithmetic: bytes ÷ rate × expected attempts. Each attempt runs at most the tier's preempt
    cycle (preemptible) or max wall, less its own stage-in, so attempts = ⌈work ÷ (span − stage-in)⌉;
    infinite when stage-in alone fills the span. (1, "") when the copy outlives the job (counted once)."""
    if not stage.enabled or not stage.restaged:
        return 1, ""
    copy = (f"stage-in {stage.copied} ÷ NAS {fmt_bandwidth(ctx.profile.storage.nas_read_bps)} = "
            f"{fmt_span(stage.seconds)}")
    tier = ctx.profile.qos.get(ctx.spec.resources.qos)
    if tier is None:
        return 1, f"{copy} on every attempt ({stage.restaged}); attempts not counted (QoS not in the profile)"
    if tier.preemptible and tier.preempt_cycle_seconds:
        span, what = tier.preempt_cycle_seconds, f"preempt cycle {format_duration(tier.preempt_cycle_seconds)}"
    else:
        span, what = tier.max_wall_seconds, f"max wall {format_duration(tier.max_wall_seconds)}"
    useful = span - stage.seconds
    if useful <= 0:
        return math.inf, (f"{copy} on every attempt ({stage.restaged}) ≥ {what}: no attempt gets past "
                          "stage-in, the run never finishes")
    attempts = max(1, math.ceil(train_s / useful))
    return attempts, (f"{copy} × {attempts} expected attempt{'s' if attempts > 1 else ''} = "
                      f"{fmt_span(stage.seconds * attempts)}, copied again on every attempt ({stage.restaged}; "
                      f"attempts = ⌈{fmt_span(train_s)} of work ÷ ({what} − {fmt_span(stage.seconds)} stage-in = "
                      f"{fmt_span(useful)})⌉)")


def routed_staging_fix(ctx: PreflightContext, fits: Callable[[Staging], bool]) -> str | None:
    """The fix line "stage only the routed layers", with its numbers, when it would make ``fits`` true
    and the spec stages every layer today; ``None`` otherwise."""
    data, stage = ctx.spec.data, ctx.spec.stage
    if not stage.enabled or stage.layers == "routed" or data.routing_n >= len(data.cached_layers):
        return None
    routed = staging(ctx, "routed")
    if not fits(routed):
        return None
    return (f"stage only the routed layers (stage.layers: routed; {data.routing_n} of {len(data.cached_layers)} "
            f"blocks {data.selected_blocks}): {routed.formula} ÷ NAS "
            f"{fmt_bandwidth(ctx.profile.storage.nas_read_bps)} = {format_duration(routed.seconds)}")


@dataclass(frozen=True)
class StepEstimate:
    """Seconds per optimizer step: data read time (+ compute when the smoke measured it)."""

    sample_bytes: int
    sample_formula: str
    effective_batch: int
    repeats: int
    """``loader.repeats``: each sample read serves K rows, so a step reads effective_batch / K samples."""
    step_bytes: int
    """Bytes the busiest reader moves per optimizer step: one node's share from its NVMe when staged,
    the whole step from the shared NAS when not."""
    tier: str
    bandwidth: float
    data_s: float
    compute_s: float | None
    compute_note: str
    step_s: float
    steps: int
    train_s: float
    stage_s: float
    nodes: int = 1
    per_node: bool = False
    """True when each node reads its share (staged to NVMe), False when all nodes share the NAS."""
    provenance: Provenance = Provenance(Basis.LOWER_BOUND, "no smoke")
    """Whether ``step_s`` holds measured compute or is the data time alone (a lower bound)."""
    cache: CacheFigures | None = None
    """The page cache's steady state (``plan.page_cache``): ``data_s`` is its steady figure and ``train_s``
    holds its cold first pass. None: the profile states no page-cache rate, every byte from the storage."""
    loader_s: float | None = None
    """The loader's CPU per step on the busiest rank: its bytes × the smoke's measured CPU s/GB ÷ the
    rank's CPUs. None: no smoke measured the loader (the term is then not counted, and says so)."""
    loader_note: str = "loader CPU not measured (no smoke of this data path)"
    overlapped: bool = True
    """True when the loader reads ahead while the step computes (the rank's batch loader or workers):
    the step is the slowest of storage, loader CPU and compute. False: they add up."""
    overlap_note: str = ""
    stage_attempts: float = 1
    """Stage-ins the run pays: 1, or the expected attempts when every attempt copies again (``stage_attempts``)."""
    stage_attempts_text: str = ""
    """The per-attempt line (bytes ÷ rate × expected attempts); empty when the copy is made once."""

    @property
    def wall_s(self) -> float:
        """One job's wall clock: the work and its own stage-in (what a time limit must hold)."""
        return self.train_s + self.stage_s

    def terms(self) -> dict[str, float | None]:
        """The three terms of a step, in seconds (None: not measured)."""
        return {"storage": self.data_s, "loader CPU": self.loader_s, "compute": self.compute_s}

    @property
    def bound(self) -> str:
        """The term that sets the step time (the largest measured or estimated one)."""
        known = {name: value for name, value in self.terms().items() if value is not None}
        return max(known, key=lambda name: known[name])

    def step_formula(self) -> str:
        """``max(storage 21.1 s, loader CPU 0.9 s, compute 32.0 s) + 0 s not overlapped = 32.0 s/step, bound by compute``."""
        shown = [f"{name} {fmt_seconds(value)}" if value is not None else f"{name} unmeasured"
                 for name, value in self.terms().items()]
        if self.overlapped:
            text = f"max({', '.join(shown)}) + 0 s not overlapped ({self.overlap_note})"
        else:
            text = f"{' + '.join(shown)} ({self.overlap_note})"
        return f"{text} = {fmt_seconds(self.step_s)}/step, bound by {self.bound}"

    def arithmetic(self) -> str:
        batch = f"eff. batch {self.effective_batch:,}"
        read = self.effective_batch // self.repeats
        if self.repeats > 1:
            batch = f"({batch} ÷ repeats {self.repeats} = {read:,} samples read)"
        if self.nodes > 1 and self.per_node:
            batch += f" ÷ {self.nodes} nodes = {read // self.nodes:,} samples/node"
        elif self.nodes > 1:
            batch += f" (all {self.nodes} nodes share the NAS)"
        text = (f"{self.sample_formula}; × {batch} = {format_bytes(self.step_bytes)}/step"
                f"{'/node' if self.per_node and self.nodes > 1 else ''} ")
        if self.cache is None:
            text += f"÷ {self.tier} {fmt_bandwidth(self.bandwidth)} = {fmt_seconds(self.data_s)}/step data"
        else:
            text += f"= {fmt_seconds(self.data_s)}/step data{'' if self.cache.reads_direct else ' in steady state'} ({cache_arithmetic(self.cache)})"
        text += f"; {self.loader_note}"
        if self.compute_s is not None:
            text += f"; compute {fmt_seconds(self.compute_s)} ({self.compute_note})"
        else:
            text += f"; {self.provenance.label}"
        text += f"; step = {self.step_formula()}"
        if self.cache is not None and self.cache.served_warmup_s:
            text += (f"; × {self.steps:,} steps + cold first pass {fmt_span(self.cache.served_warmup_s)} = "
                     f"{fmt_span(self.train_s)}")
        else:
            text += f"; × {self.steps:,} steps = {fmt_span(self.train_s)}"
        if self.stage_s:
            text += f" + stage-in {fmt_span(self.stage_s)} = {fmt_span(self.wall_s)}"
        if self.stage_attempts_text:
            text += f"; {self.stage_attempts_text}"
        return text


def step_estimate(ctx: PreflightContext) -> StepEstimate:
    spec, profile = ctx.spec, ctx.profile
    io = sample_io(spec.data, spec.loader.mmap)
    nodes = spec.resources.nodes
    read = spec.samples_read_per_step  # effective batch ÷ loader.repeats
    if spec.stage.enabled:
        # Each node reads its ranks' share (effective batch ÷ nodes; the schema makes it divide) from its own NVMe.
        tier, bandwidth, per_node = "NVMe (staged)", profile.storage.nvme_read_bps, True
        step_bytes = io.bytes * (read // nodes)
        cache = figures(ctx, step_bytes, tier, bandwidth, direct_bps=profile.storage.direct_read_bps)
    else:
        tier, bandwidth, per_node = "NAS", profile.storage.nas_read_bps, False
        step_bytes = io.bytes * read
        # Each node's cache serves its own share; its misses share the NAS with the other nodes' misses.
        cache = figures(ctx, step_bytes // nodes, tier, bandwidth, miss_bps=bandwidth / nodes)
    data_s = step_bytes / bandwidth if cache is None else cache.served_data_s  # the path the job reads
    compute_s, note, provenance = _compute_seconds(ctx)
    loader_s, loader_note = _loader_seconds(ctx, step_bytes if per_node else step_bytes // nodes,
                                            direct=cache is not None and cache.reads_direct)
    overlapped, overlap_note = overlap(spec)
    terms = [data_s, loader_s or 0.0, compute_s or 0.0]
    step_s = max(terms) if overlapped else sum(terms)
    train_s = step_s * spec.train.steps + (cache.served_warmup_s if cache is not None else 0.0)
    stage = staging(ctx)
    attempts, attempts_text = stage_attempts(ctx, stage, train_s)
    return StepEstimate(io.bytes, io.formula, spec.train.effective_batch, spec.loader.repeats, step_bytes, tier,
                        bandwidth, data_s, compute_s, note, step_s, spec.train.steps, train_s, stage.seconds,
                        nodes, per_node, provenance, cache, loader_s, loader_note, overlapped, overlap_note,
                        attempts, attempts_text)


def overlap(spec: ExperimentSpec) -> tuple[bool, str]:
    """Whether the job's loader reads the next batches while the step computes, and why.

    ``num_workers 0`` over a registered dataset with exact ranges (``loader.mmap``) runs the trainer's
    batch loader (``cache.batches``: :data:`~cache.prefetch.PREFETCH_DEPTH` batches ahead on reader
    threads); workers prefetch in their own processes; a team's own class with ``num_workers 0``
    loads on the step's own thread. The H2D copy of a batch is inside the smoke's measured compute."""
    loader = spec.loader
    if loader.num_workers > 0:
        return True, f"{loader.num_workers} workers × prefetch {loader.effective_prefetch} read ahead"
    if isinstance(spec.data.dataset, str) and loader.mmap:
        return True, f"num_workers 0: the rank's batch loader reads {PREFETCH_DEPTH} batches ahead on threads"
    why = "a team's own dataset class" if not isinstance(spec.data.dataset, str) else "loader.mmap false"
    return False, f"not overlapped: num_workers 0 with {why} loads on the step's own thread"


def _loader_seconds(ctx: PreflightContext, node_bytes: int, direct: bool = False) -> tuple[float | None, str]:
    """The loader's CPU per step on one rank: its share of the node's bytes × the smoke's CPU s/GB on the
    read path the plan chose (page cache, or O_DIRECT) ÷ its CPUs (``resources.cpus`` ÷ ranks per node;
    the reader pool spreads ``preadv`` over threads)."""
    smoke = ctx.measurements.smoke
    per_gb = None if smoke is None or not smoke.ok else (
        smoke.loader_direct_cpu_s_per_gb if direct else smoke.loader_cpu_s_per_gb)
    path = "O_DIRECT" if direct else "page cache, cold"
    if smoke is None or per_gb is None:
        return None, f"loader CPU not measured (no smoke measured this data path's CPU s/GB, {path})"
    res = ctx.spec.resources
    ranks = res.ranks_per_node
    rank_bytes = node_bytes / ranks
    cpus = res.cpus / ranks
    seconds = rank_bytes / 1e9 * per_gb / cpus
    which = f", preflight run {smoke.preflight_run}" if smoke.preflight_run is not None else ""
    return seconds, (f"loader CPU {format_bytes(rank_bytes)}/rank × {per_gb:.3g} s/GB ({path}; measured: "
                     f"smoke on {smoke.device}{which}) ÷ {cpus:g} CPUs/rank (resources.cpus {res.cpus} ÷ {ranks} ranks) "
                     f"= {fmt_seconds(seconds)}")


def cache_arithmetic(cache: CacheFigures) -> str:
    """The page-cache model's arithmetic, every number behind the hit rate and the data time."""
    miss_rate = cache.miss_bps if cache.miss_bps is not None else cache.storage_bps
    shared = f" (its share of {fmt_bandwidth(cache.storage_bps)})" if cache.miss_bps is not None and cache.miss_bps != cache.storage_bps else ""
    text = (f"page cache per node, assuming {ASSUMPTIONS}: working set {cache.working_set_formula}; cache = "
            f"resources.mem {format_bytes(cache.mem_limit)} − resident {format_bytes(cache.resident.bytes)} "
            f"({cache.resident.formula}) = "
            f"{format_bytes(cache.cache)}; hit = min(1, {format_bytes(cache.cache)} ÷ {format_bytes(cache.working_set)}) "
            f"= {cache.hit:.0%}; {format_bytes(cache.step_bytes)} × {1 - cache.hit:.0%} misses ÷ {cache.storage_name} "
            f"{fmt_bandwidth(miss_rate)}{shared} + × {cache.hit:.0%} hits ÷ page cache {fmt_bandwidth(cache.memory_bps)} "
            f"= {fmt_seconds(cache.data_s)}/step (cold cache: {fmt_seconds(cache.cold_data_s)}/step); cold first pass: "
            f"{format_bytes(cache.warmup_bytes)} once from {cache.storage_name} instead of memory = "
            f"+{fmt_span(cache.warmup_s)}")
    verdict = uncached_verdict(cache)
    return f"{text}; {verdict}" if verdict else text


def uncached_verdict(cache: CacheFigures) -> str | None:
    """Where the working set dwarfs the cache: would reading around it (O_DIRECT) serve better? From the
    profile's measured O_DIRECT rate, or a line saying it is not measured."""
    if cache.working_set <= FAR_LARGER * cache.cache:
        return None
    ratio = f"working set {cache.working_set / max(cache.cache, 1):.1f}× the cache"
    direct = cache.direct_data_s
    if direct is None:
        return (f"{ratio}: whether reading around the page cache (O_DIRECT) would serve better is not measured "
                "here (storage.direct_read; `python -m bench.page_cache` on a node measures it)")
    better = ("the job reads around the page cache (O_DIRECT): the step's data time"
              if cache.reads_direct else "keep the page cache: O_DIRECT would be slower")
    return (f"{ratio}: O_DIRECT {format_bytes(cache.step_bytes)} ÷ {fmt_bandwidth(cache.direct_bps or 0.0)} "
            f"(measured) = {fmt_seconds(direct)}/step vs {fmt_seconds(cache.data_s)} cached: {better}")


def _compute_seconds(ctx: PreflightContext) -> tuple[float | None, str, Provenance]:
    """The smoke's s/step scaled from its batch to the samples one rank computes per optimizer step.

    Only used when the smoke ran on the same kind of device the job gets: CPU timings say nothing
    about an 8-GPU job, so without a smoke on the job's kind the step time is the data time alone.
    """
    job = DeviceKind.of_job(ctx.spec.resources.gpus_per_node)
    smoke = ctx.measurements.smoke
    if smoke is None or not smoke.ok or smoke.step_s is None:
        return None, "no smoke timing", compute_unmeasured(job)
    ran_on = DeviceKind.of(smoke.device)
    if ran_on is not job:
        return None, f"smoke ran on {smoke.device}, the job on {job.label}", compute_unmeasured(job)
    per_rank = ctx.spec.loader.batch_size * ctx.spec.grad_accum
    scaled = smoke.step_s * per_rank / smoke.batch_size
    note = f"smoke {smoke.step_s:.3f} s at batch {smoke.batch_size} × {per_rank}/{smoke.batch_size} samples per rank"
    which = f", preflight run {smoke.preflight_run}" if smoke.preflight_run is not None else ""
    return scaled, note, Provenance(Basis.MEASURED, f"smoke on {smoke.device} at batch {smoke.batch_size}{which}", ran_on)

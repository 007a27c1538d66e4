"""The arithmetic io, qos and disk share: bytes staged, bytes read per step, seconds per step.

One place computes them so the three checks can never disagree about the same run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ground.geometry import HiddenGeometry, sample_io
from idmctl.preflight.result import PreflightContext
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
    """What stage-in copies to node-local disk, and how long the copy takes at NAS bandwidth."""

    enabled: bool
    bytes: int
    formula: str
    measured: bool
    """True when ``bytes`` is the cache's measured size on this machine, False when estimated."""
    seconds: float
    cache_root: str


def staging(ctx: PreflightContext) -> Staging:
    data, stage = ctx.spec.data, ctx.spec.stage
    nas = ctx.profile.storage.nas_read_bps
    measured = ctx.measurements
    if measured.cache_present and measured.cache_bytes is not None:
        count = measured.cache_file_count
        size = measured.cache_bytes
        formula = f"{format_bytes(size)} measured under {data.cache_root} ({count:,} files)"
        is_measured = True
    else:
        file_bytes = HiddenGeometry.from_spec(data).file_bytes
        files = data.cache_files or 0
        size = files * file_bytes
        formula = (f"{files:,} files × {file_bytes:,} B = {size:,} B ({format_bytes(size)}, "
                   f"{format_bytes(size, binary=True)}; estimated from data.cache_files, the cache is not on this machine)")
        is_measured = False
    seconds = size / nas if stage.enabled else 0.0
    return Staging(stage.enabled, size, formula, is_measured, seconds, data.cache_root)


@dataclass(frozen=True)
class StepEstimate:
    """Seconds per optimizer step: data read time (+ compute when the smoke measured it)."""

    sample_bytes: int
    sample_formula: str
    effective_batch: int
    repeats: int
    """``loader.repeats``: each sample read serves K rows, so a step reads effective_batch / K samples."""
    step_bytes: int
    tier: str
    bandwidth: float
    data_s: float
    compute_s: float | None
    compute_note: str
    step_s: float
    steps: int
    train_s: float
    stage_s: float

    @property
    def wall_s(self) -> float:
        return self.train_s + self.stage_s

    def arithmetic(self) -> str:
        batch = f"eff. batch {self.effective_batch:,}"
        if self.repeats > 1:
            batch = f"({batch} ÷ repeats {self.repeats} = {self.effective_batch // self.repeats:,} samples read)"
        text = (f"{self.sample_formula}; × {batch} = {format_bytes(self.step_bytes)}/step "
                f"÷ {self.tier} {fmt_bandwidth(self.bandwidth)} = {fmt_seconds(self.data_s)}/step data")
        if self.compute_s is not None:
            text += f" + {fmt_seconds(self.compute_s)} compute ({self.compute_note}) = {fmt_seconds(self.step_s)}/step"
        text += f"; × {self.steps:,} steps = {fmt_span(self.train_s)}"
        if self.stage_s:
            text += f" + stage-in {fmt_span(self.stage_s)} = {fmt_span(self.wall_s)}"
        return text


def step_estimate(ctx: PreflightContext) -> StepEstimate:
    spec, profile = ctx.spec, ctx.profile
    io = sample_io(spec.data, spec.loader.mmap)
    step_bytes = io.bytes * spec.samples_read_per_step
    if spec.stage.enabled:
        tier, bandwidth = "NVMe (staged)", profile.storage.nvme_read_bps
    else:
        tier, bandwidth = "NAS", profile.storage.nas_read_bps
    data_s = step_bytes / bandwidth
    compute_s, note = _compute_seconds(ctx)
    step_s = data_s + (compute_s or 0.0)
    train_s = step_s * spec.train.steps
    return StepEstimate(io.bytes, io.formula, spec.train.effective_batch, spec.loader.repeats, step_bytes, tier, bandwidth, data_s,
                        compute_s, note, step_s, spec.train.steps, train_s, staging(ctx).seconds)


def _compute_seconds(ctx: PreflightContext) -> tuple[float | None, str]:
    """The smoke's s/step scaled from its batch to the samples one rank computes per optimizer step.

    Only used when the smoke ran on the same kind of device the job gets: CPU timings say nothing
    about an 8-GPU job.
    """
    smoke = ctx.measurements.smoke
    if smoke is None or not smoke.ok or smoke.step_s is None:
        return None, "no smoke timing"
    job_on_gpu = ctx.spec.resources.gpus_per_node > 0
    smoke_on_gpu = smoke.device.startswith("cuda")
    if job_on_gpu != smoke_on_gpu:
        return None, f"smoke ran on {smoke.device}, the job on {'GPU' if job_on_gpu else 'CPU'}"
    per_rank = ctx.spec.loader.batch_size * ctx.spec.grad_accum
    scaled = smoke.step_s * per_rank / smoke.batch_size
    return scaled, f"smoke {smoke.step_s:.3f} s at batch {smoke.batch_size} × {per_rank}/{smoke.batch_size} samples per rank"

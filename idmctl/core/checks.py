"""What a check receives and what it returns.

A check is a function ``(PreflightContext) -> CheckResult``: the spec, the cluster profile and the
measurements the runner gathered on this machine (``/dev/shm`` free space, the cache on disk, the
job history, the smoke's timings). Checks do no I/O of their own except introspection, whose whole
point is importing the trainer's code, so tests can feed any measurement they want.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from idmctl.core.profile import ClusterProfile
from ground.spec.loader import ResolvedSpec
from ground.spec.schema import ExperimentSpec

CHECK_NAMES = ("spec", "introspection", "loader", "shm", "io", "qos", "disk", "cache", "smoke")
"""Stable names: failure postmortems map each cause to the check that catches it."""


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    """Does not block submit; read it."""
    FAIL = "FAIL"
    """Blocks submit."""
    SKIP = "SKIP"
    """Not run (``--no-smoke``, or an earlier check already proved the run cannot start)."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    summary: str
    """The verdict with the numbers and the arithmetic behind them."""
    numbers: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    """What to change when the status is not PASS."""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "summary": self.summary,
                "numbers": self.numbers, "fix": self.fix}


@dataclass(frozen=True)
class QueueWait:
    """How long one recorded job waited in the queue (start − submit, or cancel − submit)."""

    scheduler_id: str
    qos: str
    gpus: int
    seconds: float
    state: str
    cancelled_while_pending: bool = False


@dataclass(frozen=True)
class CacheInspection:
    """What the cache check found on disk for one split (filled by the runner)."""

    split: str
    episodes: int
    """Episodes listed in the split's mask."""
    missing: list[str] = field(default_factory=list)
    """Episode keys with no cache file."""
    mismatched: list[str] = field(default_factory=list)
    """``key: what differs`` for files whose shape or dtype disagree with the spec."""
    error: str | None = None
    """Set when the inspection itself could not run (no episodes file, unreadable mask...)."""


@dataclass(frozen=True)
class SmokeMeasurement:
    """The smoke subprocess's report (``trainers.smoke`` JSON) or why it did not produce one."""

    ok: bool
    losses: list[float] = field(default_factory=list)
    device: str = "cpu"
    batch_size: int = 2
    dataset_s: float | None = None
    sample_s: float | None = None
    model_s: float | None = None
    step_s: float | None = None
    """Median seconds per optimizer step at ``batch_size`` on ``device``."""
    peak_mem_bytes: int | None = None
    params: int | None = None
    error: str | None = None
    """Last traceback frame + exception, or the timeout, when ``ok`` is False."""
    wall_s: float = 0.0
    checkpoint_s: float | None = None
    """Seconds to write the model + optimizer state once, as the trainer's checkpoint holds them."""
    checkpoint_bytes: int | None = None
    loader_cpu_s_per_gb: float | None = None
    """The loader's CPU seconds (every thread) per GB of hidden states it read on the job's own data
    path through the page cache, from an empty cache (``trainers.smoke.measure_loader_cpu``); the plan's
    loader term. None: not measured."""
    loader_direct_cpu_s_per_gb: float | None = None
    """The same with O_DIRECT: the loader term where the plan reads around the page cache. None: not
    measured, or the ranges are not aligned for it."""
    entry: str | None = None
    """The job's own entry whose reports these are (None: idmctl's trainer, through ``trainers.smoke``)."""
    preflight_run: int | None = None
    """The recorded preflight run this smoke was read back from (None: this preflight's own smoke)."""
    where: str | None = None
    """Where it ran when not on this host: ``Slurm job 812 on gpu-07 (partition debug)`` (``--smoke-on cluster``)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RecordedRun:
    """An earlier run's measured step time, from its run directory's ``progress.json``."""

    run: str
    """``<experiment>/<chain>``."""
    code_version: str
    timing_key: str
    s_per_step: float
    checkpoint_write_s: float | None = None


@dataclass(frozen=True)
class Measurements:
    """Facts about this machine and the store, gathered once by the runner."""

    shm_free_bytes: int | None = None
    """``os.statvfs('/dev/shm')`` free bytes, used instead of the profile on local profiles."""
    scratch_free_bytes: int | None = None
    """Free bytes under ``stage.dest`` (nearest existing parent) on local profiles."""
    runs_free_bytes: int | None = None
    """Free bytes of the file system under ``$IDMCTL_HOME/runs`` (where run directories and their checkpoints live)."""
    cache_present: bool = False
    """``data.cache_root`` exists on this machine."""
    cache_bytes: int | None = None
    """Measured size of the cache directory (what stage-in copies), when present."""
    cache_file_count: int | None = None
    staged_copy: dict[str, Any] | None = None
    """The finished copy at ``stage.dest`` on this machine (``ground.stage.staged_here``: its source,
    layers, model, and whether its files are the cache's now), on local profiles only (a cluster node's
    disk cannot be seen from here); None when there is none or nobody looked. ``budget.staging`` judges
    each spec (what-ifs too) against it."""
    cache_inspections: list[CacheInspection] = field(default_factory=list)
    queue_waits: list[QueueWait] = field(default_factory=list)
    """Recorded jobs with the same QoS and GPU count (and others with the same GPU count)."""
    smoke: SmokeMeasurement | None = None
    cache_inspected: bool = True
    """False when gathering skipped the cache inspection (``memo_only`` and nothing remembered)."""
    recorded_runs: list[RecordedRun] = field(default_factory=list)
    """Step times earlier runs measured (``idmctl.plan.limits`` derives the time limit from them)."""
    private_tmp: str | None = None
    """The plugin that makes /tmp private to each job on the profile's cluster (``job_container/tmpfs``,
    ``namespace/linux``: ``cluster_settings.private_tmp``); None where /tmp is the node's or not read. A
    copy staged under /tmp there is gone when the job ends: ``budget.staging`` counts it every attempt."""


@dataclass(frozen=True)
class PreflightContext:
    resolved: ResolvedSpec
    profile: ClusterProfile
    measurements: Measurements = field(default_factory=Measurements)

    @property
    def spec(self) -> ExperimentSpec:
        return self.resolved.spec

    @property
    def is_this_machine(self) -> bool:
        """The profile describes the machine preflight runs on (measure instead of trusting it): the local
        executor, or the project's local Slurm (``local-slurm``), whose nodes are this host."""
        return self.profile.scheduler == "local" or self.profile.name.startswith("local")

"""Gather measurements, run every check in order, record the result.

Order of work: spec and introspection first (cheap, and if either FAILs the smoke would only crash
the same way, so it is skipped), then the smoke, then the budget checks, which use the smoke's
compute time when it ran on the job's kind of device.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ground.paths import expand_path
from idmctl.preflight import cache, disk, introspection, io, loader, qos, shm, smoke, spec, whatif
from idmctl.preflight.result import (CHECK_NAMES, CheckResult, Measurements, PreflightContext, QueueWait,
                                     RecordedRun, SmokeMeasurement, Status)
from idmctl.profile import ClusterProfile
from ground.spec.loader import ResolvedSpec

STATIC_CHECKS = (spec, introspection, loader, shm, io, qos, disk, cache)


@dataclass(frozen=True)
class PreflightReport:
    experiment: str
    spec_hash: str
    code_version: str
    profile_name: str
    profile_hash: str
    with_smoke: bool
    results: list[CheckResult]
    seconds: float
    run_id: int | None = None

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if r.status is Status.FAIL]

    @property
    def unlocks_submit(self) -> bool:
        return not self.failed and self.with_smoke

    def as_dict(self) -> dict[str, object]:
        return {"experiment": self.experiment, "spec_hash": self.spec_hash, "code_version": self.code_version,
                "cluster": self.profile_name, "profile_hash": self.profile_hash, "with_smoke": self.with_smoke,
                "passed": not self.failed, "unlocks_submit": self.unlocks_submit, "failed": self.failed,
                "run_id": self.run_id, "seconds": round(self.seconds, 3),
                "checks": [r.as_dict() for r in self.results]}


def _free_bytes(path: Path) -> int | None:
    """Free bytes of the filesystem holding ``path`` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        stats = os.statvfs(probe)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def _du(root: Path) -> tuple[int, int]:
    total = files = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                total += os.stat(os.path.join(directory, name)).st_size
                files += 1
            except OSError:
                continue
    return total, files


def queue_history(gpus: int) -> list[QueueWait]:
    """Recorded queue waits of jobs with this GPU count (all QoS tiers, so qos can suggest another).

    Wait = started_at − submitted_at; a job cancelled while pending (card job 5961) counts with
    ended_at − submitted_at, a lower bound on what it would have waited.
    """
    from sqlmodel import select

    from idmctl.store import session
    from idmctl.store.models import Job

    waits: list[QueueWait] = []
    with session() as db:
        rows = db.exec(select(Job).where(Job.gpus == gpus, Job.submitted_at != None)).all()  # noqa: E711
    for job in rows:
        if job.started_at is not None:
            seconds, pending_cancel = (job.started_at - job.submitted_at).total_seconds(), False
        elif job.state.startswith("CANCELLED") and job.ended_at is not None:
            seconds, pending_cancel = (job.ended_at - job.submitted_at).total_seconds(), True
        else:
            continue
        waits.append(QueueWait(job.scheduler_id or f"#{job.id}", job.qos or "?", gpus, max(seconds, 0.0),
                               job.state, pending_cancel))
    return waits


def gather(resolved: ResolvedSpec, profile: ClusterProfile) -> Measurements:
    """Everything static checks need from this machine and the store (no smoke)."""
    data = resolved.spec.data
    root = expand_path(data.cache_root)
    present = root.is_dir()
    cache_bytes = file_count = None
    inspections = []
    if present:
        cache_bytes, file_count = _du(root)
        splits = dict.fromkeys((data.train_split, data.eval_split))
        inspections = [cache.inspect_split(resolved.spec, split) for split in splits]
    res = resolved.spec.resources
    return Measurements(
        shm_free_bytes=_free_bytes(Path("/dev/shm")),
        scratch_free_bytes=_free_bytes(expand_path(resolved.spec.stage.dest)),
        cache_present=present, cache_bytes=cache_bytes, cache_file_count=file_count,
        cache_inspections=inspections, queue_waits=queue_history(res.gpus_per_node * res.nodes),
        recorded_runs=recorded_runs(),
    )


def recorded_runs() -> list[RecordedRun]:
    from ground.paths import home
    from idmctl.preflight.limits import recorded_runs as scan

    return scan(home() / "runs")


def _safe(check_module: object, ctx: PreflightContext) -> CheckResult:
    """A crashing check is a FAIL with its error, never a traceback that hides the other rows.
    A FAIL or WARN comes with its fixes recomputed by the same check on the altered spec (whatif)."""
    name = getattr(check_module, "NAME")
    try:
        return whatif.with_fixes(ctx, check_module, check_module.check(ctx))  # type: ignore[attr-defined]
    except Exception as exc:
        return CheckResult(name, Status.FAIL, f"check crashed: {type(exc).__name__}: {exc}", {},
                           "report this as an idmctl bug")


def run_preflight(resolved: ResolvedSpec, profile: ClusterProfile, profile_hash: str, *, with_smoke: bool = True,
                  smoke_timeout_s: float = smoke.DEFAULT_TIMEOUT_S, record: bool = True,
                  measurements: Measurements | None = None) -> PreflightReport:
    """Run all checks; ``measurements`` replaces gathering (tests, benchmarks)."""
    from idmctl.preflight.record import code_version, record_run

    started = time.perf_counter()
    version = code_version()
    measured = measurements if measurements is not None else gather(resolved, profile)
    # Step times of earlier runs count only when they ran this very code (limits.derive).
    measured = replace(measured, recorded_runs=[r for r in measured.recorded_runs if r.code_version == version])
    ctx = PreflightContext(resolved, profile, measured)
    early = {module.NAME: _safe(module, ctx) for module in (spec, introspection)}
    smoke_result: SmokeMeasurement | None = None
    smoke_not_run: CheckResult | None = None
    if with_smoke:
        blocking = [name for name, result in early.items() if result.status is Status.FAIL]
        if blocking:
            smoke_not_run = CheckResult(smoke.NAME, Status.SKIP, f"not run: {', '.join(blocking)} FAILed, the trainer would "
                                  "crash the same way", {}, "fix the failing checks above")
        else:
            smoke_result = smoke.run_smoke(resolved, smoke_timeout_s)
    ctx = PreflightContext(resolved, profile, replace(measured, smoke=smoke_result))
    results = {**early, **{module.NAME: _safe(module, ctx) for module in STATIC_CHECKS if module.NAME not in early}}
    results[smoke.NAME] = smoke_not_run or _safe(smoke, ctx)
    ordered = [results[name] for name in CHECK_NAMES]
    seconds = time.perf_counter() - started
    report = PreflightReport(resolved.name, resolved.hash, version, profile.name, profile_hash, with_smoke,
                             ordered, seconds)
    if not record:
        return report
    run = record_run(resolved, profile.name, profile_hash, version, ordered, with_smoke, seconds)
    return replace(report, run_id=run.id)

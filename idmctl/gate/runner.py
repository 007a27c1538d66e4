"""Gather measurements, run every check in order, record the result.

Order of work: spec and introspection first (cheap, and if either FAILs the smoke would only crash
the same way, so it is skipped), then the smoke, then the budget checks, which use the smoke's
compute time when it ran on the job's kind of device.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.paths import expand_path, free_bytes, runs_root
from idmctl.core.job_state import JobState
from idmctl.gate import cache, cluster_smoke, introspection, smoke, spec
from idmctl.gate.blame import name_flags
from idmctl.gate.cluster_settings import private_tmp
from idmctl.gate.check_list import STATIC_CHECKS, run_check
from idmctl.record import memo
from idmctl.record.jobs import submitted_with_gpus
from idmctl.core.checks import (CHECK_NAMES, CacheInspection, CheckResult, Measurements, PreflightContext,
                                     QueueWait, RecordedRun, SmokeMeasurement, Status)
from idmctl.core.profile import ClusterProfile
from ground.spec.loader import ResolvedSpec
from ground.stage import staged_here
from idmctl.gate import background
from idmctl.plan.limits import recorded_runs as scan
from idmctl.record.preflights import record_run, version_for

if TYPE_CHECKING:
    from idmctl.job.effective import EffectiveJob
    from idmctl.gate.background import Forked

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
    smoke_flags: dict[str, str] = field(default_factory=dict)
    """Flags that changed what the smoke measured (part of the gate's key): ``--gres``, ``--entry``."""

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
                "run_id": self.run_id, "seconds": round(self.seconds, 3), "smoke_flags": self.smoke_flags,
                "checks": [r.as_dict() for r in self.results]}




def queue_history(gpus: int) -> list[QueueWait]:
    """Recorded queue waits of jobs with this GPU count (all QoS tiers, so qos can suggest another).

    Wait = started_at − submitted_at; a job cancelled while pending (card job 5961) counts with
    ended_at − submitted_at, a lower bound on what it would have waited.
    """
    return _waits(submitted_with_gpus(gpus), gpus)


def _waits(rows: list, gpus: int) -> list[QueueWait]:
    waits: list[QueueWait] = []
    for job in rows:
        if job.started_at is not None:
            seconds, pending_cancel = (job.started_at - job.submitted_at).total_seconds(), False
        elif JobState.of(job.state) is JobState.CANCELLED and job.ended_at is not None:
            seconds, pending_cancel = (job.ended_at - job.submitted_at).total_seconds(), True
        else:
            continue
        waits.append(QueueWait(job.scheduler_id or f"#{job.id}", job.qos or "?", gpus, max(seconds, 0.0),
                               job.state, pending_cancel))
    return waits


def _inspections(resolved: ResolvedSpec, tree_digest: str, code_version: str | None,
                 memo_only: bool = False) -> list[CacheInspection] | None:
    """Every split's cache inspection, remembered per (code, data section, files): see ``memo``.
    ``memo_only``: None instead of inspecting (which imports torch) when nothing is remembered."""
    data = resolved.spec.data
    key = memo.cache_key(resolved, code_version, tree_digest, expand_path(data.episodes)) if code_version else None
    stored = memo.load("cache", key)
    if isinstance(stored, list):  # what `memo.store` wrote below; anything else is inspected anew
        return [CacheInspection(**found) for found in stored]
    if memo_only:
        return None
    splits = dict.fromkeys((data.train_split, data.eval_split))
    found = [cache.inspect_split(resolved.spec, split) for split in splits]
    memo.store("cache", key, [asdict(f) for f in found])
    return found


NOT_RERUN = ("not re-run: nothing remembered for this code version, and without a passing preflight of it submit "
             "refuses anyway; the preflight it asks for runs this check")


def _remembered_introspection(resolved: ResolvedSpec, code_version: str | None) -> CheckResult | None:
    key = memo.introspection_key(resolved, code_version) if code_version else None
    stored = memo.load("introspection", key)
    if not isinstance(stored, dict):  # nothing remembered (or not what was written): run it
        return None
    return CheckResult(stored["name"], Status(stored["status"]), stored["summary"], stored["numbers"], stored["fix"])


def start_introspection(resolved: ResolvedSpec, profile: ClusterProfile,
                        code_version: str | None) -> Forked | None:
    """Start the introspection (its torch import) in a forked child when nothing is remembered, so it
    overlaps the store and the other checks; :func:`introspect` collects it."""
    if _remembered_introspection(resolved, code_version) is not None:
        return None
    from idmctl.gate import background  # here: submit (memo or SKIP) never needs it

    ctx = PreflightContext(resolved, profile)  # introspection reads the spec only, no measurements
    return background.start(lambda: run_check(introspection, ctx))


def introspect(ctx: PreflightContext, code_version: str | None, memo_only: bool = False,
               started: Forked | None = None) -> CheckResult:
    """The introspection check, remembered per (code version, spec without resources): see ``memo``.
    ``memo_only``: SKIP instead of importing the trainer's registries (torch) when nothing is remembered.
    ``started``: the child :func:`start_introspection` forked for this very spec; its result is used."""
    key = memo.introspection_key(ctx.resolved, code_version) if code_version else None
    stored = _remembered_introspection(ctx.resolved, code_version)
    if stored is not None:
        return stored
    if memo_only:
        return CheckResult(introspection.NAME, Status.SKIP, NOT_RERUN, {}, "")

    result = background.collect(started, lambda: run_check(introspection, ctx))
    # Environment trouble (a crash, a missing import, the box's deadline on a loaded host): try again next time.
    box = result.numbers.get("box") if isinstance(result.numbers, dict) else None
    if not result.summary.startswith(("check crashed", "cannot import")) and not (isinstance(box, dict) and box.get("timed_out")):
        memo.store("introspection", key, result.as_dict())
    return result


def gather(resolved: ResolvedSpec, profile: ClusterProfile, code_version: str | None = None,
           memo_only: bool = False) -> Measurements:
    """Everything static checks need from this machine and the store (no smoke). With the code version,
    cache inspections are remembered until a cache file, the episodes file, the data section or the code
    changes."""
    data = resolved.spec.data
    root = expand_path(data.cache_root)
    present = root.is_dir()
    cache_bytes = file_count = None
    inspections: list[CacheInspection] | None = []
    if present:
        cache_bytes, file_count, tree_digest = memo.tree_fingerprint(root)
        inspections = _inspections(resolved, tree_digest, code_version, memo_only)
    res = resolved.spec.resources
    return Measurements(
        shm_free_bytes=free_bytes(Path("/dev/shm")),
        scratch_free_bytes=free_bytes(expand_path(resolved.spec.stage.dest)),
        runs_free_bytes=free_bytes(runs_root(profile.runs_root)),
        cache_present=present, cache_bytes=cache_bytes, cache_file_count=file_count,
        staged_copy=staged_copy(resolved, profile) if present else None,
        cache_inspections=inspections or [], queue_waits=queue_history(res.gpus_per_node * res.nodes),
        cache_inspected=inspections is not None, recorded_runs=recorded_runs(profile),
        private_tmp=private_tmp(profile.slurm_cluster) if resolved.spec.stage.enabled else None,
    )


def staged_copy(resolved: ResolvedSpec, profile: ClusterProfile) -> dict[str, Any] | None:
    """``ground.stage.staged_here`` at this spec's ``stage.dest``, on profiles whose nodes are this
    machine; None elsewhere (and without stage-in)."""

    spec = resolved.spec
    if not spec.stage.enabled or not PreflightContext(resolved, profile).is_this_machine:
        return None
    return staged_here(expand_path(spec.data.cache_root), expand_path(spec.stage.dest))


def recorded_runs(profile: ClusterProfile | None = None) -> list[RecordedRun]:
    """Earlier runs under the profile's run directories (``ground.paths.runs_root``)."""
    return scan(runs_root(profile.runs_root if profile is not None else None))


def run_preflight(resolved: ResolvedSpec, profile: ClusterProfile, profile_hash: str, *, with_smoke: bool = True,
                  smoke_timeout_s: float = smoke.DEFAULT_TIMEOUT_S, record: bool = True,
                  measurements: Measurements | None = None, job: "EffectiveJob | None" = None,
                  version: str | None = None, introspect_aside: bool = False,
                  smoke_on_cluster: bool = False) -> PreflightReport:
    """Run all checks; ``measurements`` replaces gathering (tests, benchmarks); ``version`` is the code
    version when the caller already has it (a sweep computes it once for all variants: two git calls).

    ``introspect_aside``: a cold introspection runs in a forked child (see ``background``), for a
    process that runs one preflight (``idmctl preflight EXP``). A process that runs several (a sweep,
    a what-if) leaves it False: the first in-process import of torch then serves them all, where each
    child would import it again.

    With ``job`` (preflight given submit's flags) the checks and the smoke judge the effective job,
    and the run is recorded under the spec's own hash with the job's smoke flags in its key.

    ``smoke_on_cluster``: the smoke runs as a short job on the profile's ``smoke_job`` (its GPUs), waited for
    at most ``smoke_timeout_s`` with the queue (``cluster_smoke``), instead of on this host.
    """

    started = time.perf_counter()
    declared = resolved
    if job is not None:
        declared, resolved = job.declared, job.resolved
    version = version or version_for(declared.spec)
    # Aside and cold (nothing remembered): the torch import runs in a child on the other core while this
    # process gathers (on a new home: creates the store) and runs the checks that need no torch.
    started_introspection = start_introspection(resolved, profile, version) if introspect_aside else None
    try:
        measured = measurements if measurements is not None else gather(resolved, profile, version)
        # Step times of earlier runs count only when they ran this very code (limits.derive).
        measured = replace(measured, recorded_runs=[r for r in measured.recorded_runs if r.code_version == version])
        ctx = PreflightContext(resolved, profile, measured)
        spec_result = run_check(spec, ctx)
        # Without a smoke the other static checks do not wait on introspection: run them before collecting
        # it. (They see the same context as below: no smoke measurement.)
        unsmoked = PreflightContext(resolved, profile, replace(measured, smoke=None))
        static_early = {} if with_smoke else {module.NAME: run_check(module, unsmoked) for module in STATIC_CHECKS
                                              if module.NAME not in (spec.NAME, introspection.NAME)}
        early = {spec.NAME: spec_result, introspection.NAME: introspect(ctx, version, started=started_introspection)}
    finally:
        if started_introspection is not None:

            background.cancel(started_introspection)  # a no-op once collected; else (an error above) no orphan child
    smoke_result: SmokeMeasurement | None = None
    smoke_not_run: CheckResult | None = None
    if with_smoke:
        blocking = [name for name, result in early.items() if result.status is Status.FAIL]
        if blocking:
            smoke_not_run = CheckResult(smoke.NAME, Status.SKIP, f"not run: {', '.join(blocking)} FAILed, the trainer would "
                                  "crash the same way", {}, "fix the failing checks above")
        else:
            entry = job.options.entry if job is not None else (resolved.spec.code.entry or smoke.DEFAULT_ENTRY)
            smoke_result = (cluster_smoke.smoke_on_cluster(resolved, profile, smoke_timeout_s, entry=entry)
                            if smoke_on_cluster else smoke.run_smoke(resolved, smoke_timeout_s, entry=entry))
    ctx = PreflightContext(resolved, profile, replace(measured, smoke=smoke_result))
    results = {**early, **static_early, **{module.NAME: run_check(module, ctx) for module in STATIC_CHECKS
                                           if module.NAME not in early and module.NAME not in static_early}}
    results[smoke.NAME] = smoke_not_run or run_check(smoke, ctx)
    ordered = [results[name] for name in CHECK_NAMES]
    if job is not None and job.changed_flags:
        ordered = name_flags(job, ordered, ctx.measurements)
    seconds = time.perf_counter() - started
    smoke_flags = job.smoke_flags if job is not None else {}
    report = PreflightReport(declared.name, declared.hash, version, profile.name, profile_hash, with_smoke,
                             ordered, seconds, smoke_flags=smoke_flags)
    if not record:
        return report
    run = record_run(declared, profile.name, profile_hash, version, ordered, with_smoke, seconds,
                     job=job.record() if job is not None else None)
    return replace(report, run_id=run.id)

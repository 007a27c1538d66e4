"""The build preflight: ``idmctl preflight EXP --build hidden|rgb|pt|ff``, and the same checks at submit.

A cache build fails the way training does, hours in: the output disk fills (ENOSPC), the weights are
not where the spec says, FF runs before PT wrote its norm file, or the build needs more wall-clock
than the time limit gives. Each is a check with its numbers:

- ``build_weights``: the VAE weights the build loads are on this machine (``tiny`` needs none);
- ``build_norm``: an FF build with point maps finds the PT norm file (card B: FF after PT);
- ``build_disk``: files still to build × bytes per file (the smoke's file) vs free space where they go;
- ``build_smoke``: one file encoded into a scratch dir (``python -m trainers.build_job --smoke``):
  load seconds, encode seconds per file and peak RSS → wall-clock estimate
  ``load + ⌈todo ÷ processes⌉ × encode`` vs the time limit, and peak RSS × processes vs ``--mem``.

The run is recorded like any preflight, its key carrying ``--build MODE`` (a smoke flag): submit with
``--build`` finds exactly it. At submit the static checks run again on the effective job and the stored
smoke is re-judged against its ``--time``/``--mem``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.contract import SPEC_FILE
from ground.errors import UserError
from ground.paths import REPO_ROOT, atomic_write_text
from ground.provenance import Basis, DeviceKind, Provenance
from ground.units import format_bytes, format_duration
from idmctl.core.checks import CheckResult, Status
from cache.build_plan import norm_problem
from cache.build_plan import plan
from cache.build_plan import weights_problem
from ground.paths import free_bytes
from idmctl.gate.tracebacks import last_frame_and_exception
from idmctl.record.preflights import record_run, version_for

if TYPE_CHECKING:
    from cache.build_plan import BuildPlan
    from idmctl.core.job_options import JobOptions
    from idmctl.job.effective import EffectiveJob
    from idmctl.gate.admission import Admission, StoredPreflight
    from idmctl.gate.runner import PreflightReport

BUILD_CHECK_NAMES = ("build_weights", "build_norm", "build_disk", "build_smoke")
SMOKE_NAME = "build_smoke"
DEFAULT_TIMEOUT_S = 300.0
ESTIMATE_WARN = 0.8
"""WARN when the estimate takes more than this share of the time limit (the machine may be busier)."""


@dataclass(frozen=True)
class BuildSmoke:
    """``trainers.build_job --smoke``'s report, or why there is none."""

    ok: bool
    load_s: float = 0.0
    encode_s: float = 0.0
    """Seconds to encode and write one file (one process)."""
    bytes_per_file: int = 0
    peak_rss_bytes: int = 0
    norm_s_per_demo: float | None = None
    """PT without a norm file: the statistics pass on one demo (the build runs it over ``norm_demos``)."""
    norm_demos: float | None = None
    error: str | None = None
    wall_s: float = 0.0
    device: str = "cpu"
    """The device the encode ran on (the report's ``device``; a builder that reports none ran on the CPU)."""

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def run_smoke(job: "EffectiveJob", timeout_s: float = DEFAULT_TIMEOUT_S) -> BuildSmoke:

    started = time.perf_counter()
    resolved = job.resolved
    with tempfile.TemporaryDirectory(prefix="idmctl_build_smoke_") as tmp:
        spec_file = Path(tmp) / SPEC_FILE  # the run-directory form trainers.build_job reads
        atomic_write_text(spec_file, json.dumps({"name": resolved.name, "hash": resolved.hash, "spec": resolved.canonical}))
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        argv = [sys.executable, "-m", "trainers.build_job", "--smoke", "--spec-json", str(spec_file),
                "--mode", str(job.options.build)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT, env=env)
        except subprocess.TimeoutExpired:
            return BuildSmoke(ok=False, error=f"timed out after {timeout_s:.0f} s", wall_s=time.perf_counter() - started)
    wall = time.perf_counter() - started
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            report = json.loads(line)
            fields = BuildSmoke.__dataclass_fields__
            return BuildSmoke(**{k: v for k, v in report.items() if k in fields and k != "wall_s"}, wall_s=wall)
    return BuildSmoke(ok=False, error=f"exit {done.returncode}: {last_frame_and_exception(done.stderr or done.stdout)}",
                      wall_s=wall)


def _weights(job: "EffectiveJob") -> CheckResult:

    mode = str(job.options.build)
    problem = weights_problem(job.resolved, mode)
    if problem is not None:
        return CheckResult("build_weights", Status.FAIL, f"{problem.message} → the job would end {problem.cause}",
                           {"field": problem.field}, problem.fix)
    latent = job.resolved.spec.latent
    if mode == "hidden":
        models = job.resolved.spec.data.models
        where = ("tiny seeded Wan VAE + Cosmos (no weights to load)" if models == "tiny" else
                 f"Wan VAE + Cosmos weights in {models} (configs fit the cache: {job.resolved.spec.data.channels} "
                 f"channels, blocks {job.resolved.spec.data.cached_layers})")
        return CheckResult("build_weights", Status.PASS, where)
    assert latent is not None
    where = "tiny seeded config (no weights to load)" if latent.vae == "tiny" else f"weights in {latent.vae}"
    return CheckResult("build_weights", Status.PASS, f"AutoencoderKLWan: {where}")


def _norm(job: "EffectiveJob") -> CheckResult:

    mode = str(job.options.build)
    problem = norm_problem(job.resolved, mode)
    if problem is not None:
        return CheckResult("build_norm", Status.FAIL, f"{problem.message} → the job would end {problem.cause}",
                           {"field": problem.field}, problem.fix)
    if mode == "pt":
        return CheckResult("build_norm", Status.PASS, "PT computes its norm file when missing (rank 0)")
    if mode == "ff":
        return CheckResult("build_norm", Status.PASS, "the PT norm file exists (FF's directory is named by it)")
    return CheckResult("build_norm", Status.PASS, f"{mode} reads no PT norm file")


def _plan(job: "EffectiveJob") -> "BuildPlan":

    return plan(job.resolved, str(job.options.build))


def _disk(job: "EffectiveJob", plan: "BuildPlan", smoke: BuildSmoke | None) -> CheckResult:

    free = free_bytes(plan.output_dir)
    numbers: dict[str, Any] = {"output_dir": str(plan.output_dir), "todo": plan.todo, "present": plan.present,
                               "total": plan.total, "free_bytes": free}
    if plan.todo is None:
        return CheckResult("build_disk", Status.WARN, "episode file not on this machine: files to build unknown",
                           numbers, "run the preflight where data.episodes is mounted")
    if plan.todo == 0:
        return CheckResult("build_disk", Status.PASS, f"all {plan.total} files already built: nothing to write",
                           numbers)
    if smoke is None or not smoke.ok or not smoke.bytes_per_file:
        return CheckResult("build_disk", Status.WARN, f"{plan.todo} files to build; bytes per file unknown until "
                           "the smoke encodes one", numbers, "run the preflight with the smoke")
    need = plan.todo * smoke.bytes_per_file
    numbers["need_bytes"] = need
    arithmetic = (f"{plan.todo} files still to build × {format_bytes(smoke.bytes_per_file)} = {format_bytes(need)} "
                  f"vs {format_bytes(free) if free is not None else '?'} free under {plan.output_dir}")
    if free is not None and need > free:
        return CheckResult("build_disk", Status.FAIL, f"does not fit → ENOSPC (disk_full) mid-build: {arithmetic}",
                           numbers, "free space there, or point the cache root at a bigger disk")
    return CheckResult("build_disk", Status.PASS, f"fits: {arithmetic}", numbers)


def judge_smoke(job: "EffectiveJob", plan: "BuildPlan", smoke: BuildSmoke | None, source: str = "") -> CheckResult:
    """The smoke's timings → a wall-clock estimate vs the effective time limit; peak RSS vs ``--mem``."""
    if smoke is None:
        return CheckResult(SMOKE_NAME, Status.SKIP, "not run (--no-smoke)", {}, "run the preflight with the smoke")
    if not smoke.ok:
        return CheckResult(SMOKE_NAME, Status.FAIL, f"{source}the 1-file encode failed: {smoke.error}",
                           {"error": smoke.error}, "fix the error above; the build job would fail the same way")
    options = job.options
    processes, todo, norm_s, estimate = _estimate(options, plan, smoke)
    limit = options.time_seconds
    mem_need = smoke.peak_rss_bytes * options.ranks_per_node  # --mem is per node
    mem_have = options.mem_mib * 2**20
    job_kind = DeviceKind.of_job(options.gpus_per_node)
    provenance = _provenance(options, smoke)
    numbers = {"load_s": smoke.load_s, "encode_s": smoke.encode_s, "norm_s": norm_s, "todo": todo,
               "processes": processes, "estimate_s": estimate, "time_limit_s": limit,
               "peak_rss_bytes": smoke.peak_rss_bytes, "mem_bytes": mem_have, "bytes_per_file": smoke.bytes_per_file,
               "estimate_provenance": provenance.as_dict()}
    norm_text = f" + norm pass {norm_s:.1f} s" if norm_s else ""
    timing = (f"load {smoke.load_s:.1f} s{norm_text} + ⌈{todo} files ÷ {processes} process(es)⌉ × "
              f"{smoke.encode_s:.2f} s/file = {format_duration(estimate)}")
    if provenance.measured:
        timing += f" vs time limit {format_duration(limit)}"
    else:
        timing = (f"build time unmeasured on {job_kind.label} (no {job_kind.label} smoke): the 1-file encode ran "
                  f"on {smoke.device} ({timing} there), which does not stand for the job's "
                  f"{f'{options.gpus_per_node} GPU(s) per node' if options.gpus_per_node else 'CPUs'}; "
                  f"time limit {format_duration(limit)} not judged")
    arithmetic = (f"{timing}; peak {format_bytes(smoke.peak_rss_bytes)} × {options.ranks_per_node} per node = "
                  f"{format_bytes(mem_need)} vs --mem {format_bytes(mem_have)}")
    if mem_need > mem_have:
        return CheckResult(SMOKE_NAME, Status.FAIL, f"{source}out of memory (oom_host): {arithmetic}", numbers,
                           "raise --mem / resources.mem, or fewer processes per node")
    if not provenance.measured:
        return CheckResult(SMOKE_NAME, Status.PASS, f"{source}{arithmetic}", numbers)
    if estimate > limit:
        return CheckResult(SMOKE_NAME, Status.FAIL, f"{source}the build outlasts its time limit: {arithmetic}", numbers,
                           f"raise --time to at least {format_duration(estimate / ESTIMATE_WARN)} or use more devices "
                           "(a timed-out build resumes, skipping finished files, but each attempt queues again)")
    if estimate > ESTIMATE_WARN * limit:
        return CheckResult(SMOKE_NAME, Status.WARN, f"{source}tight: {arithmetic}", numbers,
                           "raise --time: a busier node encodes slower")
    return CheckResult(SMOKE_NAME, Status.PASS, f"{source}{arithmetic}", numbers)


def _estimate(options: "JobOptions", plan: "BuildPlan", smoke: BuildSmoke) -> tuple[int, int, float, float]:
    """(processes, files to build, norm pass s, wall-clock estimate s): ``load + norm + ⌈todo ÷ processes⌉ ×
    encode``, the build's ranks on every node."""
    processes = options.nodes * options.ranks_per_node
    todo = plan.todo if plan.todo is not None else 0
    norm_s = (smoke.norm_s_per_demo or 0.0) * (smoke.norm_demos or 0.0)
    return processes, todo, norm_s, smoke.load_s + norm_s + math.ceil(todo / processes) * smoke.encode_s


def _provenance(options: "JobOptions", smoke: BuildSmoke) -> Provenance:
    """Measured when the smoke's encode ran on the job's kind of device (a CPU encode says nothing of a GPU's)."""
    job_kind, ran_on = DeviceKind.of_job(options.gpus_per_node), DeviceKind.of(smoke.device)
    return (Provenance(Basis.MEASURED, f"1-file encode on {smoke.device}", ran_on) if ran_on is job_kind
            else Provenance(Basis.UNMEASURED, f"no {job_kind.label} smoke", None))


MIN_TIME_S = 600.0
"""A derived build time limit is at least this: the smoke's estimate leaves out what every job spends besides the
encode (start-up, the snapshot check, the node guard, writing the marker files)."""
MEM_MARGIN = 1.25
"""A derived build ``--mem``: the smoke's peak RSS per builder rank × ranks per node × this (a busier encode, a
bigger episode than the smoke's one file)."""


def sized(job: "EffectiveJob", version: str | None) -> "JobOptions":
    """A build job sized for what it does: each of CPUs, memory and time limit from ``--cpus/--mem/--time``,
    else ``resources.build`` in the spec, else derived from the passing build preflight's smoke (memory: peak
    RSS × ranks per node × :data:`MEM_MARGIN`; time: the estimate ÷ :data:`ESTIMATE_WARN`, at least
    :data:`MIN_TIME_S`, where the encode ran
    on the job's kind of device), else the spec's ``resources`` (memory; time limit). One line per value in
    ``options.derivation`` (the script's ``# idmctl: build job:`` lines). No time limit from any of them is bad
    input."""
    from dataclasses import replace

    from idmctl.record.preflights import latest_passing  # here: only a --build job reads its build smoke
    from ground.units import slurm_mem, slurm_time  # here: as above

    options, request = job.options, job.request
    own = job.resolved.spec.resources.build
    run = latest_passing(job.declared, job.profile_hash, job.smoke_flags, version)
    smoke = stored_smoke(run)
    if smoke is not None and not smoke.ok:
        smoke = None
    plan_ = None
    if smoke is not None:
        try:
            plan_ = _plan(job)
        except UserError:
            smoke = None
    source = f"build smoke of preflight #{run.id}" if run is not None else ""
    lines: list[str] = []
    cpus = options.cpus_per_node
    if not request.is_given("cpus_per_node") and own and own.cpus:
        cpus = own.cpus
        lines.append(f"CPUs {cpus} (resources.build)")
    mem = options.mem
    if request.is_given("mem"):
        lines.append(f"memory {mem} (--mem)")
    elif own and own.mem:
        mem = own.mem
        lines.append(f"memory {mem} (resources.build)")
    elif smoke is not None and plan_ is not None and smoke.peak_rss_bytes:
        need = smoke.peak_rss_bytes * options.ranks_per_node * MEM_MARGIN
        mem = f"{math.ceil(need / 2**30)}G"
        lines.append(f"memory peak {format_bytes(smoke.peak_rss_bytes)} × {options.ranks_per_node} ranks × {MEM_MARGIN} = "
                     f"{format_bytes(need)} → {mem} ({source})")
    else:
        lines.append(f"memory {slurm_mem(mem)} (resources.mem: no build smoke measured the peak)")
    time_limit = options.time_limit
    if request.is_given("time_limit"):
        lines.append(f"time limit {time_limit} (--time)")
    elif own and own.time_limit:
        time_limit = own.time_limit
        lines.append(f"time limit {time_limit} (resources.build)")
    elif smoke is not None and plan_ is not None and _provenance(options, smoke).measured:
        processes, todo, norm_s, estimate = _estimate(options, plan_, smoke)
        seconds = max(MIN_TIME_S, estimate / ESTIMATE_WARN)
        time_limit = slurm_time(math.ceil(seconds / 60) * 60)
        lines.append(f"time limit (load {smoke.load_s:.1f} s{f' + norm pass {norm_s:.1f} s' if norm_s else ''} + "
                     f"⌈{todo} files ÷ {processes} process(es)⌉ × {smoke.encode_s:.2f} s/file = "
                     f"{format_duration(estimate)}) ÷ {ESTIMATE_WARN}, at least {format_duration(MIN_TIME_S)} → {time_limit} "
                     f"({source})")
    elif time_limit is not None:
        lines.append(f"time limit {time_limit} (resources.time_limit: build time unmeasured)")
    else:
        raise UserError("a build job needs a time limit: none in --time, resources.build or resources.time_limit, "
                        "and no passing build preflight measured the build", file=str(job.declared.path),
                        field="resources.build.time_limit",
                        hint="pass --time, or run `idmctl preflight EXP --build MODE --time …` (its build_smoke row "
                             "estimates the wall clock) and submit again")
    return replace(options, cpus_per_node=cpus, mem=mem, time_limit=time_limit,
                   derivation=[*options.derivation, "build job: " + "; ".join(lines)])


def _checks(job: "EffectiveJob", smoke: BuildSmoke | None, source: str = "") -> list[CheckResult]:
    try:
        plan = _plan(job)
    except UserError as exc:
        failed = CheckResult("build_disk", Status.FAIL, exc.line(), {}, exc.hint or "")
        return [_weights(job), _norm(job), failed, CheckResult(SMOKE_NAME, Status.SKIP, "no plan", {})]
    return [_weights(job), _norm(job), _disk(job, plan, smoke), judge_smoke(job, plan, smoke, source)]


def run_build_preflight(job: "EffectiveJob", *, with_smoke: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
                        record: bool = True) -> "PreflightReport":
    """Weights, norm and disk first; the smoke only when they pass (it would fail the same way)."""
    from dataclasses import replace

    from idmctl.gate.runner import PreflightReport  # start-up: 32 more project modules only this path needs

    started = time.perf_counter()
    version = version_for(job.declared.spec)
    job = replace(job, options=sized(job, version))
    static = _checks(job, None)
    smoke: BuildSmoke | None = None
    if with_smoke:
        blocking = [r.name for r in static[:2] if r.status is Status.FAIL]
        if blocking:
            results = [*static[:3], CheckResult(SMOKE_NAME, Status.SKIP, f"not run: {', '.join(blocking)} FAILed",
                                                {}, "fix the failing checks above")]
        else:
            smoke = run_smoke(job, timeout_s)
            results = _checks(job, smoke)
            if results[-1].status is not Status.SKIP:
                results[-1] = replace(results[-1], numbers={**results[-1].numbers, "smoke": smoke.as_dict()})
    else:
        results = static
    seconds = time.perf_counter() - started
    declared = job.declared
    report = PreflightReport(declared.name, declared.hash, version, job.profile.name, job.profile_hash, with_smoke,
                             results, seconds, smoke_flags=job.smoke_flags)
    if not record:
        return report
    run = record_run(declared, job.profile.name, job.profile_hash, version, results, with_smoke, seconds, job=job.record())
    return replace(report, run_id=run.id)


def stored_smoke(run: "StoredPreflight | None") -> BuildSmoke | None:
    if run is None:
        return None
    for check in json.loads(run.result_json or "{}").get("checks", []):
        if check.get("name") == SMOKE_NAME and check.get("numbers", {}).get("smoke"):
            data = check["numbers"]["smoke"]
            return BuildSmoke(**{k: v for k, v in data.items() if k in BuildSmoke.__dataclass_fields__})
    return None


def judge(job: "EffectiveJob", preflight: "StoredPreflight | None") -> "Admission":
    """Submit-time: the static build checks again on the effective job, and the stored smoke re-judged
    against its ``--time``/``--mem`` (files built since the preflight shrink the estimate)."""
    from idmctl.gate.admission import Admission  # start-up: 33 more project modules only this path needs

    started = time.perf_counter()
    smoke = stored_smoke(preflight)
    source = f"measured by preflight #{preflight.id}: " if preflight is not None else ""
    results = _checks(job, smoke, source)
    if smoke is None:
        why = (f"preflight #{preflight.id} stored no build smoke" if preflight is not None
               else "no passing build preflight of this key to take the smoke's measurement from")
        results[-1] = CheckResult(SMOKE_NAME, Status.SKIP, why, {}, "" if preflight else "run the preflight the gate asks for")
    seconds = time.perf_counter() - started
    return Admission(results, preflight.id if preflight else None, seconds, {"build": seconds * 1000})

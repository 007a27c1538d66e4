"""Submit: spec + flags → effective job → submit-time checks + gate (passing preflight) → chain + job rows →
rendered script → scheduler.

A chain is one logical run: its attempts (resubmissions after preemption, node failure, time limit)
share one run directory, ``$IDMCTL_HOME/runs/<experiment>/<chain_id>``, holding ``spec.json`` (what
the trainer reads) and the checkpoints it resumes from, and so one MLflow run.
"""

from __future__ import annotations

import getpass
import json
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground import contract
from ground.contract import SPEC_FILE, code_version
from ground.errors import CheckFailed, UserError
from idmctl.executors import executor_for
from idmctl.jobs.effective import EffectiveJob, active_exclusions, build as build_effective
from idmctl.jobs.render import JobOptions, RenderContext, render_script, with_exclusions
from idmctl.jobs.verdict import Verdict, require_acceptance, verdict_if_askable
from ground.paths import atomic_write_text, home
from ground.spec.loader import ResolvedSpec

from ground.run_dir import write_run_spec  # torch-free: {"name", "hash", "spec"}

if TYPE_CHECKING:
    from idmctl.preflight.admission import Admission
    from idmctl.store.models import Chain, Job, PreflightRun

DRY_RUN_CHAIN_ID = 0


@dataclass
class Submitted:
    job: "Job"
    """The job row as stored (an ORM object, or the same columns as attributes on the fast path)."""
    chain: "Chain"
    script: str


def runs_dir(experiment: str, chain_id: int) -> Path:
    return home() / "runs" / experiment / str(chain_id)


class Refused(CheckFailed):
    """A submit-time check FAILed on the effective job: nothing was written or sent."""

    def __init__(self, job: EffectiveJob, admission: Admission) -> None:
        self.job, self.admission = job, admission
        named = "; ".join(f"{r.name}: {r.summary}" for r in admission.results if r.status.value == "FAIL")
        super().__init__(f"submit refused: {', '.join(admission.failed)} FAIL on the job as submitted — {named}")


def require_preflight(job: EffectiveJob) -> "PreflightRun":
    """The gate: a passing preflight for exactly (spec hash, code version, profile hash, smoke flags)."""
    from idmctl.preflight.record import require_pass

    return require_pass(job.declared, job.profile, job.profile_hash, job.smoke_flags)


def prepare(experiment: str, overrides: dict[str, Any], cluster: str | None,
            version: str | None = None) -> EffectiveJob:
    """The effective job, rendered once: bad input fails here, before anything is written."""
    job = build_effective(experiment, overrides, cluster, version)
    render_script(job.resolved, job.options, _context(job.resolved, DRY_RUN_CHAIN_ID, 1, job.profile.scheduler, {}))
    return job


def admit(job: EffectiveJob, force_reason: str | None, version: str) -> Admission:
    """Gate + submit-time checks. Checks first: a FAIL on the job as submitted is the more specific
    answer (and names its flag) than "no preflight for these flags"."""
    from idmctl.preflight.record import latest_passing

    passing = latest_passing(job.declared, job.profile_hash, job.smoke_flags, version)
    # Without a pass (and no --force) submit refuses anyway: the flags' FAILs are still named, but a
    # check nothing remembers for this code is SKIPped rather than importing torch to refuse slowly.
    admission = _judge(job, passing, version, memo_only=passing is None and force_reason is None)
    if admission.failed and force_reason is None:
        raise Refused(job, admission)
    if force_reason is None and passing is None:
        require_preflight(job)  # raises, saying why there is no pass (the ORM path: only on refusal)
    return admission


def _judge(job: EffectiveJob, passing: "PreflightRun | None", version: str, memo_only: bool = False) -> Admission:
    """The submit-time checks: the build preflight's for ``--build``, the training preflight's otherwise."""
    if job.options.build:
        from cache.build_plan import check_mode
        from idmctl.preflight.build import judge as judge_build

        check_mode(job.resolved, job.options.build)  # a spec that cannot build this mode is bad input (exit 2)
        return judge_build(job, passing)
    from idmctl.preflight.admission import judge

    return judge(job, passing, version, memo_only=memo_only)


def _context(resolved: ResolvedSpec, chain_id: int, attempt: int, executor: str, extra_env: dict[str, str],
             admitted: dict[str, Any] | None = None) -> RenderContext:
    run_dir = runs_dir(resolved.name, chain_id)
    log_name = f"slurm-%j.out" if executor == "slurm" else "local-%j.out"
    return RenderContext(run_dir=run_dir, chain_id=chain_id, attempt=attempt, idmctl_home=home(),
                         log_path=str(run_dir / log_name), extra_env=extra_env, stage_bytes=admitted_stage_bytes(admitted))


def admitted_stage_bytes(admitted: dict[str, Any] | None) -> int | None:
    """The stage-in bytes the disk check computed on the job as admitted (the node guard's scratch need)."""
    checks = ((admitted or {}).get("admission") or {}).get("checks") or []
    numbers = next((c.get("numbers") or {} for c in checks if c.get("name") == "disk"), {})
    value = numbers.get("stage_bytes")
    return int(value) if isinstance(value, (int, float)) else None


@dataclass
class DryRun:
    script: str
    job: EffectiveJob
    admission: Admission
    verdict: Verdict
    """What the scheduler says about ``script`` (``sbatch --test-only``): submit asks the same."""


def dry_run(experiment: str, overrides: dict[str, Any], cluster: str | None) -> DryRun:
    """The exact script a submit would send (chain id 0 stands in for the one submit would create), and
    the verdicts submit would reach on it. Never raises on a FAIL: showing it is the point."""
    from idmctl.preflight.record import latest_passing

    version = code_version()
    job = prepare(experiment, overrides, cluster, version)
    admission = _judge(job, latest_passing(job.declared, job.profile_hash, job.smoke_flags, version), version)
    script = render_script(job.resolved, job.options, _context(job.resolved, DRY_RUN_CHAIN_ID, 1, job.profile.scheduler, {},
                                                               {"admission": admission.as_dict()}))
    return DryRun(script, job, admission, verdict_if_askable(job.profile.scheduler, script))


def submit(experiment: str, overrides: dict[str, Any], cluster: str | None,
           force_reason: str | None = None) -> Submitted:
    version = code_version()  # once per submit (two git calls), for the limits and the gate alike
    job = prepare(experiment, overrides, cluster, version)
    admission = admit(job, force_reason, version)
    ask_scheduler(job)
    forced = None
    if force_reason is not None:
        forced = f"{getpass.getuser()}@{socket.gethostname()} at {datetime.now(timezone.utc).isoformat(timespec='seconds')}: {force_reason}"
    chain_id = _new_chain(job)
    admitted = {"job": job.record(), "admission": admission.as_dict()}
    return _submit_attempt(job.resolved, job.profile.scheduler, job.options, chain_id, 1, admission.preflight_id, forced,
                           {}, spec_hash=job.declared.hash, admitted=admitted, version=version)


def ask_scheduler(job: EffectiveJob) -> Verdict:
    """The scheduler's verdict before any row or run directory exists (raises ``SchedulerRefused``).
    The dry-run script has the real one's #SBATCH header (only the run directory's chain id differs),
    so the scheduler's answer on it is its answer on the job."""
    return require_acceptance(job.profile.scheduler, render_script(
        job.resolved, job.options, _context(job.resolved, DRY_RUN_CHAIN_ID, 1, job.profile.scheduler, {})))


def _submit_attempt(resolved: ResolvedSpec, scheduler: str, options: JobOptions, chain_id: int, attempt: int,
                    preflight_id: int | None, forced: str | None, extra_env: dict[str, str], *,
                    spec_hash: str, admitted: dict[str, Any] | None, version: str | None = None) -> Submitted:
    """``resolved`` is the effective spec (what the trainer reads); ``spec_hash`` the spec's own hash (the
    gate's key, kept on the rows); ``admitted`` the effective job and the checks it passed."""
    version = version or code_version()
    ctx = _context(resolved, chain_id, attempt, scheduler, {contract.ENV_CODE_VERSION: version, **extra_env}, admitted)
    script = render_script(resolved, options, ctx)
    write_run_spec(ctx.run_dir, resolved)
    script_path = ctx.run_dir / f"attempt-{attempt}.sbatch"
    atomic_write_text(script_path, script)
    executor = executor_for(scheduler)
    recorded = {**options.as_dict(), "rollback": bool(extra_env.get(contract.ENV_ROLLBACK)),
                **({"admitted": admitted} if admitted else {})}
    job_id = _insert_job(dict(chain_id=chain_id, attempt=attempt, experiment=resolved.name, spec_hash=spec_hash,
                              code_version=version, preflight_id=preflight_id, executor=executor.name,
                              state="SUBMITTING", qos=options.qos, gpus=options.gpus_per_node * options.nodes,
                              routing_n=resolved.spec.data.routing_n, script_path=str(script_path),
                              options_json=json.dumps(recorded), forced_reason=forced))
    try:
        scheduler_id = executor.submit(script_path, ctx.log_path)
    except CheckFailed as exc:
        _update(job_id, {"state": "SUBMIT_FAILED", "reason": str(exc)[:500]}, chain_id, {"status": "FAILED"})
        raise
    row, chain = _update(job_id, {"scheduler_id": scheduler_id, "state": "PENDING",
                                  "log_path": ctx.log_path.replace("%j", scheduler_id),
                                  "submitted_at": datetime.now(timezone.utc)}, chain_id, {})
    return Submitted(job=row, chain=chain, script=script)


# -- rows: plain sqlite3 when the store is at head (no ORM import on the submit path), else the ORM ----------

def _new_chain(job: EffectiveJob) -> int:
    """Register the spec version (idempotent) and open the chain; returns its id."""
    from idmctl.store.fast import connect, db_time, insert

    declared = job.declared
    with connect() as db:
        if db is not None:
            db.execute("INSERT OR IGNORE INTO spec_version (hash, experiment, source_path, resolved_json, registered_at) "
                       "VALUES (?, ?, ?, ?, ?)", (declared.hash, declared.name, str(declared.path),
                                                   declared.canonical_json, db_time()))
            return insert(db, "chain", {"experiment": declared.name, "spec_hash": declared.hash, "mlflow_run_id": None,
                                        "retries_budget": job.options.retries, "retries_used": 0, "status": "ACTIVE",
                                        "created_at": db_time()})
    from idmctl.spec_store import register_specs
    from idmctl.store.db import session
    from idmctl.store.models import Chain

    register_specs([declared])
    with session() as orm:
        chain = Chain(experiment=declared.name, spec_hash=declared.hash, retries_budget=job.options.retries)
        orm.add(chain)
        orm.flush()
        return int(chain.id or 0)


def _insert_job(values: dict[str, Any]) -> int:
    from idmctl.store.fast import connect, db_time, insert

    with connect() as db:
        if db is not None:
            now = db_time()
            return insert(db, "job", {"restarts": 0, "imported": 0, "created_at": now, "updated_at": now, **values})
    from idmctl.store.db import session
    from idmctl.store.models import Job

    with session() as orm:
        job = Job(**values)
        orm.add(job)
        orm.flush()
        return int(job.id or 0)


def _update(job_id: int, job_values: dict[str, Any], chain_id: int, chain_values: dict[str, Any]) -> tuple[Any, Any]:
    """Update the job (and chain) rows; returns both as read back (ORM objects or attribute rows)."""
    from idmctl.store.fast import connect, db_time, rows, update

    with connect() as db:
        if db is not None:
            stored = {k: db_time(v) if isinstance(v, datetime) else v for k, v in job_values.items()}
            update(db, "job", job_id, stored)
            if chain_values:
                update(db, "chain", chain_id, chain_values)
            (job,) = rows(db, "SELECT * FROM job WHERE id = ?", (job_id,))
            (chain,) = rows(db, "SELECT * FROM chain WHERE id = ?", (chain_id,))
            return job, chain
    from idmctl.store.db import session
    from idmctl.store.models import Chain, Job

    with session() as orm:
        job, chain = orm.get(Job, job_id), orm.get(Chain, chain_id)
        for target, values in ((job, job_values), (chain, chain_values)):
            if target is not None:
                for key, value in values.items():
                    setattr(target, key, value)
                orm.add(target)
    return job, chain


def resubmit(job_id: int, extra_env: dict[str, str], reason: str, spends_retry: bool = True) -> "Job":
    """A new attempt of the job's chain with the same options (plus current node exclusions);
    ``spends_retry`` False where it stands in for a requeue the cluster would not do."""
    from idmctl.store.db import session
    from idmctl.store.models import Chain, Job

    with session() as db:
        old = db.get(Job, job_id)
        if old is None or old.chain_id is None:
            raise UserError(f"no job {job_id}", field="JOB")
        chain = db.get(Chain, old.chain_id)
        assert chain is not None
        if spends_retry:
            chain.retries_used += 1
            db.add(chain)
        spec_json = json.loads(Path(old.script_path or "").with_name(SPEC_FILE).read_text())
    options_data = {k: v for k, v in json.loads(old.options_json).items() if k in JobOptions.__dataclass_fields__}
    options = with_exclusions(JobOptions(**options_data), active_exclusions())
    resolved = _resolved_from_run(spec_json, old)
    scheduler = "slurm" if old.executor == "slurm" else "local"
    admitted = json.loads(old.options_json).get("admitted")
    submitted = _submit_attempt(resolved, scheduler, options, old.chain_id, old.attempt + 1,
                                old.preflight_id, old.forced_reason, {**extra_env, contract.ENV_RETRY_REASON: reason},
                                spec_hash=old.spec_hash or resolved.hash, admitted=admitted)
    return submitted.job


def _resolved_from_run(spec_json: dict[str, Any], job: "Job") -> ResolvedSpec:
    """The exact spec the chain started with (the YAML may have changed since)."""
    from ground.spec.schema import ExperimentSpec

    spec = ExperimentSpec.model_validate(spec_json["spec"])
    return ResolvedSpec(name=spec_json["name"], path=Path(job.script_path or "").with_name(SPEC_FILE), spec=spec)

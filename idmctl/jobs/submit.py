"""Submit: spec + flags → options → gate (passing preflight) → chain + job rows → rendered script → scheduler.

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
from typing import Any

from sqlmodel import select

from ground import contract
from ground.contract import code_version
from ground.errors import CheckFailed, UserError
from idmctl.executors import executor_for
from idmctl.preflight.limits import job_limits
from idmctl.jobs.render import JobOptions, RenderContext, render_script, resolve_options, with_exclusions
from ground.paths import atomic_write_text, home
from idmctl.profile import ClusterProfile, load_profile
from ground.spec.loader import ResolvedSpec, load_spec
from idmctl.store.db import session
from idmctl.store.models import Chain, Job, NodeExclusion
from ground.run_dir import write_run_spec  # torch-free: {"name", "hash", "spec"}

DRY_RUN_CHAIN_ID = 0


@dataclass
class Submitted:
    job: Job
    chain: Chain
    script: str


def runs_dir(experiment: str, chain_id: int) -> Path:
    return home() / "runs" / experiment / str(chain_id)


def require_preflight(resolved: ResolvedSpec, profile: ClusterProfile, profile_hash: str) -> int:
    """The gate: a passing preflight for exactly (spec hash, code version, profile hash), or an error."""
    from idmctl.preflight.record import require_pass

    return int(require_pass(resolved, profile, profile_hash).id or 0)


def active_exclusions() -> list[str]:
    now = datetime.now(timezone.utc)
    with session() as db:
        rows = db.exec(select(NodeExclusion)).all()
    return sorted({row.node for row in rows if _aware(row.until) > now})


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def prepare(experiment: str, overrides: dict[str, Any], cluster: str | None) -> tuple[ResolvedSpec, ClusterProfile, str, JobOptions]:
    resolved = load_spec(experiment)
    profile, profile_hash = load_profile(cluster)
    options = resolve_options(resolved, overrides)
    source = ("command line", "--qos") if overrides.get("--qos") else (str(resolved.path), "resources.qos")
    profile.tier(options.qos, file=source[0], field=source[1])
    options = job_limits(resolved, profile, options)  # time limit, checkpoint interval, signal lead
    return resolved, profile, profile_hash, with_exclusions(options, active_exclusions())


def _context(resolved: ResolvedSpec, chain_id: int, attempt: int, executor: str, extra_env: dict[str, str]) -> RenderContext:
    run_dir = runs_dir(resolved.name, chain_id)
    log_name = f"slurm-%j.out" if executor == "slurm" else "local-%j.out"
    return RenderContext(run_dir=run_dir, chain_id=chain_id, attempt=attempt, idmctl_home=home(),
                         log_path=str(run_dir / log_name), extra_env=extra_env)


def dry_run(experiment: str, overrides: dict[str, Any], cluster: str | None) -> str:
    """The exact script a submit would send (chain id 0 stands in for the one submit would create)."""
    resolved, profile, _hash, options = prepare(experiment, overrides, cluster)
    return render_script(resolved, options, _context(resolved, DRY_RUN_CHAIN_ID, 1, profile.scheduler, {}))


def submit(experiment: str, overrides: dict[str, Any], cluster: str | None,
           force_reason: str | None = None) -> Submitted:
    resolved, profile, profile_hash, options = prepare(experiment, overrides, cluster)
    # Render once before writing anything: bad input must leave no rows behind.
    render_script(resolved, options, _context(resolved, DRY_RUN_CHAIN_ID, 1, profile.scheduler, {}))
    if force_reason is None:
        preflight_id: int | None = require_preflight(resolved, profile, profile_hash)
        forced = None
    else:
        preflight_id = None
        forced = f"{getpass.getuser()}@{socket.gethostname()} at {datetime.now(timezone.utc).isoformat(timespec='seconds')}: {force_reason}"
    from idmctl.spec_store import register_specs

    register_specs([resolved])
    with session() as db:
        chain = Chain(experiment=resolved.name, spec_hash=resolved.hash, retries_budget=options.retries)
        db.add(chain)
        db.flush()
        chain_id = int(chain.id or 0)
    return _submit_attempt(resolved, profile.scheduler, options, chain_id, 1, preflight_id, forced, {})


def _submit_attempt(resolved: ResolvedSpec, scheduler: str, options: JobOptions, chain_id: int, attempt: int,
                    preflight_id: int | None, forced: str | None, extra_env: dict[str, str]) -> Submitted:
    version = code_version()
    ctx = _context(resolved, chain_id, attempt, scheduler, {contract.ENV_CODE_VERSION: version, **extra_env})
    script = render_script(resolved, options, ctx)
    write_run_spec(ctx.run_dir, resolved)
    script_path = ctx.run_dir / f"attempt-{attempt}.sbatch"
    atomic_write_text(script_path, script)
    executor = executor_for(scheduler)
    recorded = {**options.as_dict(), "rollback": bool(extra_env.get(contract.ENV_ROLLBACK))}
    with session() as db:
        job = Job(chain_id=chain_id, attempt=attempt, experiment=resolved.name, spec_hash=resolved.hash,
                  code_version=version, preflight_id=preflight_id, executor=executor.name,
                  state="SUBMITTING", qos=options.qos, gpus=options.gpus_per_node * options.nodes,
                  routing_n=resolved.spec.data.routing_n, script_path=str(script_path),
                  options_json=json.dumps(recorded), forced_reason=forced)
        db.add(job)
    try:
        scheduler_id = executor.submit(script_path, ctx.log_path)
    except CheckFailed as exc:
        with session() as db:
            row = db.get(Job, job.id)
            if row is not None:
                row.state, row.reason = "SUBMIT_FAILED", str(exc)[:500]
                db.add(row)
            chain = db.get(Chain, chain_id)
            if chain is not None:
                chain.status = "FAILED"
                db.add(chain)
        raise
    with session() as db:
        row = db.get(Job, job.id)
        assert row is not None
        row.scheduler_id = scheduler_id
        row.state = "PENDING"
        row.log_path = ctx.log_path.replace("%j", scheduler_id)
        row.submitted_at = datetime.now(timezone.utc)
        db.add(row)
        chain = db.get(Chain, chain_id)
    return Submitted(job=row, chain=chain, script=script)  # type: ignore[arg-type]


def resubmit(job_id: int, extra_env: dict[str, str], reason: str) -> Job:
    """A new attempt of the job's chain with the same options (plus current node exclusions)."""
    with session() as db:
        old = db.get(Job, job_id)
        if old is None or old.chain_id is None:
            raise UserError(f"no job {job_id}", field="JOB")
        chain = db.get(Chain, old.chain_id)
        assert chain is not None
        chain.retries_used += 1
        db.add(chain)
        spec_json = json.loads(Path(old.script_path or "").with_name("spec.json").read_text())
    options_data = {k: v for k, v in json.loads(old.options_json).items() if k in JobOptions.__dataclass_fields__}
    options = with_exclusions(JobOptions(**options_data), active_exclusions())
    resolved = _resolved_from_run(spec_json, old)
    scheduler = "slurm" if old.executor == "slurm" else "local"
    submitted = _submit_attempt(resolved, scheduler, options, old.chain_id, old.attempt + 1,
                                old.preflight_id, old.forced_reason, {**extra_env, contract.ENV_RETRY_REASON: reason})
    return submitted.job


def _resolved_from_run(spec_json: dict[str, Any], job: Job) -> ResolvedSpec:
    """The exact spec the chain started with (the YAML may have changed since)."""
    from ground.spec.schema import ExperimentSpec

    spec = ExperimentSpec.model_validate(spec_json["spec"])
    return ResolvedSpec(name=spec_json["name"], path=Path(job.script_path or "").with_name("spec.json"), spec=spec)

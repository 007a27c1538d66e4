"""Submit: spec + flags → effective job → submit-time checks + gate (passing preflight) → the script, rendered
once → the scheduler's verdict on it → file → scheduler → job row.

A chain is one logical run: its attempts (resubmissions after preemption, node failure, time limit)
share one run directory, ``$IDMCTL_HOME/runs/<experiment>/<chain_id>``, holding ``spec.json`` (what
the trainer reads) and the checkpoints it resumes from, and so one MLflow run.
"""

from __future__ import annotations

import getpass
import json
import socket
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground import contract
from ground.code_snapshot import SnapshotError
from ground.contract import SPEC_FILE
from ground.errors import CheckFailed, UserError
from ground.spec.schema import ExperimentSpec
from idmctl.core.profile import load_profile, profile_path
from idmctl.gate.admission import StoredPreflight, judge
from idmctl.job.controller_script import ControllerContext, controller_request, render_controller_script
from idmctl.ops.controller import CONTROLLER_LOG, submit_controller, wanted
from idmctl.ops.executors import executor_for
from idmctl.job.code import JobCode, Tree, freeze, planned, require_present, tree_for
from idmctl.job.effective import EffectiveJob, active_exclusions, build as build_effective
from idmctl.core.job_options import JobOptions, JobRequest
from idmctl.job.render import RenderContext, check_sbatch_path, render_script, with_exclusions
from idmctl.ops.verdict import SchedulerRefused, Verdict, require_acceptance, verdict_if_askable
from idmctl.record.preflights import latest_passing, preflight_run, require_pass, version_for
from idmctl.record.records import ChainRecord, EvalLink, JobRecord
from idmctl.record.store import Decision, JobStore, NewJob, SpecVersionRecord, store
from ground.paths import atomic_write_text, home, runs_root
from ground.spec.loader import ResolvedSpec, load_spec
from ground.tracking import flatten

from ground.run_dir import write_run_spec  # torch-free: {"name", "hash", "spec"}

if TYPE_CHECKING:
    from idmctl.gate.admission import Admission

DRY_RUN_CHAIN_ID = 0


@dataclass
class Submitted:
    job: JobRecord
    """The job as the store holds it once the scheduler took it (PENDING, with its scheduler id)."""
    chain: ChainRecord
    script: str
    """The script as rendered once and sent."""
    evals: list[JobRecord] = field(default_factory=list)
    """The eval jobs ``submit --eval`` sent after this one, each waiting on it (``ops.eval_jobs``)."""
    evaluated: dict[int, int] = field(default_factory=dict)
    """``submit --resume --eval``: checkpoint step → the chain's COMPLETED eval job that scored it already
    (so no second eval job was sent for it)."""


def runs_dir(experiment: str, chain_id: int, root: str | None = None) -> Path:
    """A new chain's run directory under the profile's ``runs_root`` (``root``; unset: ``$IDMCTL_HOME/runs``).
    A chain keeps the directory its first attempt ran in (:func:`chain_run_dir`), whatever the profile says later."""
    return runs_root(root) / experiment / str(chain_id)


def chain_run_dir(attempt: JobRecord) -> Path | None:
    """Where the chain of this attempt runs: the folder of the attempt's script (None: never rendered)."""
    return Path(attempt.script_path).parent if attempt.script_path else None


class Refused(CheckFailed):
    """A submit-time check FAILed on the effective job: nothing was written or sent."""

    def __init__(self, job: EffectiveJob, admission: Admission) -> None:
        self.job, self.admission = job, admission
        named = "; ".join(f"{r.name}: {r.summary}" for r in admission.results if r.status.value == "FAIL")
        super().__init__(f"submit refused: {', '.join(admission.failed)} FAIL on the job as submitted — {named}")


def require_preflight(job: EffectiveJob) -> StoredPreflight:
    """The gate: a passing preflight for exactly (spec hash, code version, profile hash, smoke flags)."""
    return require_pass(job.declared, job.profile, job.profile_hash, job.smoke_flags)


def prepare(experiment: str, request: JobRequest, cluster: str | None,
            version: str | None = None) -> EffectiveJob:
    """The effective job: bad flags and specs fail here, before anything is written (what only the script's
    values can refuse, the one render refuses before anything is sent or kept)."""
    job = build_effective(experiment, request, cluster, version)
    # The job's log lives in its run directory, named in an #SBATCH line: a root that cannot be is refused
    # here, before the gate reads (and so creates) a store under it.
    check_sbatch_path(runs_dir(job.resolved.name, DRY_RUN_CHAIN_ID, job.profile.runs_root), "log path",
                      "cluster profile runs_root" if job.profile.runs_root else contract.ENV_HOME)
    if job.options.build:
        from idmctl.gate.build import sized  # here: only a --build job is sized from its build smoke

        job = replace(job, options=sized(job, version))
    return job


def admit(job: EffectiveJob, force_reason: str | None, version: str) -> Admission:
    """Gate + submit-time checks. Checks first: a FAIL on the job as submitted is the more specific
    answer (and names its flag) than "no preflight for these flags"."""
    passing = latest_passing(job.declared, job.profile_hash, job.smoke_flags, version)
    # Without a pass (and no --force) submit refuses anyway: the flags' FAILs are still named, but a
    # check nothing remembers for this code is SKIPped rather than importing torch to refuse slowly.
    admission = _judge(job, passing, version, memo_only=passing is None and force_reason is None)
    if admission.failed and force_reason is None:
        raise Refused(job, admission)
    if force_reason is None and passing is None:
        require_preflight(job)  # raises, saying why there is no pass (the ORM path: only on refusal)
    return admission


def _judge(job: EffectiveJob, passing: StoredPreflight | None, version: str, memo_only: bool = False) -> Admission:
    """The submit-time checks: the build preflight's for ``--build``, the training preflight's otherwise."""
    if job.options.build:
        from cache.build_plan import check_mode  # here: only a --build job plans a cache build
        from idmctl.gate.build import judge as judge_build  # here: as above

        check_mode(job.resolved, job.options.build)  # a spec that cannot build this mode is bad input (exit 2)
        return judge_build(job, passing)
    return judge(job, passing, version, memo_only=memo_only)


def _context(run_dir: Path, chain_id: int, attempt: int, executor: str, extra_env: dict[str, str],
             admitted: dict[str, Any] | None = None, code: JobCode | None = None) -> RenderContext:
    """``code``: the snapshot the attempt runs from (None only for jobs submitted before snapshots existed,
    whose resubmissions keep running the live tree as they always did)."""
    log_name = "slurm-%j.out" if executor == "slurm" else "local-%j.out"
    where = {"repo_root": Path(code.directory), "extra_env": {**code.env(), **extra_env}} if code else {"extra_env": extra_env}
    return RenderContext(run_dir=run_dir, chain_id=chain_id, attempt=attempt, idmctl_home=home(),
                         log_path=str(run_dir / log_name), stage_bytes=admitted_stage_bytes(admitted), **where)


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
    others: list[tuple[str, str]] = field(default_factory=list)
    """The other scripts the submit would send, as (what it is, script): the controller job that follows the
    attempt (a Slurm profile with ``controller.enabled``). ``--eval``'s are ``eval_jobs.dry_run_evals``'."""
    admitted: dict[str, Any] = field(default_factory=dict)
    """The admission as the scripts saw it (an eval job's script is rendered with the same)."""
    code: JobCode | None = None
    """The snapshot the scripts run from."""


DRY_RUN_JOB_ID = "0"
"""Stands in for the training job's scheduler id in the dependencies of the scripts a dry run shows."""


def dry_run(experiment: str, request: JobRequest, cluster: str | None) -> DryRun:
    """The exact script a submit would send (chain id 0 stands in for the one submit would create), the
    verdicts submit would reach on it, and the controller's script. Never raises on a FAIL: showing it is
    the point."""
    snapshot = tree_for(load_spec(experiment).spec)
    version = snapshot.version
    job = prepare(experiment, request, cluster, version)
    admission = _judge(job, latest_passing(job.declared, job.profile_hash, job.smoke_flags, version), version)
    code = planned(snapshot, job.profile, job.declared.spec)
    admitted = {"admission": admission.as_dict()}
    script = render_attempt(Attempt(job.resolved, job.profile.scheduler, job.options, DRY_RUN_CHAIN_ID, 1,
                                    job.declared.hash, None, None, admitted, code,
                                    run_dir=runs_dir(job.resolved.name, DRY_RUN_CHAIN_ID, job.profile.runs_root))).script
    return DryRun(script, job, admission, verdict_if_askable(job.profile.scheduler, script),
                  _controller_dry_run(job, cluster, code), admitted, code)


def _controller_dry_run(job: EffectiveJob, cluster: str | None, code: JobCode) -> list[tuple[str, str]]:
    """The controller job that would follow the attempt, as ``ops.controller.submit_controller`` renders it."""
    if not wanted(job.profile):
        return []
    settings = job.profile.controller
    run_dir = runs_dir(job.resolved.name, DRY_RUN_CHAIN_ID, job.profile.runs_root)
    ctx = ControllerContext(chain_id=DRY_RUN_CHAIN_ID, attempt=1, after=DRY_RUN_JOB_ID,
                            log_path=str(run_dir / CONTROLLER_LOG), idmctl_home=home(), cluster=cluster,
                            partition=settings.partition, repo_root=Path(code.directory))
    script = render_controller_script(controller_request(ctx, settings.qos, settings.time_limit, settings.mem), ctx)
    return [(f"controller job after the attempt (job {DRY_RUN_JOB_ID} stands in for its id)", script)]


def submit(experiment: str, request: JobRequest, cluster: str | None,
           force_reason: str | None = None) -> Submitted:
    # The tree is read once: its digest is the gate's key, and the snapshot the job runs is made from the
    # very listing that was hashed (a file edited after this point fails the snapshot, not the job).
    snapshot = tree_for(load_spec(experiment).spec)
    version = snapshot.version
    job = prepare(experiment, request, cluster, version)
    admission = admit(job, force_reason, version)
    admitted = {"job": job.record(), "admission": admission.as_dict(), "cluster": _profile_source(cluster)}
    # The script names its chain, so the chain is opened first; until the script is sent, any failure (the
    # scheduler's refusal, a snapshot that cannot be written) withdraws it: a refused submit leaves no row.
    jobs = store()
    declared = job.declared
    chain_id = jobs.open_chain(declared.name, declared.hash, job.options.retries, spec=SpecVersionRecord(
        declared.hash, declared.name, str(declared.path), declared.canonical_json)).id
    try:
        rendered = asked(render_attempt(Attempt(
            job.resolved, job.profile.scheduler, job.options, chain_id, 1, declared.hash, admission.preflight_id,
            _forced(force_reason), admitted, planned(snapshot, job.profile, declared.spec),
            run_dir=runs_dir(job.resolved.name, chain_id, job.profile.runs_root))))
        _freeze_as_rendered(snapshot, job, rendered)
    except BaseException:
        jobs.withdrawn(chain_id)
        raise
    return _submitted(send(rendered, jobs), rendered)


def _forced(force_reason: str | None) -> str | None:
    """Who forced the job past the gate, where, when and why (None: it passed)."""
    if force_reason is None:
        return None
    return f"{getpass.getuser()}@{socket.gethostname()} at {datetime.now(timezone.utc).isoformat(timespec='seconds')}: {force_reason}"


def _freeze_as_rendered(snapshot: Tree, job: EffectiveJob, rendered: "Rendered") -> None:
    """Write the snapshot the script was rendered for (it names the planned folder and environment digest,
    so the scheduler's verdict came before anything was written)."""
    code = freeze(snapshot, job.profile, job.declared.spec)
    if code != rendered.attempt.code:
        raise SnapshotError(f"the code snapshot written ({code.directory}, environment {code.env_digest}) is not "
                            f"the one the script names ({rendered.attempt.code})")


CODE_CHOICES = ("chain", "current")
"""``submit --resume CHAIN --code``: the chain's own snapshot (default), or the tree as it is now."""


def resume(experiment: str, chain_id: int, request: JobRequest, cluster: str | None, code_choice: str = "chain",
           force_reason: str | None = None) -> Submitted:
    """A new attempt of an ended chain: its run directory (so the trainer resumes from its checkpoints) and
    its MLflow run. It runs the chain's snapshot unless ``code_choice`` is ``current``, which moves the chain
    to the tree as it is now; either way the gate needs a passing preflight of the code that will run."""
    if code_choice not in CODE_CHOICES:
        raise UserError(f"unknown --code {code_choice!r}", file="command line", field="--code",
                        hint="chain (the chain's snapshot) or current (the tree as it is now)")
    jobs = store()
    chain = jobs.chain(chain_id)
    attempts = jobs.attempts(chain_id) if chain is not None else []
    if chain is None or not attempts:
        raise UserError(f"no chain {chain_id}", file="command line", field="--resume", hint="see `idmctl jobs`")
    running = [a for a in attempts if a.scheduler_id and not a.is_terminal]
    if running:
        raise UserError(f"chain {chain_id} is still running (job {running[-1].id}, {running[-1].state_text})",
                        file="command line", field="--resume", hint="wait for it to end, or `idmctl cancel` it")
    last = attempts[-1]
    spec_hash, experiment_of = chain.spec_hash, chain.experiment
    last_attempt = max(a.attempt for a in attempts)
    request = with_chain_flags(request, last)
    if code_choice == "chain":
        code = JobCode.from_record(dict(last.code) if last.code is not None else None)
        if code is None:
            raise UserError(f"chain {chain_id} ran the live tree (submitted before code snapshots)", file="command line",
                            field="--code", hint="resume it with --code current")
        try:
            require_present(code)
        except SnapshotError as exc:
            raise UserError(str(exc), file="command line", field="--code", hint="resume with --code current") from exc
        snapshot, version = None, code.version
    else:
        snapshot = tree_for(load_spec(experiment).spec)
        version = snapshot.version
    job = prepare(experiment, request, cluster, version)
    if (job.declared.name, job.declared.hash) != (experiment_of, spec_hash):
        raise UserError(f"chain {chain_id} runs {experiment_of} at spec {spec_hash[:12]}, not {job.declared.name} at "
                        f"{job.declared.hash[:12]}", file="command line", field="--resume",
                        hint="a changed spec is a new chain: submit it without --resume")
    run_dir = chain_run_dir(last) or runs_dir(job.resolved.name, chain_id, job.profile.runs_root)
    _require_same_run_spec(chain_id, job.resolved, run_dir / SPEC_FILE)
    admission = admit(job, force_reason, version)
    if snapshot is not None:
        code = planned(snapshot, job.profile, job.declared.spec)
    admitted = {"job": job.record(), "admission": admission.as_dict(), "cluster": _profile_source(cluster),
                "resumed_with": code_choice}
    rendered = asked(render_attempt(Attempt(
        job.resolved, job.profile.scheduler, job.options, chain_id, last_attempt + 1, job.declared.hash,
        admission.preflight_id, _forced(force_reason), admitted, code,
        {contract.ENV_RETRY_REASON: f"resumed by hand (--code {code_choice})"}, run_dir=run_dir)))
    if snapshot is not None:
        _freeze_as_rendered(snapshot, job, rendered)
    jobs.resumed(chain_id)
    return _submitted(send(rendered, jobs), rendered)


INHERITED_FLAGS = ("qos", "time_limit", "mem", "cpus_per_node", "gpus_per_node", "job_name", "exclude", "retries",
                   "entry", "build", "account", "partition", "constraint", "reservation")
"""What ``submit --resume`` takes from the chain's last attempt unless given again: everything that makes
the job the chain's (its resources, entry, build). Not --hold or a dependency: those are about this
submission, not the chain."""


def with_chain_flags(request: JobRequest, last: JobRecord) -> JobRequest:
    """``request`` over the flags the chain's last attempt was submitted with: ``--resume C`` alone resumes
    the job the chain ran (a chain submitted with ``--qos sub`` resumes on sub)."""
    earlier = JobRequest.from_given(((last.admitted or {}).get("job") or {}).get("flags") or {})
    return replace(request, **{name: getattr(earlier, name) for name in INHERITED_FLAGS
                               if earlier.is_given(name) and not request.is_given(name)})


def _require_same_run_spec(chain_id: int, resolved: ResolvedSpec, spec_path: Path) -> None:
    """A resumed attempt runs the spec the chain's run directory holds (its checkpoints and MLflow run are
    that spec's): a flag that changes it is bad input naming the fields it changes."""
    if not spec_path.exists():
        return
    ran = json.loads(spec_path.read_text())
    if ran.get("hash") == resolved.hash:
        return
    before, after = flatten(ran.get("spec") or {}), flatten(resolved.canonical)
    changed = [f"{key} {before.get(key)!r} → {after.get(key)!r}" for key in sorted(set(before) | set(after))
               if before.get(key) != after.get(key)]
    raise UserError(f"chain {chain_id} ran {ran.get('name')} at {str(ran.get('hash'))[:12]}; this resume would run "
                    f"{resolved.short_hash}: {', '.join(changed) or 'another spec'}", file="command line",
                    field="--resume", hint="drop the flags that change it (--resume uses the chain's own) or submit a "
                                           "new chain without --resume")


def _profile_source(cluster: str | None) -> str:
    """The profile file a chain was admitted under: its resubmissions are judged against the same one."""
    return str(profile_path(cluster))


@dataclass(frozen=True)
class Attempt:
    """One job as it will be sent (a chain's attempt, or an eval job): what its script is rendered from and
    what its row records."""

    resolved: ResolvedSpec
    """The effective spec (what the trainer reads)."""
    scheduler: str
    """The profile's scheduler: ``slurm`` or ``local``."""
    options: JobOptions
    chain_id: int
    number: int
    """The attempt's number in its chain (1 for the first)."""
    spec_hash: str
    """The spec's own hash (the gate's key, kept on the rows)."""
    preflight_id: int | None
    """The passing preflight it was admitted under (None: forced without one)."""
    forced: str | None
    """Who forced it past the gate, when and why (None: it passed)."""
    admitted: dict[str, Any] | None
    """The effective job and the checks it passed."""
    code: JobCode | None
    """The chain's snapshot (None only for chains submitted before snapshots: they run the live tree)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """Exports beyond the contract's (why it was resubmitted, a rollback)."""
    eval_of: dict[str, Any] | None = None
    """An eval job's link to the training chain it scores (``record.records.EvalLink``'s fields); None for a
    training attempt. An eval job runs in that chain's run directory (``run_dir``) under its own script and
    log names, and its row keeps its options as asked."""
    run_dir: Path | None = None
    """The chain's run directory (an eval job runs in its training chain's); None: :func:`runs_dir` under
    ``$IDMCTL_HOME/runs``, for a chain opened without a profile's ``runs_root``."""

    @property
    def version(self) -> str:
        """The code version the row records: the snapshot's, else the live tree's (with the spec's code roots)."""
        return self.code.version if self.code else version_for(self.resolved.spec)

    def context(self) -> RenderContext:
        env = self.extra_env
        if self.eval_of is None and not self.code:  # the live tree says its version (an eval job never did)
            env = {contract.ENV_CODE_VERSION: self.version, **env}
        run_dir = self.run_dir or runs_dir(self.resolved.name, self.chain_id)
        ctx = _context(run_dir, self.chain_id, self.number, self.scheduler, env, self.admitted, self.code)
        if self.eval_of is None:
            return ctx
        return replace(ctx, log_path=str(run_dir / f"eval-step-{self.options.eval_step or 0}-%j.out"))


@dataclass(frozen=True)
class Rendered:
    """An attempt's script, rendered once: the scheduler's verdict, the file and the job are all this text."""

    attempt: Attempt
    context: RenderContext
    script: str


def render_attempt(attempt: Attempt) -> Rendered:
    """The one render of a submission (bad values in the script are a UserError here, before anything is sent)."""
    ctx = attempt.context()
    return Rendered(attempt, ctx, render_script(attempt.resolved, attempt.options, ctx))


def asked(rendered: Rendered) -> Rendered:
    """``rendered`` once the scheduler said it would take exactly this script (raises ``SchedulerRefused``)."""
    require_acceptance(rendered.attempt.scheduler, rendered.script)
    return rendered


def send(rendered: Rendered, jobs: JobStore | None = None) -> tuple[JobRecord, ChainRecord]:
    """file → scheduler → id → record, as submitit's ``_submit_command`` does: the rendered script is written
    into the run directory, the job recorded SUBMITTING, handed to the executor, then recorded with its id
    (PENDING); a refused sbatch leaves it SUBMIT_FAILED and its chain FAILED. Every job idmctl submits (an
    attempt, an eval job) goes through here, so its record always says what was asked of the scheduler. The
    controller that will sync it is sent after it. Returns the job and its chain as the store holds them."""
    jobs = jobs or store()
    attempt, ctx = rendered.attempt, rendered.context
    if attempt.eval_of is None:
        write_run_spec(ctx.run_dir, attempt.resolved)
        script_path = ctx.run_dir / f"attempt-{attempt.number}.sbatch"
        recorded = {**attempt.options.as_dict(), "rollback": bool(attempt.extra_env.get(contract.ENV_ROLLBACK))}
        label = None
    else:
        label = f"eval-step-{attempt.options.eval_step or 0}-chain-{attempt.chain_id}"
        script_path = ctx.run_dir / f"{label}.sbatch"
        recorded = attempt.options.as_dict()
    atomic_write_text(script_path, rendered.script)
    executor = executor_for(attempt.scheduler)
    job = jobs.submitting(_new_job(attempt, executor.name, str(script_path), recorded))
    try:
        scheduler_id = executor.submit(script_path, ctx.log_path)
    except CheckFailed as exc:
        jobs.refused(job.id, str(exc))
        raise
    job = jobs.submitted(job.id, scheduler_id, ctx.log_path.replace("%j", scheduler_id), datetime.now(timezone.utc))
    # The chain's controller: sync runs inside Slurm once this job ends (an eval job's is named apart).
    if executor.name == "slurm" or label is not None:
        submit_controller(job.id, attempt.chain_id, attempt.number, scheduler_id, ctx.run_dir,
                          (attempt.admitted or {}).get("cluster"), label=label)
    chain = jobs.chain(attempt.chain_id)
    assert chain is not None, f"chain {attempt.chain_id} of job {job.id} is gone"
    return jobs.job(job.id) or job, chain


def _new_job(attempt: Attempt, executor: str, script_path: str | None, recorded: dict[str, Any]) -> NewJob:
    """The job's record at submit: the request (``recorded``), its admission, its code snapshot, its eval link."""
    link = attempt.eval_of
    return NewJob(chain_id=attempt.chain_id, attempt=attempt.number, experiment=attempt.resolved.name,
                  executor=executor, spec_hash=attempt.spec_hash, code_version=attempt.version,
                  preflight_id=attempt.preflight_id, qos=attempt.options.qos,
                  gpus=attempt.options.gpus_per_node * attempt.options.nodes,
                  routing_n=attempt.resolved.spec.data.routing_n, script_path=script_path, options=recorded,
                  admitted=attempt.admitted or None, code=attempt.code.as_dict() if attempt.code else None,
                  eval_link=EvalLink(**link) if link else None, forced_reason=attempt.forced)


def _submitted(sent: tuple[JobRecord, ChainRecord], rendered: Rendered) -> Submitted:
    job, chain = sent
    return Submitted(job=job, chain=chain, script=rendered.script)


class ResubmitRefused(CheckFailed):
    """A resubmission the checks would now refuse (or whose snapshot is gone): the chain stops, and the
    refused attempt is recorded (state SUBMIT_FAILED) with the verdict as its reason."""


def resubmit(job_id: int, extra_env: dict[str, str], reason: str, spends_retry: bool = True) -> JobRecord:
    """A new attempt of the job's chain: the same options plus the current node exclusions, the chain's
    code snapshot, and admitted like a submission (every static check on the new effective job; the smoke's
    stored measurement re-judged, not rerun: the snapshot and its smoke flags are the ones it measured).
    ``spends_retry`` False where it stands in for a requeue the cluster would not do."""
    jobs = store()
    old = jobs.job(job_id)
    if old is None or old.chain_id is None:
        raise UserError(f"no job {job_id}", field="JOB")
    if spends_retry:
        jobs.decided(old.chain_id, Decision(spend_retry=True))
    preflight = preflight_run(old.preflight_id)
    spec_json = json.loads(Path(old.script_path or "").with_name(SPEC_FILE).read_text())
    options_data = {k: v for k, v in old.options.items() if k in JobOptions.__dataclass_fields__}
    options = with_exclusions(replace(JobOptions(**options_data), hold=False), active_exclusions())
    resolved = _resolved_from_run(spec_json, old.script_path)
    scheduler = "slurm" if old.executor == "slurm" else "local"
    first = dict(old.admitted or {})
    code = JobCode.from_record(dict(old.code) if old.code is not None else None)
    env = {**extra_env, contract.ENV_RETRY_REASON: reason}
    planned_attempt = Attempt(resolved, scheduler, options, old.chain_id, old.attempt + 1, old.spec_hash or resolved.hash,
                              old.preflight_id, old.forced_reason, first, code, env, run_dir=chain_run_dir(old))
    try:
        if code is not None:
            require_present(code)
        admission = _readmit(resolved, options, first, preflight, code.version if code else old.code_version)
    except (SnapshotError, UserError) as exc:
        _refuse(jobs, old, planned_attempt, f"resubmission refused: {exc}")
        raise ResubmitRefused(f"resubmission refused: {exc}") from exc
    admitted = {**first, "admission": admission.as_dict(), "resubmission_of": job_id}
    planned_attempt = replace(planned_attempt, admitted=admitted)
    if admission.failed and not old.forced_reason:
        named = "; ".join(f"{r.name}: {r.summary}" for r in admission.results if r.status.value == "FAIL")
        why = f"resubmission refused: {', '.join(admission.failed)} FAIL on the job as it would be resubmitted — {named}"
        _refuse(jobs, old, planned_attempt, why)
        raise ResubmitRefused(why)
    rendered = render_attempt(planned_attempt)
    try:  # the scheduler's own verdict on the attempt as it will be sent (its new exclusions included)
        asked(rendered)
    except SchedulerRefused as exc:
        why = f"resubmission refused by the scheduler: {exc}"
        _refuse(jobs, old, planned_attempt, why)
        raise ResubmitRefused(why) from exc
    job, _ = send(rendered, jobs)
    return job


def _readmit(resolved: ResolvedSpec, options: JobOptions, first: dict[str, Any], preflight: StoredPreflight | None,
             version: str | None) -> "Admission":
    """The submit-time checks on the attempt about to be sent, against the profile the chain was admitted
    under (as it reads now). Introspection and the cache inspection come from the memo of this code or are
    SKIPped: no flag changes them, and importing the live tree here would judge other code."""
    profile, profile_hash = load_profile(first.get("cluster"))
    request = JobRequest.from_given((first.get("job") or {}).get("flags") or {})
    job = EffectiveJob(resolved, resolved, options, request, profile, profile_hash, list(options.exclude))
    return judge(job, preflight, version, memo_only=True)


def _refuse(jobs: JobStore, old: JobRecord, attempt: Attempt, why: str) -> None:
    """The attempt that was not sent, recorded SUBMIT_FAILED with the verdict as its reason (its chain FAILED):
    ``idmctl jobs show`` names the verdict."""
    new = _new_job(attempt, old.executor, None, attempt.options.as_dict())
    job = jobs.submitting(replace(new, code_version=attempt.code.version if attempt.code else old.code_version))
    jobs.refused(job.id, why)


def _resolved_from_run(spec_json: dict[str, Any], script_path: str | None) -> ResolvedSpec:
    """The exact spec the chain started with (the YAML may have changed since)."""
    spec = ExperimentSpec.model_validate(spec_json["spec"])
    return ResolvedSpec(name=spec_json["name"], path=Path(script_path or "").with_name(SPEC_FILE), spec=spec)

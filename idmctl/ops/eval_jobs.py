"""Evaluation jobs: ``idmctl submit EXP --eval last|STEP|each`` — one Slurm job per chosen checkpoint,
chained on the training chain with ``--dependency=afterok:<training job>`` and ``--kill-on-invalid-dep=yes``.

Each eval job runs ``trainers.eval_job`` in the training chain's run directory: it resumes nothing,
loads ``checkpoints/step-N.ckpt``, runs the spec's evaluations and logs into the chain's one MLflow run
at step N under each metric's protocol. It is its own chain row (retries 0, never retried: an
evaluation is cheap to re-run by hand) linked to the training chain by the ``eval_*`` columns of its
job row (``idmctl.record.eval_jobs``).

Which attempt writes a checkpoint is not known at submit (a preemption moves it), so every eval job
waits on the chain's current attempt: a requeue keeps the job id (the dependency holds); a resubmission
gives a new one, and :func:`follow` (called by sync) moves the dependents onto it — ``scontrol update``
while they still wait, a fresh eval job where Slurm already killed them. A chain that ends early
(stopped, cancelled, out of budget) leaves none pending: Slurm kills dependents of an attempt that did
not end OK, and :func:`follow` scancels whatever is left of a chain sync saw end.

The gate: eval jobs are submitted with the training job they follow, under its admission (the same
spec hash, code snapshot and passing preflight), sized by :func:`_eval_options`; the eval job's own
resources are judged by the static checks that apply to it (:func:`judge_evals`: its QoS tier's GPU cap
and max wall, its loader's /dev/shm and host memory; it stages nothing, reading its held-out files in
place, so it needs no scratch), so a FAIL
refuses the submit before anything is written and names the eval job.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground import contract
from ground.errors import CheckFailed, UserError
from ground.units import format_duration, parse_duration, slurm_mem
from idmctl.core.checks import CheckResult, Measurements, PreflightContext, Status
from idmctl.core.job_options import JobOptions, JobRequest
from idmctl.job.code import JobCode
from idmctl.ops.executors import executor_for
from idmctl.record.eval_jobs import completed_evals, measured_eval
from idmctl.record.records import ChainStatus, JobRecord
from idmctl.record.store import JobStore, store

if TYPE_CHECKING:
    from ground.spec.loader import ResolvedSpec
    from ground.spec.schema import EvalResources
    from idmctl.job.effective import EffectiveJob
    from idmctl.ops.submit import Submitted

EARLY_END = (ChainStatus.FAILED, ChainStatus.CANCELLED)
"""Chain statuses that end it before its last checkpoint: its eval jobs are cancelled."""


def scheduled_steps(spec_steps: int, every: int) -> list[int]:
    """The checkpoints every run writes: each ``every`` steps and the last (preemptions add others)."""
    return sorted({*range(every, spec_steps + 1, every), spec_steps})


def plan(choice: str, job: "EffectiveJob") -> list[int]:
    """The checkpoint steps ``--eval choice`` evaluates; bad input (exit 2) before anything is written."""
    spec = job.resolved.spec
    if job.profile.scheduler != "slurm":
        raise UserError(f"--eval chains jobs with Slurm dependencies; profile {job.profile.name} runs jobs "
                        f"with the {job.profile.scheduler} executor", file="command line", field="--eval",
                        hint="submit to a Slurm cluster (--cluster), or evaluate by hand: "
                             "python -m trainers.eval_job --run-dir RUN_DIR --step N")
    if job.options.build:
        raise UserError("--eval evaluates a training chain; a build writes no checkpoints", file="command line",
                        field="--eval", hint="drop --eval or --build")
    # The trainer's interval (trainers.train.checkpoint_interval): the spec's, else the one derived at submit.
    every = spec.train.checkpoint_every or job.options.checkpoint_every or max(1, spec.train.steps // 10)
    scheduled = scheduled_steps(spec.train.steps, every)
    if choice == "last":
        return [spec.train.steps]
    if choice == "each":
        chosen = scheduled
    elif choice.isdigit() and int(choice) in scheduled:
        chosen = [int(choice)]
    else:
        shown = ", ".join(map(str, scheduled[:8])) + (" …" if len(scheduled) > 8 else "")
        raise UserError(f"--eval {choice!r} is not a checkpoint this run writes ({shown}; every {every} steps "
                        f"and the last)", file="command line", field="--eval",
                        hint=f"one of {', '.join(contract.EVAL_CHOICES)} or a step above")
    # The eval jobs start once the training attempt has ended; by then retention has pruned all but the
    # newest keep_last (and the best): an older chosen checkpoint would be gone.
    survivors = scheduled[-spec.train.keep_last:]
    if chosen[0] < survivors[0]:
        raise UserError(f"train.keep_last {spec.train.keep_last} keeps only steps {', '.join(map(str, survivors))} "
                        f"at the end of training; the eval of step {chosen[0]} would find its checkpoint pruned",
                        file=str(job.resolved.path), field="train.keep_last",
                        hint=f"set train.keep_last: {len(scheduled) - scheduled.index(chosen[0])} (one more for each "
                             "preemption checkpoint), or --eval last")
    return chosen


def submit_with_evals(experiment: str, request: JobRequest, cluster: str | None, choice: str,
                      force_reason: str | None = None, resume: int | None = None,
                      code_choice: str = "chain") -> "Submitted":
    """``submit EXP --eval CHOICE``: the training chain as :func:`idmctl.ops.submit.submit` sends it (or, with
    ``resume``, the new attempt :func:`idmctl.ops.submit.resume` sends), then one eval job per chosen
    checkpoint under the same admission and code snapshot. A resumed chain's checkpoints that one of its
    eval jobs already scored (COMPLETED) get none. A choice that names no checkpoint this run keeps is
    bad input before anything is written."""
    from idmctl.ops import submit as submitting  # sync imports this module; submit stays off its start-up

    job = submitting.prepare(experiment, request, cluster)
    steps = plan(choice, job)
    judged = judge_evals(job, steps)
    if force_reason is None and any(r.status is Status.FAIL for r in judged):
        from idmctl.gate.admission import Admission  # here: only a refused eval job shows its checks

        raise submitting.Refused(job, Admission(judged, None, 0.0, {}))
    evaluated = completed_evals(resume) if resume is not None else {}
    if resume is None:
        submitted = submitting.submit(experiment, request, cluster, force_reason=force_reason)
    else:
        submitted = submitting.resume(experiment, resume, request, cluster, code_choice, force_reason=force_reason)
    training = submitted.job
    script_path = Path(training.script_path or "")
    resolved = submitting._resolved_from_run(json.loads(script_path.with_name(contract.SPEC_FILE).read_text()),
                                             str(script_path))
    options = JobOptions(**{k: v for k, v in training.options.items() if k in JobOptions.__dataclass_fields__})
    submitted.evaluated = {step: evaluated[step] for step in steps if step in evaluated}
    own = resolved.spec.eval.resources
    measured = measured_eval(resolved.name, training.spec_hash or resolved.hash)
    after = str(training.scheduler_id)
    submitted.evals = [_submit_one(resolved, "slurm", _eval_options(options, step, after, own, measured),
                                   JobCode.from_record(dict(training.code) if training.code is not None else None),
                                   dict(training.admitted) if training.admitted is not None else None,
                                   {"of_chain": training.chain_id, "step": step, "after": after, "choice": choice},
                                   script_path.parent, training.preflight_id, training.forced_reason,
                                   training.spec_hash)
                       for step in steps if step not in evaluated]
    return submitted


EVAL_TIME_MARGIN = 2.0
"""A measured eval job's time limit: this × the seconds an earlier eval job of the same spec ran (a busier node,
a slower file system, the queue's start-up)."""
EVAL_MIN_TIME_S = 600.0
"""And at least this: a short evaluation still starts Python, verifies the snapshot and loads the checkpoint."""


def _eval_options(options: JobOptions, step: int, after: str, own: "EvalResources | None" = None,
                  measured: tuple[int, float] | None = None) -> JobOptions:
    """The training job's options sized for one evaluation process: one node, one task, at most one GPU (the
    evaluators run on rank 0 alone in training too), one training rank's share of the node's CPUs and
    memory (card A: 112 CPUs ÷ 8 = 14, 1600G ÷ 8 = 200G, not the whole node), the same QoS, and a time limit
    of :data:`EVAL_TIME_MARGIN` × what an earlier eval job of the spec ran (``measured``: its job id and
    seconds; at least :data:`EVAL_MIN_TIME_S`), else the training job's (unmeasured); ``eval.resources``
    (``own``) overrides each."""
    from ground.units import slurm_time  # here: only a measured eval time needs Slurm's form

    ranks = max(1, options.ranks_per_node)
    cpus = own.cpus if own and own.cpus else max(1, options.cpus_per_node // ranks)
    share_mib = -(-options.mem_mib // ranks)
    mem = own.mem if own and own.mem else slurm_mem(f"{share_mib}M")
    said = "eval.resources" if own else None
    if own and own.time_limit:
        time_limit, time_text = own.time_limit, f"{own.time_limit} ({said})"
    elif measured is not None:
        job_id, seconds = measured
        limit_s = max(EVAL_MIN_TIME_S, EVAL_TIME_MARGIN * seconds)
        time_limit = slurm_time(-(-limit_s // 60) * 60)
        time_text = (f"{EVAL_TIME_MARGIN:g} × {format_duration(seconds)} (eval job {job_id} of this spec, measured), at "
                     f"least {format_duration(EVAL_MIN_TIME_S)} → {time_limit}")
    else:
        time_limit = options.time_limit
        time_text = f"{time_limit} (the training job's: evaluator time unmeasured, no eval job of this spec ran yet)"
    derivation = [f"eval job: 1 process, {min(1, options.gpus_per_node)} GPU; CPUs "
                  + (f"{cpus} ({said})" if own and own.cpus else f"{options.cpus_per_node} ÷ {ranks} ranks = {cpus}")
                  + "; memory " + (f"{mem} ({said})" if own and own.mem else
                                   f"{slurm_mem(options.mem)} ÷ {ranks} ranks = {mem} (one training rank's share)")
                  + f"; time limit {time_text}"]
    return replace(options, job_name=f"{options.job_name}-eval-{step}", entry=contract.EVAL_ENTRY, eval_step=step,
                   nodes=1, ranks_per_node=1, gpus_per_node=min(1, options.gpus_per_node), retries=0, hold=False,
                   build=None, dependency=f"afterok:{after}", kill_on_invalid_dep=True, cpus_per_node=cpus, mem=mem,
                   time_limit=time_limit, derivation=derivation, launch="single")


def dry_run_evals(job: "EffectiveJob", choice: str, admitted: dict[str, Any],
                  code: JobCode | None) -> list[tuple[str, str]]:
    """``submit --dry-run --eval CHOICE``: (what, script) of each eval job the submit would send, sized as
    :func:`_eval_options` sizes them, waiting on job 0 (which stands in for the training job's id)."""
    from idmctl.ops.submit import (  # submit imports this module
        DRY_RUN_CHAIN_ID, DRY_RUN_JOB_ID, Attempt, render_attempt, runs_dir)

    out = []
    run_dir = runs_dir(job.resolved.name, DRY_RUN_CHAIN_ID, job.profile.runs_root)
    measured = measured_eval(job.declared.name, job.declared.hash)
    for step in plan(choice, job):
        options = _eval_options(job.options, step, DRY_RUN_JOB_ID, job.resolved.spec.eval.resources, measured)
        shown = Attempt(job.resolved, "slurm", options, DRY_RUN_CHAIN_ID, 1, job.declared.hash, None, None, admitted,
                        code, eval_of={"step": step}, run_dir=run_dir)
        out.append((f"eval job of step {step} (job {DRY_RUN_JOB_ID} stands in for the training job's id)",
                    render_attempt(shown).script))
    return out


EVAL_CHECKS = ("qos", "shm", "loader", "disk")
"""The static checks an eval job's own resources go through: the rest judge the spec or the training run
(introspection, io and cache read the same spec and files training does; the smoke is training's)."""


def eval_resolved(job: "EffectiveJob", options: JobOptions) -> "ResolvedSpec":
    """The effective spec with the eval job's resources (one node, one process, its GPUs, CPUs, memory, time
    limit): what its checks judge. Validated as any spec is (bad input names ``eval.resources``)."""
    from pydantic import ValidationError  # here: only a submit with --eval sizes an eval spec

    from ground.spec.loader import ResolvedSpec  # here: as above (the module's TYPE_CHECKING name)
    from ground.spec.schema import ExperimentSpec  # here: as above

    canonical = job.resolved.canonical
    own = {"nodes": 1, "gpus_per_node": options.gpus_per_node, "cpu_ranks": 1, "cpus": options.cpus_per_node,
           "mem": options.mem, "time_limit": options.time_limit}
    # It stages nothing (the job script's stage_in_none_eval): it reads its held-out files in place.
    stage = {**canonical["stage"], "enabled": False}
    try:
        spec = ExperimentSpec.model_validate({**canonical, "resources": {**canonical["resources"], **own},
                                              "stage": stage})
    except ValidationError as exc:
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise UserError(f"the eval job's resources are invalid: {message}", file=str(job.resolved.path),
                        field="eval.resources", hint="set eval.resources {cpus, mem, time_limit} the cluster allows") from exc
    return ResolvedSpec(name=job.resolved.name, path=job.resolved.path, spec=spec, chain=job.resolved.chain)


def judge_evals(job: "EffectiveJob", steps: list[int], measurements: Measurements | None = None) -> list[CheckResult]:
    """The eval jobs' own resources through :data:`EVAL_CHECKS`, one row per check named ``eval <check>``,
    its summary naming the eval jobs and what each asks for. They share one size (only the step differs),
    so they are judged once. ``measurements``: instead of gathering them (tests)."""
    from idmctl.gate import loader, shm  # here: only a submit with --eval judges eval jobs
    from idmctl.gate.check_list import run_check  # here: as above
    from idmctl.gate.runner import gather  # here: as above

    if not steps:
        return []
    options = _eval_options(job.options, steps[0], "0", job.resolved.spec.eval.resources,
                            measured_eval(job.declared.name, job.declared.hash))
    resolved = eval_resolved(job, options)
    measured = measurements if measurements is not None else gather(resolved, job.profile, None, memo_only=True)
    ctx = PreflightContext(resolved, job.profile, replace(measured, smoke=None))
    which = (f"eval job of step {steps[0]}" if len(steps) == 1
             else f"eval jobs of steps {', '.join(map(str, steps))}")
    size = (f"{options.gpus_per_node} GPU, {options.cpus_per_node} CPUs, {options.mem}, "
            f"{options.time_limit or 'no time limit'}")
    rows = [_eval_qos(ctx, options), run_check(shm, ctx), run_check(loader, ctx), _eval_disk(job)]
    return [replace(row, name=f"eval {name}", summary=f"{which} ({size}): {row.summary}")
            for name, row in zip(EVAL_CHECKS, rows)]


def _eval_disk(job: "EffectiveJob") -> CheckResult:
    """An eval job copies nothing to the node: it reads its held-out files in place (no scratch needed)."""
    data = job.resolved.spec.data
    if not job.resolved.spec.stage.enabled:
        summary = f"no stage-in (stage.enabled false): reads {data.cache_root} in place, as training does"
    else:
        summary = (f"no stage-in: reads the files of its held-out split {data.eval_split!r} in place under {data.cache_root} "
                   f"(training copies the cache to {job.resolved.spec.stage.dest}; the eval job needs no scratch)")
    return CheckResult("disk", Status.PASS, summary, {"stage_bytes": 0})


def _eval_qos(ctx: PreflightContext, options: JobOptions) -> CheckResult:
    """The eval job against its QoS tier: the tier exists, its GPU cap, its max wall (on a preemptible tier it is
    requeued and starts over: it writes no checkpoint to resume from)."""
    qos = ctx.spec.resources.qos
    tier = ctx.profile.qos.get(qos)
    if tier is None:
        return CheckResult("qos", Status.FAIL, f"QoS {qos!r} does not exist on cluster {ctx.profile.name}", {},
                           f"use one of: {', '.join(ctx.profile.qos)}")
    gpus, fails, fixes, notes = options.gpus_per_node, [], [], []
    numbers: dict[str, object] = {"qos": qos, "gpus": gpus, "max_gpus": tier.max_gpus,
                                  "max_wall_s": tier.max_wall_seconds}
    if tier.max_gpus is not None and gpus > tier.max_gpus:
        fails.append(f"{gpus} GPU > {qos} max {tier.max_gpus}")
        fixes.append("use a QoS that allows a GPU")
    else:
        notes.append(f"{gpus} GPU ≤ max {tier.max_gpus if tier.max_gpus is not None else 'unlimited'}")
    if options.time_limit:
        limit_s = parse_duration(options.time_limit)
        numbers["time_limit_s"] = limit_s
        if limit_s > tier.max_wall_seconds:
            fails.append(f"time limit {options.time_limit} > {qos} max wall {tier.max_wall}")
            fixes.append(f"set eval.resources.time_limit ≤ {tier.max_wall}")
        else:
            notes.append(f"time limit {options.time_limit} ≤ max wall {tier.max_wall}")
    if tier.preemptible:
        # It stages nothing, so a preemption costs the evaluation done so far, not a stage-in.
        notes.append(f"preemptible {qos}: a preemption requeues it and the evaluation starts over")
    if fails:
        return CheckResult("qos", Status.FAIL, "; ".join(fails + notes), numbers, "; ".join(fixes))
    return CheckResult("qos", Status.PASS, f"{qos}: " + "; ".join(notes), numbers)


def _submit_one(resolved: "ResolvedSpec", scheduler: str, options: JobOptions, code: JobCode | None,
                admitted: dict[str, Any] | None, link: dict[str, Any], run_dir: Path, preflight_id: int | None,
                forced: str | None, spec_hash: str | None) -> JobRecord:
    """Its own chain row (retries 0); the script and log in the training chain's run directory. Sent by the
    path every job takes (``ops.submit.send``): rendered once, no verdict first (the training job's was asked)."""
    from idmctl.ops.submit import Attempt, render_attempt, send  # submit imports this module: the cycle is broken here

    jobs = store()
    chain_id = jobs.open_chain(resolved.name, spec_hash or resolved.hash, 0).id
    job, _ = send(render_attempt(Attempt(resolved, scheduler, options, chain_id, 1, spec_hash or resolved.hash,
                                         preflight_id, forced, admitted, code, eval_of=link, run_dir=run_dir)), jobs)
    return job


# -- sync: dependents follow the chain -----------------------------------------------------------

def follow(resubmitted: list[tuple[int, int]], finished: list[int]) -> list[str]:
    """After sync decided (``resubmitted``: (old, new) job ids; ``finished``: the jobs that ended): eval
    jobs waiting on a resubmitted attempt wait on its successor instead, and those of a chain that ended
    early are cancelled. Returns one line per action (sync's report)."""
    if not resubmitted and not finished:
        return []
    jobs = store()
    done: list[str] = []
    moves: list[tuple[JobRecord, JobRecord]] = []
    cancels: list[JobRecord] = []
    for old_id, new_id in resubmitted:
        old, new = jobs.job(old_id), jobs.job(new_id)
        if old is None or new is None or old.chain_id is None or old.eval_link is not None:
            continue
        for dependent in jobs.eval_jobs(old.chain_id):
            link = dependent.eval_link
            if link is not None and link.after == old.scheduler_id and not link.moved_to:
                moves.append((dependent, new))
    for job_id in finished:
        ended = jobs.job(job_id)
        chain = jobs.chain(ended.chain_id) if ended is not None and ended.chain_id else None
        if ended is None or chain is None or chain.status not in EARLY_END or ended.eval_link is not None:
            continue
        for dependent in jobs.eval_jobs(chain.id):
            if dependent.scheduler_id and not dependent.is_terminal and dependent.started_at is None:
                cancels.append(dependent)
    for dependent, new in moves:
        done.append(_move(jobs, dependent, new))
    for dependent in cancels:
        try:
            executor_for(dependent.executor).cancel(dependent.scheduler_id or "")
            done.append(f"eval job {dependent.id}: cancelled, its training chain ended early")
        except CheckFailed as exc:  # already gone (Slurm's kill-on-invalid-dep got there first)
            done.append(f"eval job {dependent.id}: {exc}")
    return done


def _move(jobs: JobStore, dependent: JobRecord, new: JobRecord) -> str:
    """Wait on ``new`` instead: ``scontrol update`` while it is pending, else a fresh eval job."""
    from idmctl.ops.executors.slurm import _run  # scontrol, as the executor runs it (its timeout and env)

    link = dependent.eval_link
    assert link is not None, f"job {dependent.id} is not an eval job"
    after = str(new.scheduler_id)
    if not dependent.is_terminal and dependent.started_at is None:
        result = _run(["scontrol", "update", f"JobId={dependent.scheduler_id}", f"Dependency=afterok:{after}"])
        if result.returncode == 0:
            jobs.relinked(dependent.id, replace(link, after=after))
            return f"eval job {dependent.id}: now waits on job {new.id} ({new.scheduler_id})"
    if dependent.started_at is not None:
        return f"eval job {dependent.id}: ran already, not moved"
    # Killed by Slurm when its attempt did not end OK (or it can no longer be updated): submit it again.
    from idmctl.ops.submit import _resolved_from_run  # the spec exactly as the chain started with it

    run_dir = Path(dependent.script_path or "").parent
    resolved = _resolved_from_run(json.loads((run_dir / contract.SPEC_FILE).read_text()), str(run_dir / contract.SPEC_FILE))
    options = JobOptions(**{k: v for k, v in dependent.options.items() if k in JobOptions.__dataclass_fields__})
    options = replace(options, dependency=f"afterok:{after}")
    fresh = _submit_one(resolved, "slurm" if dependent.executor == "slurm" else "local", options,
                        JobCode.from_record(dict(dependent.code) if dependent.code is not None else None),
                        dict(dependent.admitted) if dependent.admitted is not None else None,
                        {**link.as_dict(), "after": after, "replaces": dependent.id}, run_dir,
                        dependent.preflight_id, dependent.forced_reason, dependent.spec_hash)
    jobs.relinked(dependent.id, replace(link, moved_to=fresh.id))
    if not dependent.is_terminal:
        try:
            executor_for(dependent.executor).cancel(dependent.scheduler_id or "")
        except CheckFailed:
            pass  # gone already: Slurm's kill-on-invalid-dep
    return f"eval job {dependent.id}: re-submitted as eval job {fresh.id} ({fresh.scheduler_id}) waiting on job {new.id}"

"""``idmctl submit|sync|jobs|watch|cancel``: run jobs on Slurm (or the local executor) and follow them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from ground.errors import CheckFailed, UserError
from idmctl.core.job_state import JobState
from idmctl.cli.commands import job_flags, options
from idmctl.cli.output import console, emit_json, err_console, make_table
from idmctl.record.stored_json import eval_link, job_options
from ground.units import format_duration

if TYPE_CHECKING:
    from collections.abc import Collection

    from idmctl.core.job_options import JobRequest
    from idmctl.plan.efficiency import EfficiencyReport, Suggestion



def submit(
    experiment: options.Experiment,
    qos: job_flags.Qos = None,
    gres: job_flags.Gres = None,
    cpus: job_flags.Cpus = None,
    mem: job_flags.Mem = None,
    exclude: job_flags.Exclude = None,
    job_name: job_flags.JobName = None,
    time_limit: job_flags.Time = None,
    retries: job_flags.Retries = None,
    entry: job_flags.Entry = None,
    build: job_flags.Build = None,
    account: job_flags.Account = None,
    partition: job_flags.Partition = None,
    constraint: job_flags.Constraint = None,
    reservation: job_flags.Reservation = None,
    gpus_per_node: job_flags.GpusPerNode = None,
    hold: Annotated[bool, typer.Option("--hold", help="Submit held (Slurm's --hold); the job waits for `scontrol release ID`.")] = False,
    resume: Annotated[int | None, typer.Option("--resume", **options.JOB_ID, help="A new attempt of ended chain N: its checkpoints, its MLflow run, its code snapshot.")] = None,
    code: Annotated[str, typer.Option("--code", help="With --resume: chain (its snapshot) or current (move the chain to the tree as it is now).")] = "chain",
    evaluate: Annotated[str | None, typer.Option("--eval", help="Also an evaluation job per checkpoint: last, a step, or each; each waits on the training job (Slurm dependency) and logs into its MLflow run.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the batch script (and on stderr the checks); submit nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Submit without a passing preflight or despite a FAIL (needs --reason).")] = False,
    reason: Annotated[str | None, typer.Option("--reason", help="Why the preflight gate is bypassed (recorded).")] = None,
    cluster: options.Cluster = None,
    as_json: options.Json = False,
) -> None:
    """Render the batch script from the spec (flags override its defaults), check the job as it will
    run, and submit it."""
    from idmctl.cli.commands.preflight import print_checks
    from idmctl.ops import submit as submitting
    from idmctl.ops.verdict import SchedulerRefused

    request = job_flags.flags(qos, gres, cpus, mem, exclude, job_name, time_limit, retries, entry, build, hold,
                              account=account, partition=partition, constraint=constraint, reservation=reservation,
                              gpus_per_node=gpus_per_node)
    from ground.spec.loader import load_experiments, names_a_sweep

    if code != "chain" and resume is None:
        raise UserError("--code goes with --resume", file="command line", field="--code",
                        hint="a new submission always runs the tree as it is now")
    if resume is not None and dry_run:
        raise UserError("--dry-run does not go with --resume", file="command line", field="--dry-run",
                        hint="dry-run the experiment itself: the script differs only in its chain and attempt")

    variants = load_experiments(experiment)
    if evaluate is not None and variants[0].sweep is not None:
        raise UserError("--eval submits one chain's eval jobs, not a sweep's", file="command line", field="--eval",
                        hint="submit each variant with --eval")
    if names_a_sweep(experiment, variants):
        if force and not (reason and reason.strip()):
            raise UserError("--force needs --reason", file="command line", field="--reason", hint='e.g. --reason "smoke passed on login node"')
        _submit_sweep(experiment, [v.name.rsplit(".", 1)[1] for v in variants], request, cluster, dry_run,
                      reason.strip() if force and reason else None, as_json)
        return
    if dry_run:
        planned = submitting.dry_run(experiment, request, cluster)
        evals: list[tuple[str, str]] = []
        judged = list(planned.admission.results)
        if evaluate is not None:
            from idmctl.ops import eval_jobs  # start-up: only --dry-run --eval plans eval jobs

            evals = eval_jobs.dry_run_evals(planned.job, evaluate, planned.admitted, planned.code)
            judged += eval_jobs.judge_evals(planned.job, eval_jobs.plan(evaluate, planned.job))
        failed = [r.name for r in judged if r.status.value == "FAIL"]
        print_checks(judged, f"submit-time checks: {planned.job.declared.name} on "
                     f"{planned.job.profile.name}", err=True)
        verdict = f"submit would be refused: {', '.join(failed)} FAIL" if failed else "submit-time checks pass"
        err_console.print(f"{verdict} ({planned.admission.seconds * 1000:.0f} ms)", markup=False)
        err_console.print(planned.verdict.line(), markup=False)
        if planned.verdict.asked and not planned.verdict.accepted:
            from idmctl.ops.verdict import fix_for  # start-up: only a refused dry-run prints a fix

            err_console.print(f"fix: {fix_for(planned.verdict.words) or 'the QoS, partition, account or limit it names'}",
                              markup=False)
        typer.echo(planned.script, nl=False)
        for what, script in [*evals, *planned.others]:  # after the first script's commands: sbatch reads only its header
            typer.echo(f"\n# ==== idmctl: then the {what} ====\n{script}", nl=False)
        return
    if force and not (reason and reason.strip()):
        raise UserError("--force needs --reason", file="command line", field="--reason", hint='e.g. --reason "smoke passed on login node"')
    try:
        forced = reason.strip() if force and reason else None
        if evaluate is not None:
            from idmctl.ops.eval_jobs import submit_with_evals  # only a submit with --eval loads it

            done = submit_with_evals(experiment, request, cluster, evaluate, force_reason=forced, resume=resume,
                                     code_choice=code)
        elif resume is not None:
            done = submitting.resume(experiment, resume, request, cluster, code, force_reason=forced)
        else:
            done = submitting.submit(experiment, request, cluster, force_reason=forced)
    except submitting.Refused as refused:
        if as_json:
            emit_json({"refused": True, **refused.admission.as_dict()})
        else:
            print_checks(refused.admission.results, f"submit refused: {refused.job.declared.name} on "
                         f"{refused.job.profile.name}, the job as submitted", err=True)
        raise CheckFailed(f"submit refused: {', '.join(refused.admission.failed)} FAIL on the job as submitted "
                          "(table above); fix the flag or the spec, or preflight the job with these flags") from None
    except SchedulerRefused as refused:
        if as_json:
            emit_json({"refused": True, "scheduler": refused.verdict.command, "words": refused.verdict.words})
        raise
    job = done.job
    if as_json:
        emit_json({"job": job.id, "chain": job.chain_id, "scheduler_id": job.scheduler_id, "executor": job.executor,
                   "script": job.script_path, "log": job.log_path, "forced": job.forced_reason is not None,
                   "evals": [{"job": e.id, "scheduler_id": e.scheduler_id,
                              "step": e.eval_link.step if e.eval_link else None} for e in done.evals],
                   "evaluated": [{"step": step, "job": job_id} for step, job_id in done.evaluated.items()],
                   "suggestions": [s.__dict__ for s in _suggestions(job.experiment, dict(job.options))[1]]})
        return
    console.print(f"submitted job {job.id} ({job.executor} {job.scheduler_id}) chain {job.chain_id} attempt {job.attempt}"
                  f"  qos {job.qos}  retries {done.chain.retries_budget}", markup=False)
    console.print(f"script {job.script_path}", markup=False)
    console.print(f"log    {job.log_path}", markup=False)
    for evaluation in done.evals:
        link = evaluation.eval_link
        assert link is not None, f"eval job {evaluation.id} was sent without its link"
        console.print(f"eval job {evaluation.id} ({evaluation.executor} {evaluation.scheduler_id}) checkpoint step "
                      f"{link.step}: after job {job.id} ends OK (afterok:{link.after})",
                      markup=False)
    for step, scored_by in done.evaluated.items():
        console.print(f"checkpoint step {step}: scored already by eval job {scored_by} of chain {job.chain_id}, "
                      "no new eval job", markup=False)
    if job.forced_reason:
        failed = (job.admitted or {}).get("admission", {}).get("failed", [])
        past = f" and past FAILs ({', '.join(failed)})" if failed else ""
        console.print(f"FORCED without preflight{past}: {job.forced_reason}", markup=False)
    _print_suggestions(job.experiment, dict(job.options))


def _suggestions(experiment: str, options: dict) -> tuple["EfficiencyReport | None", list["Suggestion"]]:
    """The last efficiency report of the experiment and its suggestions the new job has not taken."""
    from idmctl.plan.efficiency import last_report, still_apply

    report = last_report(experiment)
    return report, (still_apply(report, options) if report else [])


def _print_suggestions(experiment: str, options: dict[str, object]) -> None:
    """What the last ended job of this experiment says the next one should ask for (its efficiency report)."""
    report, suggestions = _suggestions(experiment, options)
    if not report or not suggestions:
        return
    console.print(f"from the efficiency report of job {report.job} (`idmctl jobs show` for all of it):", markup=False)
    for suggestion in suggestions:
        console.print(f"  suggest {suggestion.line()}", markup=False)


def _submit_sweep(reference: str, variant_names: list[str], request: JobRequest, cluster: str | None, dry_run: bool,
                  force_reason: str | None, as_json: bool) -> None:
    """Every variant that passes its own gate, each as its own chain (own hash, run directory, MLflow run);
    a variant without a passing preflight is skipped and named, the others still go."""
    from idmctl.ops import submit as submitting

    refs = [f"{reference}.{name}" for name in variant_names]  # `<sweep name or file>.<variant>` resolves a variant
    if dry_run:
        for ref in refs:
            typer.echo(f"# ---- variant {ref} ----")
            planned = submitting.dry_run(ref, request, cluster)
            err_console.print(f"{ref}: {planned.verdict.line()}", markup=False)
            typer.echo(planned.script, nl=False)
        return
    done, skipped = [], []
    for ref in refs:
        try:
            done.append(submitting.submit(ref, request, cluster, force_reason=force_reason))
        except CheckFailed as exc:
            skipped.append((ref, str(exc)))
    if as_json:
        emit_json({"submitted": [{"experiment": d.job.experiment, "job": d.job.id, "chain": d.job.chain_id,
                                  "scheduler_id": d.job.scheduler_id, "script": d.job.script_path, "log": d.job.log_path}
                                 for d in done],
                   "skipped": [{"variant": ref, "why": why} for ref, why in skipped]})
    else:
        for d in done:
            console.print(f"submitted {d.job.experiment}: job {d.job.id} ({d.job.executor} {d.job.scheduler_id}) "
                          f"chain {d.job.chain_id}", markup=False)
        for ref, why in skipped:
            console.print(f"skipped {ref}: {why}", markup=False)
    if not done:
        raise CheckFailed(f"no variant of {reference} was submitted")


def sync(
    no_retry: Annotated[bool, typer.Option("--no-retry", help="Update records only; resubmit nothing.")] = False,
    chain: Annotated[int | None, typer.Option("--chain", **options.JOB_ID, help="Only this chain's jobs (what its controller job runs).")] = None,
    controller_for: Annotated[str | None, typer.Option("--controller-for", hidden=True,
                                                       help="Run as the controller job that followed this attempt.")] = None,
    as_json: options.Json = False,
) -> None:
    """Update every unfinished job with one scheduler call; retry ended ones by cause."""
    from idmctl.ops.sync import sync as run_sync

    if controller_for is not None:
        from idmctl.ops.controller_run import run_controller  # only inside a controller job

        if chain is None:
            raise UserError("--controller-for needs --chain", file="command line", field="--chain",
                            hint="the controller job's script passes both")
        ran = run_controller(chain, controller_for)
        console.print(f"controller for chain {ran.chain_id} after job {ran.after}: {ran.result}"
                      + (f"; re-armed as job {ran.rearmed}" if ran.rearmed else "")
                      + (f"; cancelled controllers {', '.join(ran.cancelled)}" if ran.cancelled else ""), markup=False)
        return
    report = _sync_or_say_who_did_not_answer(run_sync, retry=not no_retry, chain_id=chain)
    if as_json:
        emit_json({"checked": report.checked, "changed": report.changed, "finished": report.finished,
                   "resubmitted": report.resubmitted, "stopped": report.stopped, "unconfirmed": report.unconfirmed, "evals": report.evals,
                   "hung": report.hung, "elsewhere": report.elsewhere})
        return
    unconfirmed = f", {len(report.unconfirmed)} unconfirmed (squeue says ended; sacct has not recorded it yet)" \
        if report.unconfirmed else ""
    console.print(f"synced {report.checked} unfinished jobs: {len(report.changed)} changed, {len(report.finished)} ended"
                  f"{unconfirmed}", markup=False)
    for old, new in report.resubmitted:
        console.print(f"  job {old} → resubmitted as job {new}", markup=False)
    for job_id, why in report.stopped:
        console.print(f"  job {job_id}: chain stopped — {why}", markup=False)
    for line in report.evals:
        console.print(f"  {line}", markup=False)
    for job_id in report.elsewhere:
        console.print(f"  job {job_id}: ended; another sync running at the same time recorded and decided it",
                      markup=False)
    for job_id in report.hung:
        console.print(f"  job {job_id}: hang — no heartbeat past its threshold (`idmctl failures`); its watchdog "
                      "kills it and the chain resumes elsewhere", markup=False)


def _sync_or_say_who_did_not_answer(run_sync, **kwargs):  # type: ignore[no-untyped-def]
    """A daemon that does not answer is exit 1 with one line naming it; the store is left as it was."""
    from idmctl.core.executor import SchedulerUnreachable

    try:
        return run_sync(**kwargs)
    except SchedulerUnreachable as exc:
        raise CheckFailed(f"error: {exc}; no job record changed (sync again once {exc.daemon} answers; "
                          "runbook: When Slurm is unreachable)") from exc


def jobs(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", **options.ROW_LIMIT, help="Newest N jobs.")] = 30,
    ui_url: Annotated[str, typer.Option("--ui-url", help="Where `idmctl ui` serves, for the run links.")] = "http://127.0.0.1:5000",
    as_json: options.Json = False,
    user: Annotated[str | None, typer.Option("--user", help="Only jobs this user submitted (a team's shared store holds everyone's).")] = None,
) -> None:
    """Recorded jobs, newest first: state as the scheduler reports it, queue wait, restarts, MLflow run."""
    if ctx.invoked_subcommand is not None:
        return
    from ground.paths import db_path
    from idmctl.track.compare import run_url
    from idmctl.plan.eta import eta_for_job
    from idmctl.ops.listing import queue_wait_seconds
    from idmctl.record.jobs import newest_jobs

    rows, chains = newest_jobs(db_path(), limit, user)
    run_of_chain = {cid: c.mlflow_run_id for cid, c in chains.items()}
    now = time.time()
    etas = {j.id: eta_for_job(j, chains.get(j.chain_id), now) for j in rows if j.state == JobState.RUNNING}
    records = [{
        "job": j.id, "chain": j.chain_id, "attempt": j.attempt, "experiment": j.experiment, "executor": j.executor,
        "scheduler_id": j.scheduler_id, "state": j.state, "reason": j.reason, "exit_code": j.exit_code,
        "restarts": j.restarts, "qos": j.qos, "nodes": j.node_list, "queue_wait_s": queue_wait_seconds(j),
        "submitted_at": j.submitted_at, "started_at": j.started_at, "ended_at": j.ended_at,
        "forced": j.forced_reason, "user": j.user, "host": j.host, "mlflow_run_id": run_of_chain.get(j.chain_id),
        "run_url": run_url(run_of_chain[j.chain_id], ui_url) if run_of_chain.get(j.chain_id) else None,
        "build": job_options(j.options_json, j.id).get("build"),
        "eval": eval_link(j),
        "eta": etas[j.id].as_dict() if etas.get(j.id) else None,
        "controller": j.controller,
    } for j in rows]
    if as_json:
        emit_json(records)
        return
    table = make_table("job", "chain/att", "experiment", "id", "state", "exit", "restarts", "qos", "nodes", "queue wait",
                       "step", "s/step", "ETA", "MLflow run")
    for r in records:
        wait = format_duration(r["queue_wait_s"]) if r["queue_wait_s"] is not None else "—"
        eta = etas.get(r["job"])
        experiment = f"{r['experiment']} (build {r['build']})" if r["build"] else r["experiment"]
        if r["eval"]:
            experiment = f"{r['experiment']} (eval step {r['eval'].get('step')} of chain {r['eval'].get('of_chain')})"
        table.add_row(str(r["job"]), f"{r['chain']}/{r['attempt']}", experiment, r["scheduler_id"] or "—",
                      r["state"], r["exit_code"] or "—", str(r["restarts"]), r["qos"] or "—", r["nodes"] or "—", wait,
                      eta.progress_text if eta else "—", _rate(eta), eta.finish_text(now) if eta else "—",
                      r["run_url"] or "—")
    console.print(table)
    followed = [r for r in records if isinstance(r["controller"], dict)]
    if followed:
        from idmctl.ops.controller import controller_line  # only a store whose chains have controller jobs

        for r in followed:
            console.print(f"job {r['job']} (chain {r['chain']}/{r['attempt']}): {controller_line(r['controller'])}",
                          markup=False)


def _rate(eta: object) -> str:
    from idmctl.plan.budget import fmt_seconds

    rate = getattr(eta, "s_per_step", None)
    return f"{fmt_seconds(rate)} (last {getattr(eta, 'window_steps')})" if rate is not None else "—"


def print_etas(now: float | None = None) -> None:
    """One line per running job with a progress file: step/total, s/step, ETA against the limit."""
    from idmctl.plan.eta import eta_for_job
    from idmctl.record.jobs import running_jobs

    now = now if now is not None else time.time()
    running, chains = running_jobs()
    for job in running:
        eta = eta_for_job(job, chains.get(job.chain_id), now)
        if eta is not None:
            console.print(f"  job {job.id} {job.experiment}: step {eta.progress_text}, {_rate(eta)}, "
                          f"{eta.finish_text(now)}", markup=False)


def watch(
    interval: Annotated[float, typer.Option("--interval", **options.INTERVAL, help="Seconds between syncs.")] = 30.0,
    count: Annotated[int, typer.Option("--count", **options.COUNT, help="Stop after N syncs (0 = until every job ended).")] = 0,
) -> None:
    """Sync on an interval until every job has ended (or --count syncs)."""
    from idmctl.ops.sync import sync as run_sync, unfinished_jobs

    if not interval > 0:
        raise UserError("must be positive", file="command line", field="--interval", hint="e.g. --interval 30")
    done = 0
    while True:
        report = _sync_or_say_who_did_not_answer(run_sync)
        done += 1
        left = len(unfinished_jobs())
        console.print(f"[{time.strftime('%H:%M:%S')}] {report.checked} checked, {len(report.finished)} ended, "
                      f"{len(report.resubmitted)} resubmitted, {left} unfinished"
                      + (f" ({len(report.unconfirmed)} waiting for sacct)" if report.unconfirmed else ""), markup=False)
        print_etas()
        if (count and done >= count) or (not count and left == 0):
            return
        time.sleep(interval)


def cancel(job: Annotated[int, typer.Argument(**options.JOB_ID, help="idmctl job id (see `idmctl jobs`).")]) -> None:
    """Cancel a job and stop its chain from retrying."""
    from idmctl.ops.executors import executor_for
    from idmctl.record.store import RowRefused, store  # start-up: only cancel writes; its driver loads when used

    jobs_store = store()
    found = jobs_store.job(job)
    if found is None or found.scheduler_id is None:
        raise UserError(f"no submitted job {job}", field="JOB", hint="see `idmctl jobs`")
    if found.is_terminal:
        raise CheckFailed(f"job {job} already ended {found.state_text}")
    owner, scheduler_id = found.user or "another user", found.scheduler_id
    try:
        row, chain = jobs_store.cancelling(job)  # first: a sync between scancel and this mark would retry the chain
    except RowRefused:  # the team store's policies: a colleague's chain is theirs to change
        raise CheckFailed(f"error: cannot cancel job {job}: it is {owner}'s, and the team's store lets only its owner "
                          f"change its chain (row-level security); nothing cancelled or recorded") from None
    try:
        executor_for(row.executor).cancel(scheduler_id)
    except CheckFailed as exc:  # Slurm refused: the chain goes back to what it was, nothing recorded
        if chain is not None:
            jobs_store.cancel_refused(chain.id, chain.status)
        if "Access/permission denied" not in str(exc):
            raise
        raise CheckFailed(f"error: cannot cancel job {job} (Slurm job {scheduler_id}): it is {owner}'s, and Slurm "
                          f"lets only its owner or an operator cancel it (scancel: Access/permission denied); "
                          f"nothing recorded") from None
    console.print(f"cancelled job {job} ({row.executor} {scheduler_id})", markup=False)


def register(app: typer.Typer, names: "Collection[str] | None" = None) -> None:
    """Add submit, sync, watch, cancel and the ``jobs`` group to ``app``; ``names``: only those (the CLI
    builds just the command it runs)."""
    for command in (submit, sync, watch, cancel):
        if names is None or command.__name__ in names:
            app.command(command.__name__)(command)
    if names is not None and "jobs" not in names:
        return
    # `idmctl jobs` lists; `idmctl jobs import` pulls sacct history (a group whose callback is the listing).
    from idmctl.cli.commands.failures import jobs_import

    jobs_app = typer.Typer(invoke_without_command=True, help="Recorded jobs; `jobs import` pulls sacct history.")
    jobs_app.callback()(jobs)
    jobs_app.command("import")(jobs_import)
    from idmctl.cli.commands.job_show import show

    jobs_app.command("show")(show)
    app.add_typer(jobs_app, name="jobs")

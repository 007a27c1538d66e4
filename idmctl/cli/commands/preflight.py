"""``idmctl preflight EXP``: every check, one row each, recorded; exit 1 when any FAILs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ground.errors import CheckFailed, UserError
from idmctl.cli.commands import job_flags, options
from idmctl.core.job_options import flag_of, resource_of
from idmctl.cli.output import console, emit_json, err_console, make_table, styled

if TYPE_CHECKING:
    from idmctl.core.checks import CheckResult

def print_checks(results: "list[CheckResult]", title: str, err: bool = False) -> None:
    """One row per check: the table preflight prints, and submit prints when it refuses."""
    table = make_table("check", "status", "numbers and reason", "fix", title=title)
    for result in results:
        status = result.status.value
        table.add_row(result.name, styled(status), result.summary, result.fix or "")
    (err_console if err else console).print(table)


def preflight(
    experiment: options.Experiment,
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="Static checks only (cannot unlock submit).")] = False,
    smoke_on: Annotated[str, typer.Option("--smoke-on", help="Where the smoke runs: here (this host) or cluster (a "
                                          "short job on the profile's smoke_job: its QoS, partition and GPUs, waited "
                                          "for within --smoke-timeout, queue included).")] = "here",
    as_json: options.Json = False,
    cluster: options.Cluster = None,
    smoke_timeout: Annotated[float, typer.Option("--smoke-timeout", **options.SMOKE_TIMEOUT, help="Seconds before the smoke is killed.")] = 300.0,
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
    what_if: Annotated[list[str] | None, typer.Option(
        "--what-if", help="section.field=value: rerun the static checks on the altered spec (never edited, "
                          "nothing recorded) beside the original. Repeatable.")] = None,
) -> None:
    """Run the mandatory gate: spec, introspection, loader, shm, io, qos, disk, cache, smoke.

    Submit's flags check the job as it will be submitted; --gres and --entry change what the smoke
    measures, so a submit with them needs a preflight with them. A sweep runs every variant in one
    table; --what-if reruns the static checks on an altered spec beside the original. --build MODE runs
    the build preflight (weights, PT norm file, output disk, a 1-file encode smoke → wall-clock estimate
    vs --time)."""
    from ground.spec.loader import load_experiments, names_a_sweep  # start-up: pulls pydantic and yaml
    from idmctl.job.effective import build as build_job  # start-up: pulls pydantic and yaml
    from idmctl.gate.runner import run_preflight  # start-up: pulls pydantic and yaml
    from idmctl.core.profile import load_profile  # start-up: pulls pydantic

    if smoke_on not in ("here", "cluster"):
        raise UserError(f"--smoke-on {smoke_on!r} is not a place the smoke runs", field="--smoke-on",
                        hint="here (this host) or cluster (a job on the profile's smoke_job)")
    variants = load_experiments(experiment)
    request = job_flags.flags(qos, gres, cpus, mem, exclude, job_name, time_limit, retries, entry, build,
                              account=account, partition=partition, constraint=constraint, reservation=reservation,
                              gpus_per_node=gpus_per_node)
    is_sweep = names_a_sweep(experiment, variants)
    if smoke_on == "cluster" and (is_sweep or what_if or build):
        raise UserError("--smoke-on cluster smokes one training job", field="--smoke-on",
                        hint="preflight the one experiment (no sweep, --what-if or --build) with it")
    if request.given_fields() and (is_sweep or what_if):
        # A sweep's table and --what-if check the spec's own resources: a flag here would be dropped unseen.
        given = " ".join(f"{flag} {','.join(value) if isinstance(value, list) else value}"
                         for flag, value in request.given().items())
        resource = next((resource_of(name) for name in request.given_fields() if resource_of(name)), None)
        raise UserError(f"{given} applies to one job's preflight, not to {'a sweep' if is_sweep else '--what-if'}",
                        field=flag_of(request.given_fields()[0]),
                        hint=(f"pass it as --what-if resources.{resource}=VALUE" if resource else
                              "run the preflight of one variant (EXP/VARIANT) with it"))
    if is_sweep:
        profile, profile_hash = load_profile(cluster)
        if what_if:
            from idmctl.plan.whatif import apply_overrides, parse_override  # start-up: pulls pydantic and yaml

            overrides = dict(parse_override(text) for text in what_if)
            variants = [apply_overrides(v, overrides, name=v.name, sweep=v.sweep, axes=v.axes) for v in variants]
        from idmctl.cli.sweep_report import run_sweep_preflight  # start-up: pulls pydantic and yaml

        run_sweep_preflight(variants, profile, profile_hash, with_smoke=not no_smoke and not what_if,
                            smoke_timeout_s=smoke_timeout, as_json=as_json)
        return
    if what_if:
        from idmctl.cli.whatif_report import run_what_if  # start-up: pulls pydantic and yaml

        profile, profile_hash = load_profile(cluster)
        run_what_if(variants[0], profile, profile_hash, what_if, as_json=as_json)
        return
    from idmctl.record.preflights import version_for  # looked up here, as run_preflight does

    version = version_for(variants[0].spec)  # once: the limits derivation and the checks both use it
    job = build_job(experiment, request, cluster, version)
    resolved, profile, profile_hash = job.declared, job.profile, job.profile_hash
    if job.options.build:  # the build preflight: weights, PT norm file, output disk, 1-file encode smoke
        from cache.build_plan import check_mode  # start-up: pulls pydantic and yaml
        from idmctl.gate.build import run_build_preflight  # start-up: pulls pydantic and yaml

        check_mode(job.resolved, job.options.build)
        report = run_build_preflight(job, with_smoke=not no_smoke, timeout_s=smoke_timeout)
    else:
        report = run_preflight(resolved, profile, profile_hash, with_smoke=not no_smoke, smoke_timeout_s=smoke_timeout,
                               job=job, version=version, introspect_aside=True, smoke_on_cluster=smoke_on == "cluster")
    if as_json:
        emit_json(report.as_dict())
    else:
        shown = "".join(f" {job.shown(name)}" for name in job.request.given_fields())
        print_checks(report.results, f"preflight {resolved.name}{shown} on {profile.name}")
        verdict = ("FAIL: " + ", ".join(report.failed) if report.failed
                   else "PASS (submit unlocked)" if report.unlocks_submit else "PASS, static only (submit stays locked)")
        console.print(f"preflight #{report.run_id} {verdict} — spec {resolved.short_hash}, code {report.code_version}, "
                      f"cluster {profile.name} ({profile_hash[:12]}), {report.seconds:.1f} s", markup=False)
    if report.failed:
        raise CheckFailed(f"preflight failed: {', '.join(report.failed)}")

"""``idmctl preflight EXP``: every check, one row each, recorded; exit 1 when any FAILs."""

from __future__ import annotations

from typing import Annotated

import typer

from ground.errors import CheckFailed
from idmctl.output import console, emit_json, make_table

STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}


def preflight(
    experiment: Annotated[str, typer.Argument(help="Experiment name or YAML path.")],
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="Static checks only (cannot unlock submit).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Cluster profile (default $IDMCTL_CLUSTER or local).")] = None,
    smoke_timeout: Annotated[float, typer.Option("--smoke-timeout", help="Seconds before the smoke is killed.")] = 300.0,
    what_if: Annotated[list[str] | None, typer.Option(
        "--what-if", help="section.field=value: rerun the static checks on the altered spec (never edited, "
                          "nothing recorded) beside the original. Repeatable.")] = None,
) -> None:
    """Run the mandatory gate: spec, introspection, loader, shm, io, qos, disk, cache, smoke."""
    from idmctl.preflight.runner import run_preflight
    from idmctl.profile import load_profile
    from ground.spec import load_experiments

    variants = load_experiments(experiment)
    profile, profile_hash = load_profile(cluster)
    if variants[0].sweep is not None and len(variants) > 1 or experiment == variants[0].sweep:
        if what_if:
            from idmctl.preflight.whatif import apply_overrides, parse_override

            overrides = dict(parse_override(text) for text in what_if)
            variants = [apply_overrides(v, overrides, name=v.name, sweep=v.sweep, axes=v.axes) for v in variants]
        from idmctl.preflight.sweep_report import run_sweep_preflight

        run_sweep_preflight(variants, profile, profile_hash, with_smoke=not no_smoke and not what_if,
                            smoke_timeout_s=smoke_timeout, as_json=as_json)
        return
    resolved = variants[0]
    if what_if:
        from idmctl.preflight.whatif_report import run_what_if

        run_what_if(resolved, profile, profile_hash, what_if, as_json=as_json)
        return
    report = run_preflight(resolved, profile, profile_hash, with_smoke=not no_smoke, smoke_timeout_s=smoke_timeout)
    if as_json:
        emit_json(report.as_dict())
    else:
        table = make_table("check", "status", "numbers and reason", "fix",
                           title=f"preflight {resolved.name} on {profile.name}")
        for result in report.results:
            status = result.status.value
            table.add_row(result.name, f"[{STYLE[status]}]{status}[/]", result.summary, result.fix or "")
        console.print(table, markup=True)
        verdict = ("FAIL: " + ", ".join(report.failed) if report.failed
                   else "PASS (submit unlocked)" if report.unlocks_submit else "PASS, static only (submit stays locked)")
        console.print(f"preflight #{report.run_id} {verdict} — spec {resolved.short_hash}, code {report.code_version}, "
                      f"cluster {profile.name} ({profile_hash[:12]}), {report.seconds:.1f} s", markup=False)
    if report.failed:
        raise CheckFailed(f"preflight failed: {', '.join(report.failed)}")

"""``idmctl doctor``: one table saying whether this machine is ready, each failing row with its fix."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from idmctl.cli.commands import options
from ground.errors import CheckFailed, UserError
from ground.units import parse_duration
from idmctl.cli.output import console, emit_json, make_table, styled

def doctor(
    as_json: options.Json = False,
    no_render: Annotated[bool, typer.Option("--no-render", help="Skip the one-frame render (~5 s).")] = False,
    nodes: Annotated[bool, typer.Option("--nodes", help="Also probe every node of the partition from the node "
                                        "itself (a 2-minute job per node): run directories, code store, cache, "
                                        "store, MLflow, scratch.")] = False,
    partition: Annotated[Optional[str], typer.Option("--partition", help="With --nodes: the partition to probe "
                                                     "(default: the cluster's default).")] = None,
    qos: Annotated[Optional[str], typer.Option("--qos", help="With --nodes: the QoS the probe jobs use.")] = None,
    cache: Annotated[Optional[str], typer.Option("--cache", help="With --nodes: a cache mount every node must "
                                                 "see.")] = None,
    scratch: Annotated[Optional[str], typer.Option("--scratch", help="With --nodes: where jobs stage, as a job "
                                                   "names it ($SLURM_TMPDIR is expanded on the node; default: "
                                                   "stage.dest's default).")] = None,
    nodes_deadline: Annotated[str, typer.Option("--nodes-deadline", help="With --nodes: how long to wait for "
                                                "every node's answer, e.g. 2m.")] = "2m",
) -> None:
    """Python and packages, $IDMCTL_HOME, both stores, Slurm and the cluster profile, rendering, /dev/shm and
    scratch. Exit 1 when something required is missing (a FAIL row); WARN rows do not fail."""
    from idmctl.cli.app import debug_on  # start-up: only this command needs it (3 more project modules)
    from idmctl.ops.doctor import NodeProbe, run_doctor  # start-up: only this command needs it (7 more project modules)


    probe = None
    if nodes:
        try:
            deadline = parse_duration(nodes_deadline)
        except ValueError:
            raise UserError(f"not a duration: {nodes_deadline!r}", field="--nodes-deadline", hint="e.g. 90s or 2m")
        if deadline <= 0:
            raise UserError(f"{nodes_deadline!r} is no time to wait", field="--nodes-deadline", hint="e.g. 90s or 2m")
        probe = NodeProbe(partition=partition, qos=qos, deadline_s=deadline, cache=cache, scratch=scratch)
    report = run_doctor(render=not no_render, debug=debug_on(), nodes=probe)
    if as_json:
        emit_json(report.as_dict())
    else:
        console.print(render_table(report))
        console.print(verdict(report), markup=False)
    if report.failed:
        raise CheckFailed("")


def render_table(report):  # type: ignore[no-untyped-def]
    table = make_table("check", "status", "found", "fix", title="idmctl doctor")
    for row in report.rows:
        table.add_row(row.name, styled(row.status), row.detail, row.fix)
    return table


def verdict(report) -> str:  # type: ignore[no-untyped-def]
    counts: dict[str, int] = {}
    for row in report.rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    if report.failed:
        return f"doctor: {summary} in {report.seconds:.1f} s — fix the FAIL rows: {', '.join(report.failed)}"
    return f"doctor: {summary} in {report.seconds:.1f} s — ready"

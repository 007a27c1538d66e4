"""``idmctl jobs show ID``: one job's record, and its efficiency report once it ended."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from idmctl.cli.commands import options
from ground.errors import UserError
from ground.tracking_spool import spool_status
from idmctl.cli.output import console, emit_json
from idmctl.core.job_state import JobState


def show(
    job: Annotated[int, typer.Argument(**options.JOB_ID, help="idmctl job id (see `idmctl jobs`).")],
    as_json: options.Json = False,
) -> None:
    """A job's record (state, nodes, times) and, once it ended, its efficiency report with suggestions."""
    from idmctl.plan.efficiency import EfficiencyReport  # start-up: only this command needs it (13 more project modules)
    from idmctl.record.jobs import job_by_id  # start-up: only this command needs it (11 more project modules)

    row = job_by_id(job)
    if row is None:
        raise UserError(f"no job {job}", field="JOB", hint="see `idmctl jobs`")
    from idmctl.record.stored_json import job_options, typed  # start-up: only this command needs it (8 more project modules)

    options = job_options(row.options_json, row.id)
    efficiency = typed(row.efficiency, "efficiency", row.id)
    code = typed(row.code, "code", row.id) or {}
    admission = (typed(row.admitted, "admitted", row.id) or {}).get("admission")
    admitted = admission if isinstance(admission, dict) else {}
    controller = typed(row.controller, "controller", row.id)
    spooled = spool_status(Path(row.script_path).parent) if row.script_path else None
    tracking = spooled.describe() if spooled is not None else None
    if as_json:
        emit_json({"job": row.id, "chain": row.chain_id, "attempt": row.attempt, "experiment": row.experiment,
                   "scheduler_id": row.scheduler_id, "state": row.state, "exit_code": row.exit_code,
                   "nodes": row.node_list, "qos": row.qos, "reason": row.reason, "code": code or None,
                   "admission_failed": admitted.get("failed"), "controller": controller or None,
                   "tracking": tracking, "efficiency": efficiency})
        return
    console.print(f"job {row.id} ({row.executor} {row.scheduler_id or '—'}) chain {row.chain_id} attempt {row.attempt}  "
                  f"{row.experiment}  {row.state} {row.exit_code or ''} on {row.node_list or '—'}  qos {row.qos or '—'}",
                  markup=False)
    console.print(f"asked: --mem {options.get('mem')}  -c {options.get('cpus_per_node')}  --time {options.get('time_limit')}"
                  f"  gpus/node {options.get('gpus_per_node')}", markup=False)
    if code:
        console.print(f"code: snapshot {code.get('version')} (commit {code.get('commit') or '—'}) in {code.get('directory')}",
                      markup=False)
    else:
        console.print(f"code: {row.code_version or '—'} (the live tree: submitted before code snapshots)", markup=False)
    if controller:
        from idmctl.ops.controller import controller_code_line  # start-up: only a job a controller follows

        console.print(f"controller: {controller_code_line(controller, code)}", markup=False)
    if row.reason and JobState.of(row.state) is JobState.PENDING:
        from idmctl.plan.pending import pending_line  # start-up: only a pending job reads it

        console.print(pending_line(row.reason, row.submitted_at), markup=False)
    elif row.reason:
        console.print(f"reason: {row.reason}", markup=False)
    if tracking:
        console.print(tracking, markup=False)
    if not efficiency:
        console.print("efficiency: not yet (the report is written by `idmctl sync` when the job ends)", markup=False)
        return
    report = EfficiencyReport.from_dict(efficiency)
    console.print("efficiency:", markup=False)
    for line in report.lines() or ["no figures recorded"]:
        console.print(f"  {line}", markup=False)
    for suggestion in report.suggestions:
        console.print(f"  suggest {suggestion.line()}", markup=False)

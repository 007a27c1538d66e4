"""``idmctl ledger [--by experiment|qos|cause] [--since D] [--json]``: where the GPU-hours went."""

from __future__ import annotations

from typing import Annotated

import typer

from idmctl.cli.commands import options
from idmctl.cli.output import console, emit_json, make_table


def ledger(
    by: Annotated[str, typer.Option("--by", help="Group by experiment, qos or cause.")] = "experiment",
    since: Annotated[str | None, typer.Option("--since", help="Only runs ended since a date (2026-11-01) or a look-back (7d).")] = None,
    as_json: options.Json = False,
    user: Annotated[str | None, typer.Option("--user", help="Only jobs this user submitted (a team's shared store holds everyone's).")] = None,
) -> None:
    """GPU-hours charged, useful (reached a checkpoint that was used) and lost per cause and per preemption."""
    from ground.paths import db_path  # start-up: only this command needs it (3 more project modules)
    from idmctl.ops.failures.rows import parse_since  # start-up: pulls yaml
    from idmctl.ops.ledger import check_grouping, ledger as build, run_costs  # start-up: pulls yaml

    check_grouping(by)  # bad input before anything is read
    since_at = parse_since(since) if since else None
    costs = run_costs(db_path(), user)
    if costs is None:  # failed runs not classified yet, no store, or the shared store: through the ORM
        from idmctl.ops.failures.postmortem import classify_pending  # start-up: pulls the classifier's taxonomy
        from idmctl.ops.ledger import run_costs_stored  # start-up: pulls yaml
        from idmctl.record.store import store  # start-up: the store's driver loads when it is used

        classify_pending(store())
        costs = run_costs_stored(user)
    rows, total = build(costs, by, since_at)
    if as_json:
        emit_json({"by": by, "since": since_at.isoformat() if since_at else None,
                   "groups": [row.as_json() for row in rows], "total": total.as_json()})
        return
    if not rows:
        console.print("no ended runs" + (f" since {since}" if since else ""), markup=False)
        return
    table = make_table(by, "runs", "GPU-h charged", "GPU-h useful", "GPU-h lost", "lost to", "preemptions",
                       "lost per preemption")
    for row in [*rows, total]:
        causes = ", ".join(f"{cause} {hours:,.2f}" for cause, hours in sorted(row.lost_h.items(), key=lambda kv: -kv[1]))
        per = f"{row.per_preemption_h:,.2f} GPU-h" if row.per_preemption_h is not None else "—"
        table.add_row(row.group, str(row.runs), f"{row.charged_h:,.2f}", f"{row.useful_h:,.2f}",
                      f"{row.lost_total_h:,.2f}", causes or "—", str(row.preemptions), per)
    console.print(table)

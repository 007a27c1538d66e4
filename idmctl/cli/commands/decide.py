"""``idmctl decide EXP``: the goal's verdict with its 95 % interval, from per-episode results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from idmctl.cli.commands import options
from idmctl.cli.output import console, emit_json


def decide(
    experiment: Annotated[str, typer.Argument(
        help="A run (exp#chain or run id), an experiment, a sweep, or a recorded baseline (latent_a_v1).")],
    goal: Annotated[str | None, typer.Option(
        "--goal", help="Overrides the spec's goal: '<metric> <op> <mm> [under <protocol>]'.")] = None,
    checkpoint: Annotated[str, typer.Option(
        "--checkpoint", help="Which evaluation: last, best (warned: chosen on the same episodes), or a step.")] = "last",
    as_json: options.Json = False,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Also draw the per-episode errors, the interval and the goal line to this PNG.")] = None,
    no_tags: Annotated[bool, typer.Option(
        "--no-tags", help="Do not write the verdict to the MLflow runs as idmctl.decision.* tags.")] = False,
    against: Annotated[str | None, typer.Option(
        "--against", help="Another run or experiment to compare with, paired when both share their episodes.")] = None,
    ui_url: options.UiUrl = options.UI_URL,
) -> None:
    """PASS / FAIL / UNDECIDED for the goal: estimate, 95 % interval (bootstrap-t over episodes), P(goal)."""
    from idmctl.track.goal_decisions import (build_decisions, paired_lines, paired_results, plot_decisions,  # start-up: pulls numpy
                                             write_tags)

    reports = build_decisions(experiment, goal, checkpoint)
    if against is not None:
        reports += build_decisions(against, goal or str(reports[0].goal), checkpoint)
    paired = paired_results(reports)
    pairs = paired_lines(reports, paired)
    if plot is not None:
        plot_decisions(reports, plot)
    tagged = 0 if no_tags else write_tags(reports)
    if as_json:
        emit_json({"decisions": [r.to_json() for r in reports], "paired": paired, "tagged_runs": tagged,
                   "plot": str(plot) if plot is not None else None})
        return
    for report in reports:
        console.print(f"decide {report.subject}: goal {report.goal}", markup=False)
        for warning in report.warnings:
            console.print(f"  warning: {warning}", markup=False)
        for line in report.lines:
            console.print(f"  {line}", markup=False, soft_wrap=True)
    for line in pairs:
        console.print(line, markup=False, soft_wrap=True)
    if tagged:
        console.print(f"MLflow: {tagged} run(s) tagged idmctl.decision.* (verdict, interval, P(goal))", markup=False)
        from idmctl.track.runs_view import decision_lines  # start-up: the track floor loads only for this command

        decided = [(run.run_id, str(r.goal), r.goal.metric) for r in reports for run in r.runs]
        for line in decision_lines(decided, ui_url):
            console.print(line, markup=False, soft_wrap=True)
    if plot is not None:
        console.print(f"plot: {plot} ({plot.stat().st_size:,} B)", markup=False)

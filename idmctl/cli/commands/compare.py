"""``idmctl compare [EXP ...]``: card A's baseline table with tracked runs and goal verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from idmctl.cli.commands import options
from ground.tracking import DEFAULT_RANK_METRIC
from idmctl.cli.output import console, emit_json, make_table


def compare(
    experiments: Annotated[list[str] | None, typer.Argument(
        help="Experiments, run names (exp#chain) or run ids; default: every tracked run.")] = None,
    metric: Annotated[str, typer.Option("--metric", help="Metric that ranks the runs (lower is better).")] = DEFAULT_RANK_METRIC,
    as_json: options.Json = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="A Markdown table (for notes and cards).")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Also draw loss and EEF-mm curves to this PNG.")] = None,
    ui_url: options.UiUrl = options.UI_URL,
) -> None:
    """EEF mm of baselines and runs (best and last of each metric), with PASS/FAIL against each goal."""
    from idmctl.track.compare import build_report, compare_url, run_url  # start-up: pulls pydantic and yaml
    from idmctl.track.compare_render import cells, footnotes, headers, markdown  # start-up: pulls pydantic and yaml

    report = build_report(experiments or [], metric=metric)
    if plot is not None:
        from idmctl.track.compare_plot import plot_report  # start-up: pulls pydantic and yaml

        plot_report(report, plot)
    if as_json:
        document = report.to_json()
        for row in document["rows"]:
            row["url"] = run_url(row["run_id"], ui_url) if row["run_id"] else None
        emit_json(document)
        return
    if as_markdown:
        typer.echo(markdown(report), nl=False)
        return
    if not report.rows:
        from idmctl.track.compare import baselines_path, default_store_note  # start-up: pulls pydantic and yaml

        console.print(f"nothing to compare: no baselines in {baselines_path()} and no tracked runs "
                      f"({default_store_note()})", markup=False)
        return
    table = make_table(*headers(report))
    for row in cells(report):
        # Text, not str: labels and notes are data, never rich markup.
        table.add_row(*(Text(cell) for cell in row))
    console.print(table, markup=False)
    for note in footnotes(report):
        console.print(note, markup=False)
    for group in report.sweeps:
        from idmctl.cli.sweep_report import axis_text  # start-up: pulls pydantic and yaml

        sweep_table = make_table("variant", *group.axes, "run", "status", "steps", f"{report.metric} best / last",
                                 "verdict", title=f"sweep {group.sweep}")
        for variant, values, row in group.rows:
            summary = row.metrics.get(report.metric)
            shown = f"{summary.best:.1f} / {summary.last:.1f}" if summary else "—"
            steps = f"{row.steps_done or 0:,}/{row.steps_planned:,}" if row.steps_planned else "—"
            sweep_table.add_row(*(Text(c) for c in (variant, *(axis_text(values[a]) for a in group.axes), row.label,
                                                    row.status, steps, shown, row.verdict)))
        console.print(sweep_table, markup=False)
    runs = [row for row in report.runs if row.run_id and row.experiment_id]
    if runs:
        link = compare_url([row.run_id or "" for row in runs], [row.experiment_id or "" for row in runs], ui_url)
        console.print(f"MLflow compare page (idmctl ui): {link}", markup=False, soft_wrap=True)
        from idmctl.track.runs_view import runs_chart_line  # start-up: only this command needs it (5 more project modules)

        keys = sorted({key for row in runs for key in row.metrics if key != "loss"})
        console.print(runs_chart_line("MLflow runs, EEF mm charts first (idmctl ui)", ui_url, keys),
                      markup=False, soft_wrap=True)
    if plot is not None:
        console.print(f"plot: {plot} ({plot.stat().st_size:,} B)", markup=False)

"""``idmctl compare --plot out.png``: loss and EEF-mm curves of the chosen runs in one picture.

Left panel: training loss per step (log scale). Right panel: every EEF-mm metric of each run per
step, with the baselines of the ranking metric as dashed lines and each goal as a red line.
matplotlib (Agg, no display) and mlflow are imported only here, only when a plot is asked for.
"""

from __future__ import annotations

import os
from pathlib import Path

from ground import tracking
from idmctl.track.compare import CompareReport, surviving_history
from ground.errors import UserError
from ground.paths import mlflow_tracking_uri
from ground.spec.schema import Goal


def _histories(run_id: str, keys: list[str], tracking_uri: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    curves = {}
    for key in keys:
        points = surviving_history(client, run_id, key)
        if points:
            curves[key] = points
    return curves


def plot_report(report: CompareReport, out: Path, tracking_uri: str | None = None) -> Path:
    """Draw the runs of ``report`` to ``out`` (PNG), written through a temp file and a rename."""
    if out.suffix.lower() != ".png":
        raise UserError(f"{out.name} is not a .png file", field="--plot", hint="e.g. --plot compare.png")
    runs = [row for row in report.runs if row.run_id]
    if not runs:
        raise UserError("no tracked runs to plot", field="--plot",
                        hint="train one first (idmctl quickstart) or name experiments that have runs")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    uri = tracking_uri or mlflow_tracking_uri()
    figure, (loss_axis, eef_axis) = plt.subplots(1, 2, figsize=(13, 5), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, row in enumerate(runs):
        color = colors[index % len(colors)]
        eef_keys = sorted(key for key in row.metrics if tracking.EEF_METRIC.fullmatch(key))
        curves = _histories(row.run_id or "", [tracking.M_LOSS, *eef_keys], uri)
        marker = " (running)" if row.in_progress else ""
        if tracking.M_LOSS in curves:
            steps, values = zip(*curves[tracking.M_LOSS])
            loss_axis.plot(steps, values, color=color, label=f"{row.label}{marker}")
        for style, key in zip(("-", "--", ":", "-."), eef_keys):
            if key in curves:
                steps, values = zip(*curves[key])
                eef_axis.plot(steps, values, style, marker="o", color=color, label=f"{row.label} {key}{marker}")
    for row in report.rows:
        if row.kind == "baseline" and report.metric in row.metrics:
            eef_axis.axhline(row.metrics[report.metric].best, color="grey", linestyle="--", linewidth=0.8)
            eef_axis.annotate(f"{row.label} {row.metrics[report.metric].best:g}", xy=(0, row.metrics[report.metric].best),
                              xycoords=("axes fraction", "data"), fontsize=7, color="grey", va="bottom")
    by_goal: dict[str, list[str]] = {}
    for name, goal_text in report.goals.items():
        by_goal.setdefault(str(Goal.parse(goal_text)), []).append(name)
    for goal_text, names in by_goal.items():
        eef_axis.axhline(Goal.parse(goal_text).value, color="red", linewidth=1.0,
                         label=f"goal {goal_text} ({', '.join(names)})")
    loss_axis.set(title="training loss", xlabel="step", ylabel=tracking.M_LOSS)
    if loss_axis.lines and all(min(line.get_ydata()) > 0 for line in loss_axis.lines):
        loss_axis.set_yscale("log")
    eef_axis.set(title="EEF error (lower is better)", xlabel="step", ylabel="mm")
    for axis in (loss_axis, eef_axis):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    return save_png(figure, out)


def save_png(figure: object, out: Path) -> Path:
    """Lay out, write through a temp file and a rename (a reader never sees half a PNG), close the figure."""
    import matplotlib.pyplot as plt

    figure.tight_layout()  # type: ignore[attr-defined]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp{os.getpid()}.png")
    try:
        figure.savefig(tmp, format="png")  # type: ignore[attr-defined]
        os.replace(tmp, out)
    finally:
        plt.close(figure)  # type: ignore[arg-type]
        tmp.unlink(missing_ok=True)
    return out

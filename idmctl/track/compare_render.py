"""Cells of the compare table, shared by the terminal table and ``--markdown``.

The layout is card A's baseline table: model, training, EEF mm (5 ep), EEF mm (24 ep), note, plus
the goal and its verdict. A tracked run's metric cell reads ``best (last X)`` when they differ.
"""

from __future__ import annotations

from ground import tracking
from idmctl.track.compare import CompareReport, CompareRow, MetricSummary, column_protocols, column_value, split_column
from ground.spec.schema import Goal

DASH = "—"


def steps_text(steps: int) -> str:
    """60000 → '60K', 55000 → '55K', 12340 → '12.3K', 200 → '200' (the card writes steps this way)."""
    if steps < 1000:
        return str(steps)
    thousands = steps / 1000
    return f"{thousands:g}K" if steps % 100 == 0 else f"{thousands:.1f}K"


def value_text(value: float) -> str:
    """Up to two decimals, as the card writes mm: 134.8, 104.99."""
    return f"{round(value, 2):g}"


def metric_header(column: str) -> str:
    metric, protocol = split_column(column)
    match = tracking.EEF_METRIC.fullmatch(metric)
    under = f" under {protocol}" if protocol else ""
    if not match:
        return metric + under
    prefix = "sim EEF mm" if match.group(1) else "EEF mm"
    return f"{prefix} ({match.group(2)} ep){under}"


def metric_cell(summary: MetricSummary | None) -> str:
    if summary is None:
        return DASH
    if summary.best == summary.last:
        return value_text(summary.best)
    return f"{value_text(summary.best)} (last {value_text(summary.last)})"


def training_cell(row: CompareRow) -> str:
    if row.kind == "run" and row.steps_done is not None and row.steps_planned and row.steps_done < row.steps_planned:
        steps = f"{steps_text(row.steps_done)} of {steps_text(row.steps_planned)}"
    else:
        planned = row.steps_planned if row.steps_planned is not None else row.steps_done
        steps = steps_text(planned) if planned is not None else DASH
    if row.effective_batch is not None:
        steps += f", B={row.effective_batch}"
    if row.status != "finished":
        steps += f" ({row.status})"
    return steps


def goal_cell(goal: str | None) -> str:
    return str(Goal.parse(goal)) if goal else DASH


def headers(report: CompareReport) -> list[str]:
    return ["experiment", "training", *(metric_header(m) for m in report.columns), "note", "goal", "verdict"]


def cells(report: CompareReport) -> list[list[str]]:
    return [
        [row.label, training_cell(row), *(metric_cell(column_value(row, m)) for m in report.columns),
         row.note or DASH, goal_cell(row.goal), row.verdict]
        for row in report.rows
    ]


def footnotes(report: CompareReport) -> list[str]:
    notes = ["EEF mm: lower is better; a run's cell is its best eval (last X when the last differs)."]
    protocols = column_protocols(report)
    if protocols:
        notes.append("evaluation protocols (numbers of different protocols are not comparable: never ranked "
                     "or judged against each other): "
                     + "; ".join(f"{name}: {', '.join(labels)}" for name, labels in protocols.items()))
    for name, goal in report.goals.items():
        notes.append(f"goal {name}: {Goal.parse(goal)} (verdict on the last eval)")
    running = [row.label for row in report.rows if row.in_progress]
    if running:
        notes.append(f"in progress: {', '.join(running)} (verdicts may change)")
    return notes


def markdown(report: CompareReport) -> str:
    def line(values: list[str]) -> str:
        return "| " + " | ".join(value.replace("|", "\\|") for value in values) + " |"

    head = headers(report)
    lines = [line(head), "|" + "|".join("---" for _ in head) + "|"]
    lines += [line(row) for row in cells(report)]
    return "\n".join(lines) + "\n"

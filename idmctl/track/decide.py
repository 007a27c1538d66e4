"""``idmctl decide EXP``: does the goal hold, with what uncertainty, at which checkpoint, under which protocol.

Reads the per-episode results the evaluators log (``episodes/<metric>/step-N.json`` in the run's
MLflow artifacts), groups the runs of one spec (same spec hash) that share their episodes into one
seeds × episodes estimate, and hands the numbers to :mod:`idmctl.track.decision`. A recorded baseline
(card A) has only a mean: it is reported as a point estimate without a spread, with the largest
per-episode spread under which its episode count would decide the goal.

mlflow and numpy are imported inside the functions (the CLI stays fast).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ground import tracking
from ground.errors import UserError
from ground.protocols import OWN, Protocol
from ground.paths import mlflow_tracking_uri
from ground.spec.schema import Goal
from idmctl.ops.notify import announce_verdicts
from idmctl.track.compare import _select_runs, _spec_goal, expand_sweeps, load_baselines, load_runs, surviving_history
from idmctl.track.compare_plot import save_png
from idmctl.track.decision import DRAWS, METHOD, decide, estimate, paired, sd_that_decides, t_quantile

CHECKPOINT_LAST = "last"
CHECKPOINT_BEST = "best"


@dataclass
class RunEpisodes:
    """One run's per-episode results at the checkpoint decided on."""

    label: str
    run_id: str
    spec_hash: str
    step: int
    chosen: str
    """How the step was chosen: ``last`` evaluation, ``best`` on these episodes, or a given ``step``."""
    protocol: Protocol
    episodes: list[str]
    errors_mm: list[float]


@dataclass
class DecisionReport:
    """One decision: a run, or the runs of one spec sharing episodes (seeds), or a baseline's point."""

    subject: str
    goal: Goal
    protocol: str
    runs: list[RunEpisodes] = field(default_factory=list)
    estimate: Any = None
    """decision.Estimate, or None for a baseline (point estimate) or too few episodes."""
    decision: Any = None
    point: float | None = None
    """A baseline's recorded mean."""
    point_episodes: int | None = None
    warnings: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return self.decision.verdict if self.decision is not None else "UNDECIDED"

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject, "goal": str(self.goal), "protocol": self.protocol, "verdict": self.verdict,
            "runs": [{"label": r.label, "run_id": r.run_id, "step": r.step, "chosen": r.chosen,
                      "protocol": r.protocol.to_json(),
                      "episodes": [{"episode": e, "error_mm": v} for e, v in zip(r.episodes, r.errors_mm)]}
                     for r in self.runs],
            "estimate": self.estimate.to_json() if self.estimate is not None else None,
            "decision": self.decision.to_json() if self.decision is not None else None,
            "point_estimate_mm": self.point, "point_episodes": self.point_episodes,
            "warnings": self.warnings, "lines": self.lines,
        }


def _mm(value: float) -> str:
    return f"{value:.1f} mm"


# ------------------------------------------------------------------------------------------ loading

def _goal(goal_text: str | None, fallback: str | None, subject: str) -> Goal:
    text = goal_text or fallback
    if not text:
        raise UserError(f"{subject} has no goal", field="--goal", hint='e.g. --goal "eef_mm_24ep <= 125"')
    try:
        return Goal.parse(text)
    except ValueError as exc:
        raise UserError(str(exc), field="--goal", hint='e.g. --goal "eef_mm_24ep <= 125"') from exc


def _episodes_at(client: Any, row: Any, metric: str, checkpoint: str) -> RunEpisodes | None:
    """The run's per-episode artifact at the chosen evaluation step; None when it logged none."""

    logged = {}
    for item in client.list_artifacts(row.run_id, f"{tracking.EPISODES_ARTIFACT_DIR}/{metric}"):
        name = Path(item.path).name
        if name.startswith("step-") and name.endswith(".json"):
            logged[int(name[5:-5])] = item.path
    if not logged:
        return None
    # Steps a resume from an older checkpoint superseded are not the run's results any more.
    history = [(step, value) for step, value in surviving_history(client, row.run_id, metric) if step in logged]
    if not history:
        history = [(step, math.nan) for step in sorted(logged)]
    if checkpoint == CHECKPOINT_LAST:
        step = max(step for step, _ in history)
    elif checkpoint == CHECKPOINT_BEST:
        step = min(history, key=lambda point: point[1])[0]
    else:
        step = int(checkpoint)
        if step not in logged:
            raise UserError(f"{row.label} has no per-episode {metric} at step {step}", field="--checkpoint",
                            hint=f"evaluated steps: {', '.join(map(str, sorted(logged)))}, or last / best")
    import os

    from mlflow.artifacts import download_artifacts

    # Its progress bar would land in the middle of decide's output.
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    document = json.loads(Path(download_artifacts(run_id=row.run_id, artifact_path=logged[step],
                                                  tracking_uri=client.tracking_uri)).read_text())
    episodes = document["episodes"]
    return RunEpisodes(label=row.label, run_id=row.run_id, spec_hash=row.tags.get(tracking.TAG_SPEC_HASH, ""),
                       step=step, chosen=checkpoint if checkpoint in (CHECKPOINT_LAST, CHECKPOINT_BEST) else "step",
                       protocol=Protocol.from_json(document["protocol"]),
                       episodes=[str(e["episode"]) for e in episodes], errors_mm=[float(e["error_mm"]) for e in episodes])


def build_decisions(target: str, goal_text: str | None = None, checkpoint: str = CHECKPOINT_LAST,
                    tracking_uri: str | None = None) -> list[DecisionReport]:
    """The decisions for a run (``exp#chain`` or run id), an experiment, a sweep, or a recorded baseline."""

    if checkpoint not in (CHECKPOINT_LAST, CHECKPOINT_BEST) and not checkpoint.isdigit():
        raise UserError(f"not a checkpoint: {checkpoint!r}", field="--checkpoint", hint="last, best, or a step number")
    baselines = {row.name: row for row in load_baselines()}
    if target in baselines:
        return [_baseline_decision(baselines[target], _goal(goal_text, None, f"baseline {target}"))]
    runs = load_runs(tracking_uri)
    selection = expand_sweeps([target])
    chosen = _select_runs(runs, selection, list(baselines.values()))
    if not chosen:
        raise UserError(f"no tracked run of {target} to decide", field=target,
                        hint=f"train it first (idmctl submit {target}; the quickstart: idmctl quickstart)")
    from mlflow.tracking import MlflowClient


    client = MlflowClient(tracking_uri=tracking_uri or mlflow_tracking_uri())
    reports = []
    by_experiment: dict[str, list[Any]] = {}
    for row in chosen:
        by_experiment.setdefault(row.name, []).append(row)
    for experiment, rows in by_experiment.items():
        goal = _goal(goal_text, _spec_goal(experiment) or rows[0].goal, experiment)
        reports += _run_decisions(client, experiment, rows, goal, checkpoint)
    return reports


def _run_decisions(client: Any, experiment: str, rows: list[Any], goal: Goal, checkpoint: str) -> list[DecisionReport]:
    found: list[RunEpisodes] = []
    missing: list[tuple[str, str]] = []
    for row in rows:
        if goal.metric not in row.metrics:
            missing.append((row.label, f"logged no {goal.metric}"))
            continue
        if goal.protocol and row.protocol(goal.metric) != goal.protocol:
            missing.append((row.label, f"logged {goal.metric} under {row.protocol(goal.metric)} only"))
            continue
        result = _episodes_at(client, row, goal.metric, checkpoint)
        if result is None:
            missing.append((row.label, f"logged only the mean of {goal.metric}, no per-episode results "
                                       "(trained before they were logged)"))
        else:
            found.append(result)
    reports = []
    # Runs of one spec evaluated on the same episodes under one protocol are repeats: one estimate over them.
    groups: dict[tuple[str, str, tuple[str, ...]], list[RunEpisodes]] = {}
    for result in found:
        groups.setdefault((result.spec_hash, result.protocol.name, tuple(result.episodes)), []).append(result)
    for (_, protocol, _), members in groups.items():
        subject = members[0].label if len(members) == 1 else f"{experiment} ({len(members)} runs of one spec)"
        reports.append(_measured_decision(subject, goal, protocol, members))
    for label, why in missing:
        report = DecisionReport(subject=label, goal=goal, protocol=goal.protocol or OWN)
        report.lines.append(f"no result under {goal.protocol or 'the spec’s own evaluation'}: {label} {why}")
        reports.append(report)
    return reports


# ---------------------------------------------------------------------------------------- deciding

def _measured_decision(subject: str, goal: Goal, protocol: str, members: list[RunEpisodes]) -> DecisionReport:

    report = DecisionReport(subject=subject, goal=goal, protocol=protocol, runs=members)
    first = members[0]
    matrix = [m.errors_mm for m in members]
    n, k = len(first.errors_mm), len(members)
    steps = sorted({m.step for m in members})
    step_text = ", ".join(f"step {s}" for s in steps)
    if first.chosen == CHECKPOINT_BEST:
        report.warnings.append(f"checkpoint {step_text} was chosen as the best {goal.metric} on these same "
                               f"{n} episodes: the estimate is biased low; decide on `--checkpoint last` or on "
                               "episodes the choice did not see")
        chosen = "the best evaluation on these episodes"
    elif first.chosen == CHECKPOINT_LAST:
        chosen = "the last evaluation, not chosen on these episodes"
    else:
        chosen = "as asked"
    report.lines.append(f"checkpoint: {step_text} ({chosen})")
    report.lines.append(f"protocol: {first.protocol.describe()}")
    for member in members:
        values = ", ".join(f"{v:.1f}" for v in member.errors_mm)
        report.lines.append(f"per episode ({member.label}): {values} mm")
    if n < 2:
        report.lines.append(f"{n} episode has no spread: no interval; evaluate on more episodes")
        return report
    est = estimate(matrix)
    report.estimate = est
    total = sum(sum(row) for row in matrix)
    report.lines.append(f"estimate: mean {_mm(est.mean)} = {total:.1f} mm / ({k} × {n})" if k > 1 else
                        f"estimate: mean {_mm(est.mean)} = {total:.1f} mm / {n} episodes")
    spread = "sd of the per-episode means" if k > 1 else "sd"
    report.lines.append(f"spread: {spread} {_mm(est.sd)}, standard error {_mm(est.se)}"
                        + (f" = {est.sd:.1f} / √{n}" if k == 1 else " (episodes and seeds)"))
    report.lines.append(f"95 % interval: [{est.low:.1f}, {est.high:.1f}] mm ({METHOD}"
                        + (" and seeds" if k > 1 else "") + f", {DRAWS:,} resamples)")
    decision = decide(est, goal.op, goal.value)
    report.decision = decision
    report.lines.append(f"P({goal.metric} {goal.op} {goal.value:g}) = {decision.p_goal:.2f}")
    report.lines.append(_verdict_line(goal, est, decision, n))
    return report


def _verdict_line(goal: Goal, est: Any, decision: Any, n: int) -> str:
    interval = f"[{est.low:.1f}, {est.high:.1f}] mm"
    if decision.verdict == "PASS":
        return f"verdict: PASS (the whole interval {interval} is {goal.op} {goal.value:g} mm)"
    if decision.verdict == "FAIL":
        return f"verdict: FAIL (no part of the interval {interval} is {goal.op} {goal.value:g} mm)"
    margin = abs(est.mean - goal.value)
    if decision.episodes_to_decide is None:
        return (f"verdict: UNDECIDED (the interval {interval} straddles {goal.value:g} mm and the mean sits on "
                "it: no practical number of episodes decides it)")
    more = decision.episodes_to_decide - n
    return (f"verdict: UNDECIDED (the interval {interval} straddles {goal.value:g} mm); about "
            f"{decision.episodes_to_decide} episodes ({more} more) would decide it if the mean and sd stay "
            f"{_mm(est.mean)} and {_mm(est.sd)}: t(n−1) · {est.sd:.1f} / √n < |{est.mean:.1f} − {goal.value:g}| "
            f"= {margin:.1f} mm")


def _baseline_decision(row: Any, goal: Goal) -> DecisionReport:

    protocol = row.protocols.get(goal.metric, "unrecorded")
    report = DecisionReport(subject=f"{row.label} (baseline)", goal=goal, protocol=protocol)
    if goal.protocol and protocol != goal.protocol:
        report.lines.append(f"no result under {goal.protocol}: the baseline's {goal.metric} is under {protocol}")
        return report
    summary = row.metrics.get(goal.metric)
    if summary is None:
        report.lines.append(f"no result: the baseline records no {goal.metric}")
        return report
    match = tracking.EEF_METRIC.fullmatch(goal.metric)
    n = int(match.group(2)) if match else 0
    report.point, report.point_episodes = summary.last, n
    report.lines.append(f"protocol: {protocol} (card A records the mean only: no per-episode errors, episode list, "
                        "seeds or evaluator version)")
    report.lines.append(f"{goal.metric} = {_mm(summary.last)} on {n} episodes: a point estimate without a spread")
    side = "holds" if goal.passes(summary.last) else "fails"
    report.lines.append(f"the point {side} the goal {goal}, but with no spread there is no interval and no P(goal)")
    limit = sd_that_decides(summary.last, goal.value, n)
    if limit is not None:
        margin = abs(summary.last - goal.value)
        report.lines.append(
            f"{n} episodes decide it only if the per-episode sd is below |{summary.last:g} − {goal.value:g}| · √{n} / "
            f"t({n - 1}) = {margin:.1f} · {math.sqrt(n):.3f} / {t_quantile(0.975, n - 1):.3f} = {_mm(limit)}")
    report.lines.append("verdict: UNDECIDED (log the per-episode errors of this evaluation to decide it)")
    return report


# ------------------------------------------------------------------------------------------ writing

def decision_tags(report: DecisionReport) -> dict[str, str]:
    """The tags the MLflow UI shows on each run decided."""
    est, decision = report.estimate, report.decision
    values = {
        "verdict": report.verdict, "goal": str(report.goal), "protocol": report.protocol,
        "step": ",".join(str(s) for s in sorted({r.step for r in report.runs})),
        "estimate_mm": f"{est.mean:.2f}" if est is not None else "",
        "interval_mm": f"[{est.low:.2f}, {est.high:.2f}]" if est is not None else "",
        "p_goal": f"{decision.p_goal:.3f}" if decision is not None else "",
        "episodes": str(est.episodes) if est is not None else "",
    }
    return {tracking.decision_tag(key): values[key] for key in tracking.DECISION_FIELDS}


def write_tags(reports: list[DecisionReport], tracking_uri: str | None = None) -> int:
    """Each decided run gets its decision's tags; returns how many runs were tagged."""
    runs = [(run.run_id, report) for report in reports for run in report.runs]
    if not runs:
        return 0
    from mlflow.tracking import MlflowClient


    client = MlflowClient(tracking_uri=tracking_uri or mlflow_tracking_uri())
    for run_id, report in runs:
        for key, value in decision_tags(report).items():
            client.set_tag(run_id, key, value)
    announce_verdicts(client, reports)
    return len(runs)


def plot_decisions(reports: list[DecisionReport], out: Path) -> Path:
    """Per-episode errors (dots), the estimate and its 95 % interval (bar), the goal (red line), one row per decision."""
    if out.suffix.lower() != ".png":
        raise UserError(f"{out.name} is not a .png file", field="--plot", hint="e.g. --plot decide.png")
    drawn = [r for r in reports if r.runs or r.point is not None]
    if not drawn:
        raise UserError("nothing to plot: no per-episode results and no baseline value", field="--plot",
                        hint="decide a run that logged per-episode results")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 1.2 + 0.8 * len(drawn)), dpi=100)
    for index, report in enumerate(drawn):
        y = len(drawn) - 1 - index
        for member in report.runs:
            axis.scatter(member.errors_mm, [y + 0.15] * len(member.errors_mm), s=18, alpha=0.7, color="tab:blue")
        if report.estimate is not None:
            est = report.estimate
            axis.errorbar([est.mean], [y - 0.1], xerr=[[est.mean - est.low], [est.high - est.mean]], fmt="o",
                          color="black", capsize=4)
        elif report.point is not None:
            axis.scatter([report.point], [y - 0.1], marker="D", color="grey")
        axis.axvline(report.goal.value, color="red", linewidth=1.0)
    axis.set_yticks(range(len(drawn)), [f"{r.subject}: {r.verdict}" for r in reversed(drawn)], fontsize=8)
    axis.set(xlabel=f"{drawn[0].goal.metric} per episode (mm); bar: mean and 95 % interval; red: goal",
             title=f"goal {drawn[0].goal}")
    axis.grid(alpha=0.3, axis="x")

    return save_png(figure, out)


def paired_lines(reports: list[DecisionReport]) -> list[str]:
    """Each measured decision against the first one evaluated on the very same episodes: the paired
    interval of the per-episode differences (episode-to-episode spread cancels)."""

    measured = [r for r in reports if r.runs and len(r.runs[0].episodes) >= 2]
    lines = []
    for base_index, base in enumerate(measured):
        for other in measured[base_index + 1:]:
            if other.protocol != base.protocol or other.runs[0].episodes != base.runs[0].episodes:
                continue
            a = [sum(values) / len(values) for values in zip(*(r.errors_mm for r in other.runs))]
            b = [sum(values) / len(values) for values in zip(*(r.errors_mm for r in base.runs))]
            diff = paired(a, b)
            lines.append(f"paired {other.subject} − {base.subject}: {diff.mean:+.1f} mm, 95 % interval "
                         f"[{diff.low:+.1f}, {diff.high:+.1f}] mm on the same {diff.episodes} episodes under "
                         f"{base.protocol} ({METHOD} of the per-episode differences)")
    return lines

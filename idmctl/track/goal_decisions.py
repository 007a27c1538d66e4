"""``idmctl decide EXP``: does the goal hold, with what uncertainty, at which checkpoint, under which protocol.

Reads the per-episode results the evaluators log (``episodes/<metric>/step-N.json`` in the run's
MLflow artifacts), groups the runs of one spec (same spec hash) that share their episodes into one
seeds × episodes estimate, and hands the numbers to :mod:`idmctl.track.goal_stats`. A recorded baseline
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
from idmctl.track.goal_stats import (METHOD, decide, episodes_to_decide, estimate, paired, sd_that_decides,
                                     t_quantile)

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
    unit: str = "mm"
    """The metric's own unit (``mm`` for EEF errors; empty for a rate or a count)."""

    @property
    def verdict(self) -> str:
        return self.decision.verdict if self.decision is not None else "UNDECIDED"

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject, "goal": str(self.goal), "protocol": self.protocol, "verdict": self.verdict,
            "runs": [{"label": r.label, "run_id": r.run_id, "step": r.step, "chosen": r.chosen,
                      "protocol": r.protocol.to_json(),
                      "episodes": [{"episode": e, "error_mm" if self.unit == "mm" else "value": v}
                                   for e, v in zip(r.episodes, r.errors_mm)]}
                     for r in self.runs],
            "estimate": self.estimate.to_json() if self.estimate is not None else None,
            "decision": self.decision.to_json() if self.decision is not None else None,
            "point_estimate_mm": self.point, "point_episodes": self.point_episodes, "unit": self.unit,
            "warnings": self.warnings, "lines": self.lines,
        }


def _mm(value: float, unit: str = "mm") -> str:
    return f"{value:.1f} mm" if unit == "mm" else f"{value:.4g}" + (f" {unit}" if unit else "")


def unit_of(metric: str) -> str:
    """``mm`` for an EEF error (``eef_mm_24ep``, ``final_dist_mm``); else the metric's own scale (no unit)."""
    return "mm" if tracking.EEF_METRIC.fullmatch(metric) or "mm" in metric.split("_") else ""


def _bad_artifact(row: Any, where: str, what: str, hint: str) -> UserError:
    return UserError(what, file=f"run {row.label} ({row.run_id})", field=where, hint=hint)


def _episode_values(row: Any, path: str, document: Any) -> tuple[list[str], list[float]]:
    """The artifact's episodes, judged: a damaged or incomplete file, a missing, non-finite or negative
    error is one line naming the run and the episode (never a traceback, never an interval of NaN)."""
    episodes = document.get("episodes") if isinstance(document, dict) else None
    if not isinstance(episodes, list) or not episodes:
        raise _bad_artifact(row, path, "no episodes in the per-episode artifact", "a damaged or incomplete artifact: re-run the evaluation")
    names, values = [], []
    for index, item in enumerate(episodes):
        if not isinstance(item, dict) or "episode" not in item or "error_mm" not in item:
            raise _bad_artifact(row, f"{path} episodes[{index}]", "not {episode, error_mm}", "a damaged artifact: re-run the evaluation")
        value = item["error_mm"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad_artifact(row, f"{path} episode {item['episode']}", f"error_mm is not a number: {str(value)[:40]!r}",
                                "a damaged artifact: re-run the evaluation")
        if not math.isfinite(value) or value < 0:
            raise _bad_artifact(row, f"{path} episode {item['episode']}", f"error_mm is {value}",
                                "an EEF error is finite and ≥ 0: the evaluator failed on this episode; fix and re-run it")
        names.append(str(item["episode"]))
        values.append(float(value))
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise _bad_artifact(row, f"{path} episode {duplicate}", "episode listed twice", "a damaged artifact: re-run the evaluation")
    return names, values


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
    local = Path(download_artifacts(run_id=row.run_id, artifact_path=logged[step], tracking_uri=client.tracking_uri))
    try:  # a million episodes are ~40 MB of JSON: read once, judged row by row (no copy per episode)
        document = json.loads(local.read_text(encoding="utf-8"))
        protocol = Protocol.from_json(document["protocol"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise _bad_artifact(row, logged[step], f"damaged per-episode artifact: {type(exc).__name__}: {str(exc)[:60]}",
                            "a damaged or incomplete artifact: re-run the evaluation of this step") from None
    names, values = _episode_values(row, logged[step], document)
    return RunEpisodes(label=row.label, run_id=row.run_id, spec_hash=row.tags.get(tracking.TAG_SPEC_HASH, ""),
                       step=step, chosen=checkpoint if checkpoint in (CHECKPOINT_LAST, CHECKPOINT_BEST) else "step",
                       protocol=protocol, episodes=names, errors_mm=values)


def build_decisions(target: str, goal_text: str | None = None, checkpoint: str = CHECKPOINT_LAST,
                    tracking_uri: str | None = None) -> list[DecisionReport]:
    """The decisions for a run (``exp#chain`` or run id), an experiment, a sweep, or a recorded baseline."""

    if checkpoint not in (CHECKPOINT_LAST, CHECKPOINT_BEST) and not checkpoint.isdigit():
        raise UserError(f"not a checkpoint: {checkpoint!r}", field="--checkpoint", hint="last, best, or a step number")
    baselines = {row.name: row for row in load_baselines()}
    if target in baselines:
        row = baselines[target]
        goal = _goal(goal_text, None, f"baseline {target}")
        return [_evaluation_decision(row, goal) if row.evaluation is not None else _baseline_decision(row, goal)]
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
        logged = sorted({m for row in rows for m in row.metrics})
        if goal.metric not in logged and not tracking.EEF_METRIC.fullmatch(goal.metric):
            raise UserError(f"no run of {experiment} logged {goal.metric}", field="--goal",
                            hint=f"a metric they logged: {', '.join(logged)[:300] or 'none yet'}")
        reports += _run_decisions(client, experiment, rows, goal, checkpoint)
    return reports


def _evaluation_decision(row: Any, goal: Goal) -> DecisionReport:
    """A baseline with per-episode results (imported, or ``episodes_file``): decided like a run."""
    record = row.evaluation
    if goal.metric not in record.metrics:
        raise UserError(f"{row.name} has no {goal.metric}", file=record.source, field="--goal",
                        hint=f"its metrics: {', '.join(record.metrics)}")
    if goal.protocol and goal.protocol != record.protocol:
        report = DecisionReport(subject=f"{row.label} (baseline)", goal=goal, protocol=record.protocol, unit=unit_of(goal.metric))
        report.lines.append(f"no result under {goal.protocol}: {row.name} was evaluated under {record.protocol}")
        return report
    keys, matrix = record.matrix(goal.metric)
    seeds = sorted(set(record.seeds)) if record.seeds_share_episodes else []
    protocol = Protocol(name=record.protocol, kind="imported", task="", split="", episodes=keys,
                        seeds=[int(s) for s in seeds if s.lstrip("-").isdigit()],
                        evaluator=f"file {Path(record.source).name} sha256:{record.sha256[:12]}")
    members = [RunEpisodes(label=row.label + (f" seed {seed}" if seeds else ""), run_id=f"eval:{row.name}",
                           spec_hash=f"eval:{row.name}", step=0, chosen="file", protocol=protocol,
                           episodes=keys, errors_mm=values)
               for seed, values in zip(seeds or [""], matrix)]
    subject = f"{row.label} (baseline, {len(matrix)} seeds)" if len(matrix) > 1 else f"{row.label} (baseline)"
    return _measured_decision(subject, goal, record.protocol, members)


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

    unit = unit_of(goal.metric)
    report = DecisionReport(subject=subject, goal=goal, protocol=protocol, runs=members, unit=unit)
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
    if first.chosen != "file":
        report.lines.append(f"checkpoint: {step_text} ({chosen})")
    report.lines.append(f"protocol: {first.protocol.describe()}")
    for member in members:
        if n <= 50:
            values = ", ".join(f"{v:.4g}" if unit != "mm" else f"{v:.1f}" for v in member.errors_mm)
            report.lines.append(f"per episode ({member.label}): {values}" + (f" {unit}" if unit else ""))
        else:
            report.lines.append(f"per episode ({member.label}): {n:,} episodes (--json lists them)")
    if n < 2:
        report.lines.append(f"{n} episode has no spread: no interval; evaluate on more episodes")
        return report
    est = estimate(matrix, goal=goal.value)
    report.estimate = est
    total = sum(sum(row) for row in matrix)
    u = f" {unit}" if unit else ""
    if est.successes is not None:
        report.lines.append(f"estimate: success rate {est.successes}/{n} = {est.mean:.3f}")
        report.lines.append(f"95 % interval: [{est.low:.3f}, {est.high:.3f}] ({est.method})")
    else:
        report.lines.append(f"estimate: mean {_mm(est.mean, unit)} = {total:.1f}{u} / ({k} × {n})" if k > 1 else
                            f"estimate: mean {_mm(est.mean, unit)} = {total:.1f}{u} / {n} episodes")
        spread = "sd of the per-episode means" if k > 1 else "sd"
        report.lines.append(f"spread: {spread} {_mm(est.sd, unit)}, standard error {_mm(est.se, unit)}"
                            + (f" = {est.sd:.1f} / √{n}" if k == 1 else " (episodes and seeds)"))
        resampled = (f", {est.resamples:,} resamples; Monte-Carlo error of the ends ±{est.mc_error_low:.2g} / "
                     f"±{est.mc_error_high:.2g}{u}" if est.resamples else "")
        kept = f"; {est.zero_spread_resamples} without spread kept" if est.zero_spread_resamples else ""
        report.lines.append(f"95 % interval: [{est.low:.1f}, {est.high:.1f}]{u} ({est.method}"
                            + (" and seeds" if k > 1 and est.method == METHOD else "") + f"{resampled}{kept})")
    decision = decide(est, goal.op, goal.value)
    report.decision = decision
    report.lines.append(f"P({goal.metric} {goal.op} {goal.value:g}) = {decision.p_goal:.2f}")
    report.lines.append(_verdict_line(goal, est, decision, n, unit))
    return report


def _verdict_line(goal: Goal, est: Any, decision: Any, n: int, unit: str = "mm") -> str:
    u = f" {unit}" if unit else ""
    digits = 1 if unit == "mm" else 3
    interval = f"[{est.low:.{digits}f}, {est.high:.{digits}f}]{u}"
    if decision.verdict == "PASS":
        return f"verdict: PASS (the whole interval {interval} is {goal.op} {goal.value:g}{u})"
    if decision.verdict == "FAIL":
        return f"verdict: FAIL (no part of the interval {interval} is {goal.op} {goal.value:g}{u})"
    power = f"{decision.power:.0%}".replace("%", " %")
    if decision.episodes_to_decide is None and est.seeds > 1:
        return (f"verdict: UNDECIDED (the interval {interval} straddles {goal.value:g}{u}; it is as wide as the "
                f"{est.seeds} seeds disagree: more seeds, not more episodes of these, decide it)")
    if decision.episodes_to_decide is None:
        return (f"verdict: UNDECIDED (the interval {interval} straddles {goal.value:g}{u} and the mean sits so near "
                f"it that no practical number of episodes decides it with {power} probability)")
    more = decision.episodes_to_decide - n
    plug_in = episodes_to_decide(est.sd, abs(est.mean - goal.value), est.level) if est.successes is None else None
    return (f"verdict: UNDECIDED (the interval {interval} straddles {goal.value:g}{u}); {decision.episodes_to_decide} "
            f"episodes in all ({more} more of the same kind) decide it with {power} probability, counting that the "
            f"mean {_mm(est.mean, unit)} and the sd {_mm(est.sd, unit)} are themselves uncertain"
            + (f" (taken as exact they would say {plug_in}, which decides only about half the time)" if plug_in else ""))


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
    report.lines.append("verdict: UNDECIDED (a point estimate: a mean without its episodes has no interval; import "
                        "the per-episode file with `idmctl eval import FILE --name NAME --protocol "
                        f"{protocol}` to decide it)")
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
    # An imported evaluation has no MLflow run to tag.
    runs = [(run.run_id, report) for report in reports for run in report.runs if not run.run_id.startswith("eval:")]
    if not runs:
        return 0
    from mlflow.tracking import MlflowClient


    client = MlflowClient(tracking_uri=tracking_uri or mlflow_tracking_uri())
    for run_id, report in runs:
        for key, value in decision_tags(report).items():
            client.set_tag(run_id, key, value)
    # An imported evaluation has no run to mark as announced: only tracked runs' verdicts are sent.
    announce_verdicts(client, [r for r in reports if r.runs and not r.runs[0].run_id.startswith("eval:")])
    return len(runs)


def plot_decisions(reports: list[DecisionReport], out: Path) -> Path:
    """Per-episode errors (dots), the estimate and its 95 % interval (bar), the goal (red line), one row per decision."""
    if out.suffix.lower() != ".png":
        raise UserError(f"{out.name} is not a .png file", field="--plot", hint="e.g. --plot decide.png")
    drawn = [r for r in reports if r.runs or r.point is not None]
    if not drawn:
        raise UserError("nothing to plot: no per-episode results and no baseline value", field="--plot",
                        hint="decide a run that logged per-episode results")
    figure = decision_figure(drawn)
    return save_png(figure, out)


def decision_figure(drawn: list[DecisionReport]) -> Any:
    """Per-episode values (dots), the estimate and its 95 % interval (bar), a baseline's point (diamond) and
    the goal (red line), one row per decision: ``--plot`` and the card's ``--html`` draw the same figure."""
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
    unit = f" ({drawn[0].unit})" if drawn[0].unit else ""
    axis.set(xlabel=f"{drawn[0].goal.metric} per episode{unit}; bar: mean and 95 % interval; red: goal",
             title=f"goal {drawn[0].goal}")
    axis.grid(alpha=0.3, axis="x")
    return figure


def paired_results(reports: list[DecisionReport]) -> list[dict[str, Any]]:
    """Each measured decision against the first one evaluated on the very same episodes under the same
    protocol: the paired difference (other − base, per episode, aligned by episode id) and its interval,
    as numbers in the metric's own unit (the episode-to-episode spread cancels)."""
    measured = [r for r in reports if r.runs and len(r.runs[0].episodes) >= 2]
    results = []
    for base_index, base in enumerate(measured):
        for other in measured[base_index + 1:]:
            if other.protocol != base.protocol or set(other.runs[0].episodes) != set(base.runs[0].episodes):
                continue
            order = base.runs[0].episodes
            def means(report: DecisionReport) -> list[float]:
                by_episode = [dict(zip(r.episodes, r.errors_mm)) for r in report.runs]
                return [sum(run[e] for run in by_episode) / len(by_episode) for e in order]
            diff = paired(means(other), means(base), goal=0.0)
            results.append({"a": other.subject, "b": base.subject, "metric": base.goal.metric, "unit": base.unit,
                            "protocol": base.protocol, "episodes": diff.episodes, "mean_difference": diff.mean,
                            "low": diff.low, "high": diff.high, "level": diff.level, "method": diff.method,
                            "p_a_below_b": float((diff.draws < 0).mean())})
    return results


def paired_lines(reports: list[DecisionReport], results: list[dict[str, Any]] | None = None) -> list[str]:
    """The paired differences as the text output prints them."""
    lines = []
    for item in results if results is not None else paired_results(reports):
        u = f" {item['unit']}" if item["unit"] else ""
        digits = 1 if item["unit"] == "mm" else 3
        lines.append(f"paired {item['a']} − {item['b']}: {item['mean_difference']:+.{digits}f}{u}, 95 % interval "
                     f"[{item['low']:+.{digits}f}, {item['high']:+.{digits}f}]{u} on the same {item['episodes']} episodes "
                     f"under {item['protocol']} ({item['method']} of the per-episode differences)")
    return lines

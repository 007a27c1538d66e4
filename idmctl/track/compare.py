"""Compare runs on EEF mm: recorded baselines, tracked MLflow runs and each experiment's goal.

The team decides by one number (end-effector error in mm, lower is better) against the baselines of
card A and an adoption criterion (``goal: eef_mm_24ep <= 125``). MLflow's own tables show only the
last value of a metric, so every metric here is summarised from its full history as *best* and
*last*. Verdicts use the last value: the final checkpoint is what would be adopted, and picking the
best eval point after the fact selects on the evaluation set.

mlflow is imported only inside the functions that read runs (it costs ~1.3 s).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import yaml

from ground import tracking
from ground.errors import UserError
from ground.mlflow_store import sqlite_file, store_init_lock
from ground.paths import experiments_dir, home, mlflow_tracking_uri
from ground.spec.loader import BASELINES_FILE, load_experiments, load_spec, resolve_spec_path
from ground.protocols import UNRECORDED
from ground.spec.schema import Goal
from idmctl.core.job_state import JobState

_BASELINE_KEYS = {"name", "label", "steps", "effective_batch", "note", "state", "protocols", "episodes_file",
                  "seeds_share_episodes"}
_BASELINE_STATES = ("finished", "preempted")
# Slurm states after which the MLflow status (possibly stuck at RUNNING after a kill) is stale.

RowKind = Literal["baseline", "run", "planned"]


@dataclass(frozen=True)
class MetricSummary:
    """One metric over a run: the best and the last logged value, with their steps."""

    best: float
    last: float
    best_step: int | None = None
    last_step: int | None = None
    points: int = 1


@dataclass
class CompareRow:
    """One line of the compare table: a recorded baseline, a tracked run, or a planned experiment."""

    kind: RowKind
    name: str
    """Baseline or experiment name (``latent_c_n4``)."""
    label: str
    """What the table shows: the baseline's label or the run name (``latent_c_n4#12``)."""
    status: str
    """finished, running, preempted, failed, killed, not started."""
    steps_done: int | None = None
    steps_planned: int | None = None
    effective_batch: int | None = None
    metrics: dict[str, MetricSummary] = field(default_factory=dict)
    note: str = ""
    goal: str | None = None
    verdict: str = "—"
    run_id: str | None = None
    experiment_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    protocols: dict[str, str] = field(default_factory=dict)
    """metric → the evaluation protocol it was measured under (``ground.protocols``); absent: not recorded."""
    evaluation: Any = None
    """A baseline's per-episode results (``idmctl.track.evalfile.EvalFile``): imported, or the entry's
    ``episodes_file``; None when only its means are recorded (card A)."""

    def protocol(self, metric: str) -> str:
        return self.protocols.get(metric, UNRECORDED)

    @property
    def in_progress(self) -> bool:
        return self.status == "running"

    def to_json(self) -> dict[str, Any]:
        evaluation, self.evaluation = self.evaluation, None
        try:
            data = asdict(self)
        finally:
            self.evaluation = evaluation
        data["metrics"] = {key: asdict(value) for key, value in self.metrics.items()}
        data["evaluation"] = ({"source": evaluation.source, "sha256": evaluation.sha256, "episodes": evaluation.rows}
                              if evaluation is not None else None)
        return data


def is_lower_better(metric: str) -> bool:
    """EEF error and loss fall as models improve; throughput metrics rise."""
    return metric not in (tracking.M_SAMPLES_PER_S,)


def summarize(history: list[tuple[int, float]], metric: str) -> MetricSummary | None:
    """(step, value) points in logging order → best and last; None when there are none."""
    if not history:
        return None
    last_step, last = max(enumerate(history), key=lambda item: (item[1][0], item[0]))[1]
    pick = min if is_lower_better(metric) else max
    best_step, best = pick(history, key=lambda point: point[1])
    return MetricSummary(best=best, last=last, best_step=best_step, last_step=last_step, points=len(history))


# ---------------------------------------------------------------------------------------- baselines

def baselines_path() -> Path:
    return experiments_dir() / BASELINES_FILE


def load_baselines(path: Path | None = None) -> list[CompareRow]:
    """Card A's recorded baselines (``experiments/baselines.yaml``), strictly validated."""
    path = path or baselines_path()
    if not path.exists():
        return []
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except yaml.YAMLError as exc:
        raise UserError(f"invalid YAML: {exc}".splitlines()[0], file=str(path), hint="fix the YAML syntax") from exc
    if not isinstance(entries, list):
        raise UserError("baselines must be a list of entries", file=str(path), hint="start each entry with `- name:`")
    rows = [_baseline_row(entry, index, path) for index, entry in enumerate(entries)]
    return rows + imported_rows({row.name for row in rows})


def imported_rows(taken: set[str]) -> list[CompareRow]:
    """Evaluations imported with ``idmctl eval import``: baselines with their per-episode spread."""
    from idmctl.track.evalfile import list_evals, load_eval  # start-up: read only where a baseline has per-episode results

    rows = []
    for name in list_evals():
        record = load_eval(name)
        if record is None or name in taken:
            continue
        rows.append(_evaluation_row(name, f"{name} (imported)", record, f"{record.rows} episodes from {Path(record.source).name}"))
    return rows


def _evaluation_row(name: str, label: str, record: Any, note: str) -> CompareRow:
    metrics = {m: MetricSummary(best=sum(v) / len(v), last=sum(v) / len(v)) for m, v in record.metrics.items()}
    return CompareRow(kind="baseline", name=name, label=label, status="finished", metrics=metrics, note=note,
                      protocols={m: record.protocol for m in record.metrics}, evaluation=record)


def _baseline_row(entry: Any, index: int, path: Path) -> CompareRow:
    where = f"[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise UserError("entry needs a `name`", file=str(path), field=where, hint="e.g. - name: latent_a_v1")
    metrics: dict[str, MetricSummary] = {}
    for key, value in entry.items():
        if key in _BASELINE_KEYS:
            continue
        if not tracking.EEF_METRIC.fullmatch(str(key)):
            raise UserError("unknown key", file=str(path), field=f"{where}.{key}",
                            hint=f"allowed: {', '.join(sorted(_BASELINE_KEYS))}, eef_mm_<n>ep, sim_eef_mm_<n>ep")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"not a number: {value!r}", file=str(path), field=f"{where}.{key}",
                            hint="EEF error in mm, or null when not measured")
        metrics[str(key)] = MetricSummary(best=float(value), last=float(value))
    for key in ("steps", "effective_batch"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserError(f"not a positive integer: {value!r}", file=str(path), field=f"{where}.{key}",
                            hint="an integer, or null when unknown")
    protocols = entry.get("protocols") or {}
    if not isinstance(protocols, dict) or not all(
            tracking.EEF_METRIC.fullmatch(str(k)) and isinstance(v, str) and v.split() == [v] for k, v in protocols.items()):
        raise UserError("protocols must map EEF metrics to protocol names", file=str(path), field=f"{where}.protocols",
                        hint="e.g. protocols: {eef_mm_24ep: card-A/MG-30-held-out:24ep} (names without spaces)")
    evaluation = _episodes_file(entry, where, path, metrics, protocols)
    state = entry.get("state", "finished")
    if state not in _BASELINE_STATES:
        raise UserError(f"unknown state {state!r}", file=str(path), field=f"{where}.state",
                        hint=f"one of: {', '.join(_BASELINE_STATES)}")
    return CompareRow(kind="baseline", name=entry["name"], label=str(entry.get("label") or entry["name"]),
                      status=state, steps_done=entry.get("steps"), steps_planned=entry.get("steps"),
                      effective_batch=entry.get("effective_batch"), metrics=metrics,
                      note=str(entry.get("note") or ""), protocols={str(k): v for k, v in protocols.items()},
                      evaluation=evaluation)


def _episodes_file(entry: dict[str, Any], where: str, path: Path, metrics: dict[str, MetricSummary],
                   protocols: dict[str, Any]) -> Any:
    """``episodes_file: evals/x.csv`` (beside baselines.yaml): the per-episode results behind the entry's
    numbers. Its columns named like the entry's metrics are read; a mean written in the entry too must
    agree with the file's (one number, one place: leave it out)."""
    given = entry.get("episodes_file")
    if given is None:
        return None
    if not isinstance(given, str) or not given.strip():
        raise UserError(f"not a path: {given!r}", file=str(path), field=f"{where}.episodes_file",
                        hint="a CSV or JSON of per-episode results, relative to this file")
    from idmctl.track.evalfile import read_eval_file  # start-up: read only where a baseline has per-episode results

    file = Path(given) if Path(given).is_absolute() else path.parent / given
    wanted = [m for m in protocols if tracking.EEF_METRIC.fullmatch(str(m))]
    if len(set(protocols.values())) > 1 or not wanted:
        raise UserError("an episodes_file needs one protocol for its metrics", file=str(path), field=f"{where}.protocols",
                        hint="e.g. protocols: {eef_mm_24ep: card-A/MG-30-held-out:24ep}")
    record = read_eval_file(file, name=str(entry["name"]), protocol=str(protocols[wanted[0]]), metrics=wanted,
                            seeds_share_episodes=bool(entry.get("seeds_share_episodes", False)))
    for metric, values in record.metrics.items():
        mean = sum(values) / len(values)
        written = metrics.get(metric)
        if written is not None and abs(written.last - mean) > 0.005 * max(1.0, abs(mean)):
            raise UserError(f"{metric}: {written.last:g} here, {mean:.2f} in {file.name}", file=str(path),
                            field=f"{where}.{metric}", hint="the file's mean is the number: remove it from the entry")
        metrics[metric] = MetricSummary(best=mean, last=mean)
    return record


# --------------------------------------------------------------------------------------------- runs

def has_tracking_store() -> bool:
    """False when the default SQLite store was never created: no runs, and no need to import mlflow."""
    store = sqlite_file(mlflow_tracking_uri())
    return store is None or store.exists()


def load_runs(tracking_uri: str | None = None) -> list[CompareRow]:
    """Every run of the ``idmctl`` MLflow experiment, with best/last of each tracked metric."""
    if tracking_uri is None and not has_tracking_store():
        return []
    from mlflow.tracking import MlflowClient

    with store_init_lock():
        client = MlflowClient(tracking_uri=tracking_uri or mlflow_tracking_uri())
    experiment = client.get_experiment_by_name(tracking.MLFLOW_EXPERIMENT)
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], max_results=5000, order_by=["attribute.start_time ASC"])
    # Cache build jobs log their own runs (files built, files/s): they have no loss or EEF to compare.
    return [_run_row(client, run) for run in runs if tracking.TAG_BUILD not in run.data.tags]


def surviving_history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric's (step, value) curve without the points a resume from an older checkpoint superseded."""
    points = [(int(m.timestamp), int(m.step), float(m.value)) for m in client.get_metric_history(run_id, key)]
    starts = [(int(m.timestamp), int(m.step)) for m in client.get_metric_history(run_id, tracking.M_ATTEMPT_START)]
    return tracking.surviving(points, starts)


def _run_row(client: Any, run: Any) -> CompareRow:
    tags: dict[str, str] = dict(run.data.tags)
    params: dict[str, str] = dict(run.data.params)
    wanted = [key for key in run.data.metrics if key == tracking.M_LOSS or tracking.EEF_METRIC.fullmatch(key)]
    metrics: dict[str, MetricSummary] = {}
    for key in wanted:
        history = surviving_history(client, run.info.run_id, key)
        summary = summarize(history, key)
        if summary is not None:
            metrics[key] = summary
    steps_done = max((s.last_step or 0 for s in metrics.values()), default=None)
    if tracking.M_LOSS in metrics:
        steps_done = metrics[tracking.M_LOSS].last_step
    experiment = tags.get(tracking.TAG_EXPERIMENT) or run.info.run_name.split("#")[0]
    return CompareRow(
        kind="run", name=experiment, label=run.info.run_name or run.info.run_id[:8],
        status=_run_status(run.info.status, tags.get(tracking.TAG_SLURM_STATE)),
        steps_done=steps_done, steps_planned=_int(params.get(tracking.P_TRAIN_STEPS)),
        effective_batch=_int(params.get(tracking.P_EFFECTIVE_BATCH)), metrics=metrics,
        note=_run_note(tags, params), goal=_goal_param(params.get(tracking.P_GOAL)), run_id=run.info.run_id,
        experiment_id=run.info.experiment_id, tags=tags,
        protocols={key: tags[tracking.protocol_tag(key)] for key in metrics if tracking.protocol_tag(key) in tags},
    )


def _run_status(mlflow_status: str, slurm_state: str | None) -> str:
    state = JobState.of(slurm_state)
    if state is not None and state.is_failed:
        return "killed" if state is JobState.CANCELLED else state.value.lower()
    return {"RUNNING": "running", "SCHEDULED": "running", "FINISHED": "finished",
            "FAILED": "failed", "KILLED": "killed"}.get(mlflow_status, mlflow_status.lower())


def _run_note(tags: dict[str, str], params: dict[str, str]) -> str:
    parts = []
    routing = _routing_text(params)
    if tags.get(tracking.TAG_ROUTING_N):
        parts.append(f"N={tags[tracking.TAG_ROUTING_N]}" + (f" blocks {routing}" if routing else ""))
    if tags.get(tracking.TAG_SPEC_HASH):
        parts.append(f"spec {tags[tracking.TAG_SPEC_HASH][:12]}")
    if tags.get(tracking.TAG_FAILURE_CAUSE):
        parts.append(f"cause: {tags[tracking.TAG_FAILURE_CAUSE]}")
    return ", ".join(parts)


def _routing_text(params: dict[str, str]) -> str | None:
    """Cosmos blocks the run was routed to (``5/14/23/32``), from the logged spec params."""
    try:
        cached = json.loads(params[tracking.P_CACHED_LAYERS])
        selected = json.loads(params[tracking.P_SELECTED_LAYERS])
        return "/".join(str(cached[index]) for index in selected)
    except (KeyError, ValueError, TypeError, IndexError):
        return None


def _goal_param(text: str | None) -> str | None:
    """The goal as logged in the flattened params (``None`` is logged as the string "None")."""
    return text if text not in (None, "", "None") else None


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text not in (None, "", "None") else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------------- the report

@dataclass
class SweepGroup:
    """The runs (and planned variants) of one ``sweep:`` spec, with the swept values of each."""

    sweep: str
    axes: list[str]
    rows: list[tuple[str, dict[str, Any], CompareRow]]
    """(variant, {axis: value}, row), in the sweep's order."""

    def to_json(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "axes": self.axes,
                "variants": [{"variant": v, "axes": values, "label": row.label, "status": row.status}
                             for v, values, row in self.rows]}


@dataclass
class CompareReport:
    metric: str
    columns: list[str]
    """Metric columns shown, in order (EEF metrics by episode count, simulator ones after)."""
    rows: list[CompareRow]
    goals: dict[str, str]
    """experiment name → its goal text."""
    sweeps: list[SweepGroup] = field(default_factory=list)
    """Rows grouped by the sweep they are variants of, swept axes as columns."""

    @property
    def runs(self) -> list[CompareRow]:
        return [row for row in self.rows if row.kind == "run"]

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "columns": self.columns, "goals": self.goals,
                "rows": [row.to_json() for row in self.rows], "sweeps": [g.to_json() for g in self.sweeps]}


def build_report(selection: list[str] | None = None, metric: str = tracking.DEFAULT_RANK_METRIC,
                 tracking_uri: str | None = None) -> CompareReport:
    """Baselines, then the chosen runs (all when ``selection`` is empty) ranked by best ``metric``,
    then chosen experiments that have no run yet ("not started", like card A's planned row)."""
    baselines = load_baselines()
    runs = load_runs(tracking_uri)
    selection = expand_sweeps(selection or [])
    chosen = _select_runs(runs, selection, baselines)
    goals: dict[str, str] = {}
    for row in chosen:
        goal = _spec_goal(row.name) or row.goal
        row.goal = goal
        row.verdict = verdict(row, goal)
        if goal:
            goals.setdefault(row.name, goal)
    planned = _planned_rows(selection or [], chosen, baselines)
    for row in planned:
        if row.goal:
            goals.setdefault(row.name, row.goal)
    # Ranked within each protocol only: numbers of different protocols are never ordered against each other.
    chosen.sort(key=lambda row: (metric not in row.metrics, row.protocol(metric) if metric in row.metrics else "",
                                 row.metrics[metric].best if metric in row.metrics else 0.0, row.label))
    all_rows = [*baselines, *chosen, *planned]
    return CompareReport(metric=metric, columns=_metric_columns(all_rows, metric),
                         rows=all_rows, goals=goals, sweeps=sweep_groups([*chosen, *planned]))


def _sweep_variants(sweep: str) -> list[Any]:

    try:
        variants = load_experiments(sweep)
    except UserError:
        return []
    return variants if variants and variants[0].sweep == sweep else []


def expand_sweeps(selection: list[str]) -> list[str]:
    """A sweep's name selects every one of its variants (``latent_c_phase2`` → ``latent_c_phase2.n4_d4``, …)."""
    expanded: list[str] = []
    for wanted in selection:
        variants = [] if "#" in wanted or "." in wanted else _sweep_variants(wanted)
        expanded += [v.name for v in variants] or [wanted]
    return expanded


def sweep_groups(rows: list[CompareRow]) -> list[SweepGroup]:
    """Rows whose experiment is ``<sweep>.<variant>`` grouped by sweep, in the sweep's variant order."""
    groups: dict[str, SweepGroup] = {}
    specs: dict[str, list[Any]] = {}
    for row in rows:
        sweep, dot, variant = row.name.rpartition(".")
        if not dot:
            continue
        if sweep not in specs:
            specs[sweep] = _sweep_variants(sweep)
        found = next((v for v in specs[sweep] if v.name == row.name), None)
        if found is None:
            continue
        group = groups.setdefault(sweep, SweepGroup(sweep, list(found.axes), []))
        group.rows.append((variant, dict(found.axes), row))
    for sweep, group in groups.items():
        order = [v.name for v in specs[sweep]]
        group.rows.sort(key=lambda item: (order.index(f"{sweep}.{item[0]}"), item[2].label))
    return list(groups.values())


def _select_runs(runs: list[CompareRow], selection: list[str], baselines: list[CompareRow]) -> list[CompareRow]:
    if not selection:
        return runs

    chosen = []
    for wanted in selection:
        matches = [row for row in runs if wanted in (row.name, row.label, row.run_id)]
        if not matches and wanted not in {b.name for b in baselines}:
            # UserError with a did-you-mean when it names nothing at all (a sweep variant is no file)
            load_spec(wanted) if "." in wanted else resolve_spec_path(wanted)
        chosen += [row for row in matches if row not in chosen]
    return chosen


def _planned_rows(selection: list[str], chosen: list[CompareRow], baselines: list[CompareRow]) -> list[CompareRow]:

    rows = []
    started = {row.name for row in chosen} | {row.label for row in chosen}
    for wanted in selection:
        if wanted in started or wanted in {b.name for b in baselines} or "#" in wanted:
            continue
        resolved = load_spec(wanted)
        rows.append(CompareRow(kind="planned", name=resolved.name, label=resolved.name, status="not started",
                               steps_planned=resolved.spec.train.steps,
                               effective_batch=resolved.spec.train.effective_batch,
                               note=resolved.spec.description, goal=resolved.spec.goal, verdict="pending"))
    return rows


def _spec_goal(experiment: str) -> str | None:
    """The experiment's goal from its spec today; None when the spec is gone (the run's params then)."""

    try:
        return load_spec(experiment).spec.goal
    except UserError:
        return None


def verdict(row: CompareRow, goal_text: str | None) -> str:
    """PASS/FAIL of the goal metric's last value; "(so far)" while the run is in progress. A goal that
    names a protocol is judged only on a result under it: any other is "no result under <protocol>"."""
    if not goal_text:
        return "—"
    goal = Goal.parse(goal_text)
    summary = row.metrics.get(goal.metric)
    if summary is not None and goal.protocol and row.protocol(goal.metric) != goal.protocol:
        return f"no result under {goal.protocol}"
    if summary is None:
        if goal.protocol:
            return "pending" if row.in_progress else f"no result under {goal.protocol}"
        return "pending" if row.in_progress else f"no {goal.metric}"
    outcome = "PASS" if goal.passes(summary.last) else "FAIL"
    return f"{outcome} (so far)" if row.in_progress else outcome


COLUMN_UNDER = " under "
"""A column key ``eef_mm_24ep under card-A/MG-30-held-out:24ep``: one metric, one protocol."""


def column_key(metric: str, protocol: str | None) -> str:
    return f"{metric}{COLUMN_UNDER}{protocol}" if protocol else metric


def split_column(column: str) -> tuple[str, str | None]:
    metric, _, protocol = column.partition(COLUMN_UNDER)
    return metric, protocol or None


def column_value(row: CompareRow, column: str) -> MetricSummary | None:
    """The row's value in ``column``: only when it was measured under the column's protocol."""
    metric, protocol = split_column(column)
    summary = row.metrics.get(metric)
    if summary is None or (protocol is not None and row.protocol(metric) != protocol):
        return None
    return summary


def _metric_columns(rows: list[CompareRow], metric: str) -> list[str]:
    """One column per metric, or one per (metric, protocol) where rows measured it under several
    protocols: a number never shares a column with a number of another protocol."""
    names = {tracking.eef_metric(5), tracking.eef_metric(24), metric}
    for row in rows:
        names.update(row.metrics)
        if row.goal:
            names.add(Goal.parse(row.goal).metric)
    names.discard(tracking.M_LOSS)

    def order(name: str) -> tuple[int, int, str]:
        match = tracking.EEF_METRIC.fullmatch(name)
        if match:
            return (1 if match.group(1) else 0, int(match.group(2)), name)
        return (2, 0, name)

    columns = []
    for name in sorted(names, key=order):
        protocols = list(dict.fromkeys(row.protocol(name) for row in rows if name in row.metrics))
        columns += [column_key(name, p) for p in protocols] if len(protocols) > 1 else [name]
    return columns


def column_protocols(report: "CompareReport") -> dict[str, list[str]]:
    """protocol → the labels of the rows with a number under it (for the footnote that names them)."""
    found: dict[str, list[str]] = {}
    for row in report.rows:
        for metric in row.metrics:
            if metric in report.columns or any(split_column(c)[0] == metric for c in report.columns):
                labels = found.setdefault(row.protocol(metric), [])
                if row.label not in labels:
                    labels.append(row.label)
    return found


# ------------------------------------------------------------------------------------------- links

def run_url(run_id: str, base_url: str) -> str:
    """The MLflow UI page of one run; MLflow 3 resolves ``#/runs/<id>`` to its experiment itself."""
    return f"{base_url.rstrip('/')}/#/runs/{run_id}"


def compare_url(run_ids: list[str], experiment_ids: list[str], base_url: str) -> str:
    """MLflow 3's side-by-side page: ``#/compare-runs?runs=[...]&experiments=[...]`` (JSON lists)."""
    runs = quote(json.dumps(run_ids, separators=(",", ":")))
    experiments = quote(json.dumps(sorted(set(experiment_ids)), separators=(",", ":")))
    return f"{base_url.rstrip('/')}/#/compare-runs?runs={runs}&experiments={experiments}"


def default_store_note() -> str:
    return f"MLflow store {mlflow_tracking_uri()} (IDMCTL_HOME={home()})"

"""The MLflow UI view idmctl keeps on its experiment: the runs **chart** view with the EEF mm charts first.

MLflow 3.17's UI stores named views as experiment tags ``mlflow.sharedViewState.<key>``: a JSON
envelope ``{name, createdAt, updatedAt, state}`` whose ``state`` is the page's UI state, plain
JSON or ``deflate;`` + base64 of the zlib-deflated JSON (read from the UI bundle,
``mlflow/server/js/build``: the shared-view loader and the "Views" menu). Opening
``#/experiments/<id>/runs?viewStateShareKey=<key>&compareRunsMode=CHART`` applies it: charts in the
order of ``compareRunCharts``, then any metric the view does not name (MLflow appends those), all
runs shown (``runsHiddenMode: SHOW_ALL``; the default hides all but the first 10). The view also
appears in the page's "Views" menu under :data:`VIEW_NAME`.

Each spec with a goal also gets a view of its own (:func:`goal_view_key`): that spec's runs only, the
goal's metric charted first, and the runs table showing the goal metric and the ``idmctl decide``
verdict, interval and P(goal) as columns. The trainer writes it when it creates the chain's run,
``idmctl decide`` when it tags the runs it decided.

MLflow 3.17 chooses an experiment's page by the browser's workflow switch (local storage
``mlflow.workflowType``, ``genai`` until someone flips it: the GenAI overview), not by the experiment's
``mlflow.experimentKind`` tag (read from the bundle: the experiment-kind hook returns the workflow
type whenever the workflow switch is enabled, and it always is); the ``workflowType`` URL parameter
overrides it for the page opened. Every link idmctl prints carries :data:`WORKFLOW_QUERY`.

No mlflow import here: this module only builds the tag; callers write it with their client.
"""

from __future__ import annotations

import base64
import json
import re
import time
import zlib
from urllib.parse import quote

from ground.tracking import TAG_EXPERIMENT, decision_tag

VIEW_KEY = "idmctl-eef-first"
VIEW_NAME = "EEF mm first (idmctl)"
TAG_PREFIX = "mlflow.sharedViewState."
TAG_KEY = TAG_PREFIX + VIEW_KEY
SECTION = "idmctl-model-metrics"
SYSTEM_SECTION = "idmctl-system-metrics"
RUNS_PER_CHART = 500
"""Runs drawn in each chart (MLflow's default is 10)."""
_EEF = re.compile(r"^(sim_)?eef_mm_(\d+)ep$")
WORKFLOW_QUERY = "workflowType=machine_learning"
"""Opens MLflow's model-training pages (Runs, Models; no GenAI overview) whatever the browser last chose."""
GOAL_VIEW_PREFIX = "idmctl-goal-"
DECISION_COLUMNS = ("verdict", "interval_mm", "p_goal")
"""The ``idmctl.decision.*`` tags a goal view shows as runs-table columns."""
DEFAULT_COLUMNS = ("attributes.`Source`", "attributes.`Models`", "attributes.`Dataset`")
"""MLflow 3.17's default runs-table columns (its UI state's ``selectedColumns``)."""


def chart_order(keys: list[str], first: tuple[str, ...] | list[str] = ()) -> list[str]:
    """``first`` (a goal's metric) in its order, then offline EEF mm by episodes, then simulator EEF mm
    by episodes, then the rest A→Z."""
    def rank(key: str) -> tuple[int, int, str]:
        match = _EEF.match(key)
        if match:
            return (2 if match.group(1) else 1, int(match.group(2)), key)
        return (3, 0, key)

    leading = list(dict.fromkeys(first))
    return leading + sorted(set(keys) - set(leading), key=rank)


def _chart(index: int, key: str) -> dict:
    """One line chart, shaped like the configs MLflow 3.17 generates for a metric."""
    return {"uuid": f"idmctl-chart-{index:03d}", "type": "LINE", "runsCountToCompare": RUNS_PER_CHART,
            "metricSectionId": SECTION, "deleted": False, "isGenerated": True, "displayName": key,
            "metricKey": key, "lineSmoothness": 0, "xAxisScaleType": "linear", "scaleType": "linear", "range": {},
            "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [],
            "ignoreOutliers": False, "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True}


def view_state(keys: list[str], first: tuple[str, ...] | list[str] = ()) -> dict:
    """The UI state of the view: one chart per metric in :func:`chart_order`, every run shown."""
    return {
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": [_chart(i, key) for i, key in enumerate(chart_order(keys, first))],
        "compareRunSections": [
            {"uuid": SECTION, "name": "Model metrics", "display": True, "isReordered": True, "deleted": False,
             "isGenerated": True},
            {"uuid": SYSTEM_SECTION, "name": "System metrics", "display": True, "isReordered": False,
             "deleted": False, "isGenerated": True},
        ],
        "isAccordionReordered": False,
        "hideEmptyCharts": True,
    }


def tag_value(keys: list[str], created_ms: int | None = None) -> str:
    return _envelope(VIEW_NAME, view_state(keys), created_ms)


def _envelope(name: str, state: dict, created_ms: int | None) -> str:
    now = int(time.time() * 1000)
    packed = "deflate;" + base64.b64encode(zlib.compress(json.dumps(state, separators=(",", ":")).encode())).decode()
    return json.dumps({"name": name, "createdAt": created_ms or now, "updatedAt": now, "state": packed})


def _read_view(value: str | None) -> tuple[str, dict] | None:
    """(name, UI state) of a stored view; None when there is none or it cannot be read."""
    if not value:
        return None
    try:
        envelope = json.loads(value)
        state = envelope["state"]
        if state.startswith("deflate;"):
            state = zlib.decompress(base64.b64decode(state[len("deflate;"):])).decode()
        return str(envelope["name"]), json.loads(state)
    except (ValueError, KeyError, TypeError, AttributeError, zlib.error):
        return None


def charted_keys(value: str | None) -> list[str]:
    """The metric keys a stored view charts, in order ([] when there is none or it cannot be read)."""
    return _read_keys(value) or []


def _read_keys(value: str | None) -> list[str] | None:
    view = _read_view(value)
    if view is None:
        return None
    try:
        return [chart["metricKey"] for chart in view[1]["compareRunCharts"] if chart.get("metricKey")]
    except (KeyError, TypeError, AttributeError):
        return None


def created_ms(value: str | None) -> int | None:
    try:
        return int(json.loads(value or "")["createdAt"])
    except (ValueError, KeyError, TypeError):
        return None


def updated_tag(existing: str | None, keys: list[str]) -> str | None:
    """The tag value to write so that the view charts ``keys`` too, or None when it already does."""
    have = _read_keys(existing)
    wanted = chart_order([*(have or []), *keys])
    if have is not None and wanted == have:
        return None
    return tag_value(wanted, created_ms(existing))


def runs_chart_url(base_url: str, experiment_id: str, view_key: str = VIEW_KEY) -> str:
    """The experiment's runs chart view, model training, through one of idmctl's views (default: EEF mm
    charts first, every run drawn). The runs tab itself: the experiment's root page would redirect to
    it without the view."""
    return (f"{base_url.rstrip('/')}/#/experiments/{quote(str(experiment_id))}/runs"
            f"?{WORKFLOW_QUERY}&viewStateShareKey={quote(view_key)}&compareRunsMode=CHART")


def run_page_url(base_url: str, experiment_id: str, run_id: str) -> str:
    """One run's page (its tags, the decision's among them) in the model-training view."""
    return (f"{base_url.rstrip('/')}/#/experiments/{quote(str(experiment_id))}/runs/{quote(run_id)}"
            f"?{WORKFLOW_QUERY}")


def goal_view_key(experiment: str) -> str:
    """``idmctl-goal-latent_c_n4``: the key of a spec's goal view (characters MLflow's tag keys allow)."""
    return GOAL_VIEW_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "-", experiment)


def goal_view_state(experiment: str, goal_metric: str, keys: list[str]) -> dict:
    """The spec's runs only, its goal metric charted first, the goal metric and the decision as columns."""
    state = view_state(keys, first=[goal_metric])
    quoted = experiment.replace("'", "\\'")
    state["searchFilter"] = f"tags.`{TAG_EXPERIMENT}` = '{quoted}'"
    state["selectedColumns"] = [*DEFAULT_COLUMNS, f"metrics.`{goal_metric}`",
                                *(f"tags.`{decision_tag(field)}`" for field in DECISION_COLUMNS)]
    return state


def goal_view_name(experiment: str, goal: str) -> str:
    return f"{experiment}: goal {goal} first (idmctl)"


def updated_goal_tag(existing: str | None, experiment: str, goal: str, goal_metric: str,
                     keys: list[str]) -> str | None:
    """The goal view's tag value charting ``keys`` too (and the goal's metric first), or None when the
    stored view already is that (the goal text and metric included: an edited goal rewrites it)."""
    have = _read_keys(existing) or []
    rest = [key for key in have if key != goal_metric]
    name = goal_view_name(experiment, goal)
    state = goal_view_state(experiment, goal_metric, [*rest, *keys])
    if _read_view(existing) == (name, state):
        return None
    return _envelope(name, state, created_ms(existing))


def ensure_goal_view(client: object, experiment_id: str, experiment: str, goal: str, goal_metric: str,
                     metric_keys: list[str]) -> str:
    """Write (or bring up to date) the goal view of spec ``experiment``; returns its key.

    ``goal`` is the goal as the spec states it (``eef_mm_24ep <= 125 under …``), ``goal_metric`` its
    metric; ``client`` an ``mlflow.tracking.MlflowClient``."""
    key = goal_view_key(experiment)
    tags = dict(client.get_experiment(experiment_id).tags)  # type: ignore[attr-defined]
    value = updated_goal_tag(tags.get(TAG_PREFIX + key), experiment, goal, goal_metric, metric_keys)
    if value is not None:
        client.set_experiment_tag(experiment_id, TAG_PREFIX + key, value)  # type: ignore[attr-defined]
    return key


def goal_views(experiment_tags: dict[str, str]) -> list[tuple[str, str]]:
    """(view key, view name) of every goal view stored on the experiment, by key."""
    found = []
    for tag, value in sorted(experiment_tags.items()):
        if tag.startswith(TAG_PREFIX + GOAL_VIEW_PREFIX):
            view = _read_view(value)
            if view is not None:
                found.append((tag[len(TAG_PREFIX):], view[0]))
    return found


def ensure_experiment(client: object, artifact_location: str, metric_keys: list[str]) -> str:
    """The ``idmctl`` experiment's id, created when missing, marked as model training, with the view up to date.

    ``client`` is an ``mlflow.tracking.MlflowClient``. The experiment kind tag makes MLflow 3 open the
    runs table rather than its GenAI overview; it is set only when absent (a user's own choice stays).
    """
    from ground.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, MLFLOW_EXPERIMENT

    experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)  # type: ignore[attr-defined]
    if experiment is None:
        try:
            client.create_experiment(MLFLOW_EXPERIMENT, artifact_location=artifact_location,  # type: ignore[attr-defined]
                                     tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:  # another process created it between our get and create
            pass
        experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)  # type: ignore[attr-defined]
        if experiment is None:
            raise RuntimeError(f"MLflow experiment {MLFLOW_EXPERIMENT!r} could not be created")
    tags = dict(experiment.tags)
    if EXPERIMENT_KIND_TAG not in tags:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)  # type: ignore[attr-defined]
    value = updated_tag(tags.get(TAG_KEY), metric_keys)
    if value is not None:
        client.set_experiment_tag(experiment.experiment_id, TAG_KEY, value)  # type: ignore[attr-defined]
    return str(experiment.experiment_id)

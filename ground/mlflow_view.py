"""The MLflow UI view idmctl keeps on its experiment: the runs **chart** view with the EEF mm charts first.

MLflow 3.17's UI stores named views as experiment tags ``mlflow.sharedViewState.<key>``: a JSON
envelope ``{name, createdAt, updatedAt, state}`` whose ``state`` is the page's UI state, plain
JSON or ``deflate;`` + base64 of the zlib-deflated JSON (read from the UI bundle,
``mlflow/server/js/build``: the shared-view loader and the "Views" menu). Opening
``#/experiments/<id>/runs?viewStateShareKey=<key>&compareRunsMode=CHART`` applies it: charts in the
order of ``compareRunCharts``, then any metric the view does not name (MLflow appends those), all
runs shown (``runsHiddenMode: SHOW_ALL``; the default hides all but the first 10). The view also
appears in the page's "Views" menu under :data:`VIEW_NAME`.

No mlflow import here: this module only builds the tag; callers write it with their client.
"""

from __future__ import annotations

import base64
import json
import re
import time
import zlib
from urllib.parse import quote

VIEW_KEY = "idmctl-eef-first"
VIEW_NAME = "EEF mm first (idmctl)"
TAG_PREFIX = "mlflow.sharedViewState."
TAG_KEY = TAG_PREFIX + VIEW_KEY
SECTION = "idmctl-model-metrics"
SYSTEM_SECTION = "idmctl-system-metrics"
RUNS_PER_CHART = 500
"""Runs drawn in each chart (MLflow's default is 10)."""
_EEF = re.compile(r"^(sim_)?eef_mm_(\d+)ep$")


def chart_order(keys: list[str]) -> list[str]:
    """Offline EEF mm by episodes, then simulator EEF mm by episodes, then the rest A→Z."""
    def rank(key: str) -> tuple[int, int, str]:
        match = _EEF.match(key)
        if match:
            return (2 if match.group(1) else 1, int(match.group(2)), key)
        return (3, 0, key)

    return sorted(dict.fromkeys(keys), key=rank)


def _chart(index: int, key: str) -> dict:
    """One line chart, shaped like the configs MLflow 3.17 generates for a metric."""
    return {"uuid": f"idmctl-chart-{index:03d}", "type": "LINE", "runsCountToCompare": RUNS_PER_CHART,
            "metricSectionId": SECTION, "deleted": False, "isGenerated": True, "displayName": key,
            "metricKey": key, "lineSmoothness": 0, "xAxisScaleType": "linear", "scaleType": "linear", "range": {},
            "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [],
            "ignoreOutliers": False, "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True}


def view_state(keys: list[str]) -> dict:
    """The UI state of the view: one chart per metric in :func:`chart_order`, every run shown."""
    return {
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": [_chart(i, key) for i, key in enumerate(chart_order(keys))],
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
    now = int(time.time() * 1000)
    state = json.dumps(view_state(keys), separators=(",", ":"))
    packed = "deflate;" + base64.b64encode(zlib.compress(state.encode())).decode()
    return json.dumps({"name": VIEW_NAME, "createdAt": created_ms or now, "updatedAt": now, "state": packed})


def charted_keys(value: str | None) -> list[str]:
    """The metric keys a stored view charts, in order ([] when there is none or it cannot be read)."""
    return _read_keys(value) or []


def _read_keys(value: str | None) -> list[str] | None:
    if not value:
        return None
    try:
        envelope = json.loads(value)
        state = envelope["state"]
        if state.startswith("deflate;"):
            state = zlib.decompress(base64.b64decode(state[len("deflate;"):])).decode()
        return [chart["metricKey"] for chart in json.loads(state)["compareRunCharts"] if chart.get("metricKey")]
    except (ValueError, KeyError, TypeError, zlib.error):
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


def runs_chart_url(base_url: str, experiment_id: str) -> str:
    """The experiment's runs chart view through idmctl's view: EEF mm charts first, every run drawn."""
    return (f"{base_url.rstrip('/')}/#/experiments/{quote(str(experiment_id))}/runs"
            f"?viewStateShareKey={VIEW_KEY}&compareRunsMode=CHART")


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

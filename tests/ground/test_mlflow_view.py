"""idmctl's MLflow experiment opens on the runs view (experiment kind), and its saved view charts the
EEF mm metrics first; ``idmctl compare`` prints the link (the page itself: tests/idmctl/track/test_ui_browser.py)."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

from ground import mlflow_view, tracking


def _state(value: str) -> dict:
    envelope = json.loads(value)
    assert envelope["name"] == "EEF mm first (idmctl)"
    assert envelope["state"].startswith("deflate;")
    return json.loads(zlib.decompress(base64.b64decode(envelope["state"][len("deflate;"):])))


def test_eef_charts_come_first_offline_then_simulator_then_the_rest() -> None:
    keys = ["loss", "sim_eef_mm_4ep", "data_wait_frac", "eef_mm_24ep", "eef_mm_4ep", "lr", "sim_eef_mm_24ep"]
    assert mlflow_view.chart_order(keys) == ["eef_mm_4ep", "eef_mm_24ep", "sim_eef_mm_4ep", "sim_eef_mm_24ep",
                                             "data_wait_frac", "loss", "lr"]


def test_the_view_is_mlflows_saved_view_envelope_with_every_run_shown() -> None:
    value = mlflow_view.tag_value(["loss", "eef_mm_4ep"])
    state = _state(value)
    assert state["runsHiddenMode"] == "SHOW_ALL"
    charts = state["compareRunCharts"]
    assert [c["metricKey"] for c in charts] == ["eef_mm_4ep", "loss"]
    assert {c["type"] for c in charts} == {"LINE"} and {c["metricSectionId"] for c in charts} == {mlflow_view.SECTION}
    assert all(c["runsCountToCompare"] >= 100 for c in charts)
    assert [s["name"] for s in state["compareRunSections"]] == ["Model metrics", "System metrics"]
    assert mlflow_view.charted_keys(value) == ["eef_mm_4ep", "loss"]


def test_updating_keeps_what_the_view_charts_and_writes_only_on_change() -> None:
    first = mlflow_view.tag_value(["eef_mm_24ep"])
    assert mlflow_view.updated_tag(first, ["eef_mm_24ep"]) is None
    grown = mlflow_view.updated_tag(first, ["sim_eef_mm_4ep", "eef_mm_4ep"])
    assert grown is not None
    assert mlflow_view.charted_keys(grown) == ["eef_mm_4ep", "eef_mm_24ep", "sim_eef_mm_4ep"]
    assert json.loads(grown)["createdAt"] == json.loads(first)["createdAt"]
    assert mlflow_view.charted_keys("not json") == [] and mlflow_view.updated_tag("not json", []) is not None


def test_the_goal_metric_comes_first_whatever_it_is() -> None:
    keys = ["loss", "eef_mm_4ep", "sim_eef_mm_4ep", "data_wait_frac"]
    assert mlflow_view.chart_order(keys, ["sim_eef_mm_4ep"]) == ["sim_eef_mm_4ep", "eef_mm_4ep", "data_wait_frac", "loss"]
    assert mlflow_view.chart_order(["loss"], ["eef_mm_24ep"]) == ["eef_mm_24ep", "loss"]  # charted before it is logged


def test_a_goal_view_shows_the_specs_runs_goal_first_with_the_decision_columns() -> None:
    value = mlflow_view.updated_goal_tag(None, "latent_c_n4", "eef_mm_24ep <= 125 under mg30_heldout_24",
                                         "eef_mm_24ep", ["eef_mm_5ep", "loss"])
    envelope = json.loads(value)
    assert envelope["name"] == "latent_c_n4: goal eef_mm_24ep <= 125 under mg30_heldout_24 first (idmctl)"
    state = json.loads(zlib.decompress(base64.b64decode(envelope["state"][len("deflate;"):])))
    assert [c["metricKey"] for c in state["compareRunCharts"]] == ["eef_mm_24ep", "eef_mm_5ep", "loss"]
    assert state["searchFilter"] == "tags.`idmctl.experiment` = 'latent_c_n4'"
    assert state["selectedColumns"][-4:] == ["metrics.`eef_mm_24ep`", "tags.`idmctl.decision.verdict`",
                                             "tags.`idmctl.decision.interval_mm`", "tags.`idmctl.decision.p_goal`"]
    same = mlflow_view.updated_goal_tag(value, "latent_c_n4", "eef_mm_24ep <= 125 under mg30_heldout_24",
                                        "eef_mm_24ep", ["loss"])
    assert same is None  # nothing new: no write
    edited = mlflow_view.updated_goal_tag(value, "latent_c_n4", "eef_mm_5ep <= 120", "eef_mm_5ep", [])
    assert mlflow_view.charted_keys(edited) == ["eef_mm_5ep", "eef_mm_24ep", "loss"]  # an edited goal: its metric first
    assert json.loads(edited)["createdAt"] == envelope["createdAt"]
    assert mlflow_view.goal_views({mlflow_view.TAG_PREFIX + mlflow_view.goal_view_key("latent_c_n4"): edited,
                                   mlflow_view.TAG_KEY: mlflow_view.tag_value([])}) == [
        ("idmctl-goal-latent_c_n4", "latent_c_n4: goal eef_mm_5ep <= 120 first (idmctl)")]


def test_links_open_the_model_training_view() -> None:
    assert mlflow_view.runs_chart_url("http://h:5000", "3", mlflow_view.goal_view_key("q n")) == (
        "http://h:5000/#/experiments/3/runs?workflowType=machine_learning&viewStateShareKey=idmctl-goal-q-n"
        "&compareRunsMode=CHART")
    assert mlflow_view.run_page_url("http://h:5000/", "3", "abc") == (
        "http://h:5000/#/experiments/3/runs/abc?workflowType=machine_learning")


def test_runs_chart_url_opens_the_chart_mode_through_the_view() -> None:
    assert mlflow_view.runs_chart_url("http://127.0.0.1:5000/", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=idmctl-eef-first&compareRunsMode=CHART")


def test_ensure_experiment_creates_marks_and_repairs_an_old_experiment(idmctl_home: Path) -> None:
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    idmctl_home.mkdir(parents=True)
    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    artifacts = (idmctl_home / "mlartifacts").as_uri()
    experiment_id = mlflow_view.ensure_experiment(client, artifacts, ["eef_mm_4ep"])
    tags = client.get_experiment(experiment_id).tags
    assert tags[tracking.EXPERIMENT_KIND_TAG] == tracking.EXPERIMENT_KIND
    assert mlflow_view.charted_keys(tags[mlflow_view.TAG_KEY]) == ["eef_mm_4ep"]

    # An experiment made before idmctl marked it (or a user's own kind, which stays).
    client.delete_experiment_tag(experiment_id, tracking.EXPERIMENT_KIND_TAG)
    client.delete_experiment_tag(experiment_id, mlflow_view.TAG_KEY)
    assert mlflow_view.ensure_experiment(client, artifacts, ["sim_eef_mm_4ep"]) == experiment_id
    tags = client.get_experiment(experiment_id).tags
    assert tags[tracking.EXPERIMENT_KIND_TAG] == tracking.EXPERIMENT_KIND
    assert mlflow_view.charted_keys(tags[mlflow_view.TAG_KEY]) == ["sim_eef_mm_4ep"]
    client.set_experiment_tag(experiment_id, tracking.EXPERIMENT_KIND_TAG, "genai_development")
    mlflow_view.ensure_experiment(client, artifacts, [])
    assert client.get_experiment(experiment_id).tags[tracking.EXPERIMENT_KIND_TAG] == "genai_development"


def test_compare_prints_the_runs_chart_link_and_the_view_charts_the_runs_metrics(cli, idmctl_home: Path) -> None:
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    idmctl_home.mkdir(parents=True)
    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    experiment_id = client.create_experiment(tracking.MLFLOW_EXPERIMENT)  # the old way: no kind, no view
    run = client.create_run(experiment_id, run_name="quickstart#1", tags={tracking.TAG_EXPERIMENT: "quickstart"})
    client.log_metric(run.info.run_id, "eef_mm_4ep", 40.0, step=200)
    client.log_metric(run.info.run_id, "sim_eef_mm_4ep", 80.0, step=200)
    client.set_terminated(run.info.run_id)
    result = cli("compare", "quickstart", "--metric", "sim_eef_mm_4ep", "--ui-url", "http://127.0.0.1:5001")
    assert result.exit_code == 0, result.output
    assert (f"MLflow runs, EEF mm charts first (idmctl ui): http://127.0.0.1:5001/#/experiments/{experiment_id}/runs"
            "?workflowType=machine_learning&viewStateShareKey=idmctl-eef-first&compareRunsMode=CHART") in result.output
    tags = client.get_experiment(experiment_id).tags
    assert tags[tracking.EXPERIMENT_KIND_TAG] == tracking.EXPERIMENT_KIND
    assert mlflow_view.charted_keys(tags[mlflow_view.TAG_KEY]) == ["eef_mm_4ep", "sim_eef_mm_4ep"]

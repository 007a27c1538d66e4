"""``idmctl compare`` over card A's baselines and runs logged to a real MLflow SQLite store.

The runs are logged with the MLflow client exactly as the trainer does (ground.tracking's names,
params = the flattened resolved spec); one store is shared by the module because creating an
MLflow database costs ~1.3 s of migrations.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ground import tracking
from idmctl.track.compare import compare_url, run_url, summarize
from ground.tracking import flatten
from ground.spec import load_spec
from ground.contract import ENV_EXPERIMENTS, ENV_HOME

REPO = Path(__file__).resolve().parents[3]

CARD_ROWS = [
    "| Pixel v2_8gpu | 60K, B=1024 | 134.8 | — | MG-30 baseline | — | — |",
    "| Latent-A v1 (L27 sliced) | 60K, B=1024 | 131.8 | 114.2 | — | — | — |",
    "| Latent-A v3 (3-layer concat) | 60K | — | 110.9 | throughput −26% | — | — |",
    "| Latent-A multistream | 55K (preempted) | — | 104.99 | current best | — | — |",
]


def _log_run(client, experiment_id: str, experiment: str, chain: int, *, status: str,
             curves: dict[str, list[tuple[int, float]]], tags: dict[str, str] | None = None,
             spec_changes: dict[str, object] | None = None) -> str:
    from mlflow.entities import Metric, Param, RunTag

    resolved = load_spec(experiment)
    params = {**flatten(resolved.canonical), **(spec_changes or {})}
    all_tags = {tracking.TAG_EXPERIMENT: experiment, tracking.TAG_SPEC_HASH: resolved.hash,
                tracking.TAG_CODE_VERSION: "test", tracking.TAG_CHAIN: str(chain),
                tracking.TAG_ROUTING_N: str(resolved.spec.data.routing_n), tracking.TAG_QOS: resolved.spec.resources.qos,
                **(tags or {})}
    run = client.create_run(experiment_id, run_name=tracking.run_name(experiment, chain))
    run_id = run.info.run_id
    metrics = [Metric(key, value, 1_700_000_000_000 + step, step) for key, points in curves.items() for step, value in points]
    client.log_batch(run_id, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()],
                     tags=[RunTag(k, v) for k, v in all_tags.items()])
    if status != "RUNNING":
        client.set_terminated(run_id, status=status)
    return run_id


# The protocols the trainer tags its metrics with (ground.protocols): the runs' own offline evaluation,
# never card A's MG-30 evaluations, so their numbers get columns of their own.
OFFLINE_24 = "offline:PnP/valid:24ep"
LIFT_4 = "offline:Lift/valid:4ep"


def _table_rows(output: str) -> list[list[str]]:
    """Cells of each row of a rich table (header row first)."""
    return [[cell.strip() for cell in line.replace("┃", "│").strip("│").split("│")]
            for line in output.splitlines() if line.startswith(("│", "┃"))]


def _loss(last_step: int, every: int) -> list[tuple[int, float]]:
    return [(step, 2.0 / (1 + step / 1000)) for step in range(0, last_step + 1, every)]


# The runs' goals come from their specs: the card's experiments are copied as shipped, and a tiny
# spec of our own stands in for quickstart so edits to the shipped quickstart cannot move verdicts.
TINY_SPEC = """
description: tiny routed DiT for compare tests
data: {episodes: /nonexistent/demos.hdf5, cache_root: /nonexistent/cache, cache_format: safetensors,
       cached_layers: [0, 1, 2, 3], frames: 8, token_grid: [4, 4], channels: 32, dtype: float32,
       selected_layer_indices: [0, 2], frame_window: 2, action_horizon: 8, action_dim: 7}
model: {depth: 2, hidden_dim: 32, num_heads: 2, kv_dim: 32}
loader: {batch_size: 4}
train: {steps: 200, lr: 3.0e-3, effective_batch: 8, checkpoint_every: 50}
resources: {qos: core-own, time_limit: "0:30:00"}
eval: {metric: eef_mm_4ep, episodes: [4]}
goal: eef_mm_4ep <= 60
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Five runs: finished PASS, in progress, preempted, and two quickstarts with different routing."""
    root = tmp_path_factory.mktemp("mlflow_store")
    specs = root / "experiments"
    specs.mkdir()
    for name in ("base_latent_c", "latent_c_n4", "latent_c_n4_d12", "latent_c_n4_d4", "latent_c_n6_d12", "baselines"):
        shutil.copy(REPO / "experiments" / f"{name}.yaml", specs)
    (specs / "quickstart.yaml").write_text(TINY_SPEC)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV_EXPERIMENTS, str(specs))  # _log_run resolves the specs
        experiment_id, ids = _log_runs(root)
    return {"uri": f"sqlite:///{root / 'mlflow.sqlite'}", "ids": ids, "experiment_id": experiment_id, "specs": specs}


def _log_runs(root: Path) -> tuple[str, dict[str, str]]:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root / 'mlflow.sqlite'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(tracking.MLFLOW_EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    ids = {
        "n4": _log_run(client, experiment_id, "latent_c_n4", 1, status="FINISHED", curves={
            "loss": _loss(60000, 5000),
            "eef_mm_5ep": [(20000, 128.0), (40000, 126.4), (60000, 126.4)],
            "eef_mm_24ep": [(20000, 130.0), (40000, 118.5), (60000, 121.25)]},
            tags={tracking.protocol_tag("eef_mm_5ep"): "offline:PnP/valid:5ep",
                  tracking.protocol_tag("eef_mm_24ep"): OFFLINE_24}),
        "d12": _log_run(client, experiment_id, "latent_c_n4_d12", 2, status="RUNNING", curves={
            "loss": _loss(30000, 5000), "eef_mm_24ep": [(20000, 127.5)]},
            tags={tracking.protocol_tag("eef_mm_24ep"): OFFLINE_24}),
        "n6": _log_run(client, experiment_id, "latent_c_n6_d12", 3, status="FAILED", curves={
            "loss": _loss(10000, 5000), "eef_mm_24ep": [(10000, 140.0)]},
            tags={tracking.TAG_SLURM_STATE: "PREEMPTED", tracking.TAG_FAILURE_CAUSE: "preemption",
                  tracking.protocol_tag("eef_mm_24ep"): OFFLINE_24}),
        "qs_n2": _log_run(client, experiment_id, "quickstart", 4, status="FINISHED", curves={
            "loss": _loss(200, 10), "eef_mm_4ep": [(100, 52.0), (200, 41.5)]},
            tags={tracking.protocol_tag("eef_mm_4ep"): LIFT_4}),
        "qs_n4": _log_run(client, experiment_id, "quickstart", 5, status="FINISHED", curves={
            "loss": _loss(200, 10), "eef_mm_4ep": [(100, 70.0), (200, 72.0)]},
            tags={tracking.TAG_ROUTING_N: "4", tracking.protocol_tag("eef_mm_4ep"): LIFT_4},
            spec_changes={"data.selected_layer_indices": [0, 1, 2, 3]}),
    }
    return experiment_id, ids


@pytest.fixture
def tracked(store: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(store["uri"]))
    monkeypatch.setenv(ENV_EXPERIMENTS, str(store["specs"]))
    return store


def test_baselines_alone_print_the_card_numbers(cli, idmctl_home: Path):
    result = cli("compare", "--markdown")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "| experiment | training | EEF mm (5 ep) | EEF mm (24 ep) | note | goal | verdict |"
    assert lines[2:] == CARD_ROWS
    # Without runs no MLflow database is created (and mlflow's 1.3 s import is skipped).
    assert not (idmctl_home / "mlflow.sqlite").exists()


def test_terminal_table_has_the_card_rows(cli):
    result = cli("compare")
    assert result.exit_code == 0, result.output
    rows = _table_rows(result.output)
    assert rows[0] == ["experiment", "training", "EEF mm (5 ep)", "EEF mm (24 ep)", "note", "goal", "verdict"]
    assert rows[1:] == [[c.strip() for c in row.strip("|").split("|")] for row in CARD_ROWS]


def test_runs_show_best_and_last_with_goal_verdicts(cli, tracked):
    """The runs' own offline numbers get columns of their own beside card A's MG-30 ones (never one column)."""
    result = cli("compare", "latent_c_n4", "latent_c_n4_d12", "latent_c_n6_d12", "latent_c_n4_d4", "--markdown")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("| experiment | training | EEF mm (5 ep) under card-A/MG-30-sim:5ep | EEF mm (5 ep) under "
                        "offline:PnP/valid:5ep | EEF mm (24 ep) under card-A/MG-30-held-out:24ep | EEF mm (24 ep) under "
                        f"{OFFLINE_24} | note | goal | verdict |")
    assert lines[2:] == [
        "| Pixel v2_8gpu | 60K, B=1024 | 134.8 | — | — | — | MG-30 baseline | — | — |",
        "| Latent-A v1 (L27 sliced) | 60K, B=1024 | 131.8 | — | 114.2 | — | — | — | — |",
        "| Latent-A v3 (3-layer concat) | 60K | — | — | 110.9 | — | throughput −26% | — | — |",
        "| Latent-A multistream | 55K (preempted) | — | — | 104.99 | — | current best | — | — |",
        "| latent_c_n4#1 | 60K, B=1024 | — | 126.4 | — | 118.5 (last 121.25) | N=4 blocks 5/14/23/32, spec "
        f"{load_spec('latent_c_n4').hash[:12]} | eef_mm_24ep <= 125 | PASS |",
        "| latent_c_n4_d12#2 | 30K of 60K, B=1024 (running) | — | — | — | 127.5 | N=4 blocks 5/14/23/32, spec "
        f"{load_spec('latent_c_n4_d12').hash[:12]} | eef_mm_24ep <= 125 | FAIL (so far) |",
        "| latent_c_n6_d12#3 | 10K of 60K, B=1024 (preempted) | — | — | — | 140 | N=6 blocks 5/11/17/23/29/35, spec "
        f"{load_spec('latent_c_n6_d12').hash[:12]}, cause: preemption | eef_mm_24ep <= 125 | FAIL |",
        "| latent_c_n4_d4 | 60K, B=1024 (not started) | — | — | — | — | Latent-C Phase 2 — N=4, depth 4 (1:1 sparse) "
        "| eef_mm_24ep <= 125 | pending |",
    ]


def test_a_goal_under_another_protocol_gets_no_verdict():
    from idmctl.track.compare import CompareRow, MetricSummary, verdict

    row = CompareRow(kind="run", name="latent_c_n4", label="latent_c_n4#1", status="finished",
                     metrics={"eef_mm_24ep": MetricSummary(best=118.5, last=121.25)},
                     protocols={"eef_mm_24ep": OFFLINE_24})
    assert verdict(row, "eef_mm_24ep <= 125") == "PASS"
    assert verdict(row, "eef_mm_24ep <= 125 under card-A/MG-30-held-out:24ep") == (
        "no result under card-A/MG-30-held-out:24ep")
    assert verdict(row, f"eef_mm_24ep <= 120 under {OFFLINE_24}") == "FAIL"


def test_two_quickstart_routings_are_listed_with_verdicts(cli, tracked):
    result = cli("compare", "quickstart")
    assert result.exit_code == 0, result.output
    rows = {cells[0]: cells for cells in _table_rows(result.output)}
    header = rows["experiment"]
    eef4 = header.index("EEF mm (4 ep)")
    assert rows["quickstart#4"][eef4] == "41.5"
    assert rows["quickstart#5"][eef4] == "70 (last 72)"
    assert rows["quickstart#4"][-1] == "PASS" and rows["quickstart#5"][-1] == "FAIL"
    assert rows["quickstart#4"][header.index("note")].startswith("N=2 blocks 0/2, spec ")
    assert rows["quickstart#5"][header.index("note")].startswith("N=4 blocks 0/1/2/3, spec ")
    assert "goal quickstart: eef_mm_4ep <= 60 (verdict on the last eval)" in result.output
    ids = tracked["ids"]
    link = compare_url([ids["qs_n2"], ids["qs_n4"]], [tracked["experiment_id"]] * 2, "http://127.0.0.1:5000")
    assert f"MLflow compare page (idmctl ui): {link}" in result.output.splitlines()


def test_json_carries_best_last_steps_and_run_ids(cli, tracked):
    result = cli("compare", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    runs = {row["label"]: row for row in report["rows"] if row["kind"] == "run"}
    assert set(runs) == {"latent_c_n4#1", "latent_c_n4_d12#2", "latent_c_n6_d12#3", "quickstart#4", "quickstart#5"}
    eef = runs["latent_c_n4#1"]["metrics"]["eef_mm_24ep"]
    assert (eef["best"], eef["best_step"], eef["last"], eef["last_step"], eef["points"]) == (118.5, 40000, 121.25, 60000, 3)
    assert runs["latent_c_n4#1"]["run_id"] == tracked["ids"]["n4"]
    assert runs["latent_c_n4#1"]["url"] == f"http://127.0.0.1:5000/#/runs/{tracked['ids']['n4']}"
    assert runs["latent_c_n4_d12#2"]["status"] == "running"
    assert runs["latent_c_n6_d12#3"]["status"] == "preempted"
    # Ranked by the best eef_mm_24ep; runs without it go last.
    ranked = [row["label"] for row in report["rows"] if row["kind"] == "run"]
    assert ranked[:3] == ["latent_c_n4#1", "latent_c_n4_d12#2", "latent_c_n6_d12#3"]


def test_plot_writes_a_real_png(cli, tracked, tmp_path: Path):
    out = tmp_path / "plots" / "compare.png"
    result = cli("compare", "latent_c_n4", "latent_c_n4_d12", "quickstart", "--plot", str(out))
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1300, 500)
    assert 20_000 < len(data) < 2_000_000
    assert f"plot: {out} ({len(data):,} B)" in result.output
    assert not list(out.parent.glob(".*tmp*"))
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "compare_plot.png").write_bytes(data)


def test_plot_without_runs_is_bad_input(cli, tmp_path: Path):
    result = cli("compare", "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    assert result.output == ("error: --plot: no tracked runs to plot (train one first (idmctl quickstart) "
                             "or name experiments that have runs)\n")
    assert not (tmp_path / "x.png").exists()


def test_unknown_experiment_is_one_line(cli):
    result = cli("compare", "latnt_c_n4")
    assert result.exit_code == 2
    assert result.output == "error: latnt_c_n4: no experiment named 'latnt_c_n4' (did you mean 'latent_c_n4'?)\n"


def test_bad_baselines_entry_names_file_and_field(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "baselines.yaml").write_text("- name: a\n  eef_mm_24ep: 1.0\n- name: b\n  eef_mm_24: 3\n")
    monkeypatch.setenv(ENV_EXPERIMENTS, str(tmp_path))
    result = cli("compare")
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {tmp_path / 'baselines.yaml'}:[1].eef_mm_24: unknown key (allowed: ")


def test_summarize_uses_steps_not_logging_order():
    summary = summarize([(300, 9.0), (100, 5.0), (200, 7.0)], "eef_mm_24ep")
    assert summary is not None
    assert (summary.best, summary.best_step, summary.last, summary.last_step) == (5.0, 100, 9.0, 300)
    assert summarize([], "loss") is None


def test_links_to_mlflow_pages():
    assert run_url("abc123", "http://127.0.0.1:5000/") == "http://127.0.0.1:5000/#/runs/abc123"
    assert compare_url(["r1", "r2"], ["7", "7"], "http://h:1") == (
        "http://h:1/#/compare-runs?runs=%5B%22r1%22%2C%22r2%22%5D&experiments=%5B%227%22%5D")


def test_compare_without_runs_imports_no_heavy_module(tmp_path: Path):
    probe = ("import sys, json\nfrom typer.testing import CliRunner\nfrom idmctl.cli.app import app\n"
             "result = CliRunner().invoke(app, ['compare', 'latent_c_n4'])\n"
             "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'mlflow', 'matplotlib', 'pandas'})\n"
             "print(json.dumps([result.exit_code, heavy]))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={ENV_HOME: str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [0, []]

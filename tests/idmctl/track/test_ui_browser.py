"""End to end: ``idmctl ui`` serves the store, two runs appear on MLflow's compare page in headless
Chromium (Debian's package), the runs chart link ``idmctl ui`` prints lands on the runs view with an
EEF mm chart first drawing every run, and Ctrl-C leaves no mlflow process behind.

One run is logged before the server starts, into an experiment made the old way (no experiment kind,
no view: ``idmctl ui`` adds both), and one while it runs: trainers write to the SQLite store
directly, whether or not the UI is up.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ground import tracking
from idmctl.track.compare import compare_url
from ground.paths import mlflow_artifacts_dir, mlflow_tracking_uri
from ground.contract import ENV_HOME
from net_support import free_port

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = "/usr/bin/chromium"

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian chromium (scripts/system_deps.sh)")]


def _log_run(experiment: str, chain: int, eef_mm: list[tuple[int, float]]) -> tuple[str, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    existing = client.get_experiment_by_name(tracking.MLFLOW_EXPERIMENT)
    experiment_id = existing.experiment_id if existing else client.create_experiment(
        tracking.MLFLOW_EXPERIMENT, artifact_location=mlflow_artifacts_dir().as_uri())
    run = client.create_run(experiment_id, run_name=tracking.run_name(experiment, chain),
                            tags={tracking.TAG_EXPERIMENT: experiment})
    client.log_param(run.info.run_id, "data.selected_layer_indices", f"routing of {experiment}")
    for step, value in eef_mm:
        client.log_metric(run.info.run_id, tracking.eef_metric(24), value, step=step)
        # Sorts before eef_mm_24ep: MLflow's own chart order would put it first.
        client.log_metric(run.info.run_id, tracking.M_DATA_WAIT, 0.1, step=step)
    client.set_terminated(run.info.run_id)
    return experiment_id, run.info.run_id


def _session_members(session_id: int) -> list[int]:
    """Processes whose session is ``session_id`` (the server runs in a session of its own)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session_id and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _read_until(process: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    assert process.stdout is not None
    seen = ""
    deadline = time.monotonic() + timeout_s
    while marker not in seen and time.monotonic() < deadline and process.poll() is None:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            seen += process.stdout.readline()
    return seen


def _chromium(url: str, screenshot: Path, profile: Path, budget_ms: int) -> str:
    """The page's DOM after ``budget_ms`` of virtual time, and a screenshot."""
    browser = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--window-size=1400,900",
         f"--virtual-time-budget={budget_ms}", f"--screenshot={screenshot}", "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return browser.stdout


def _chart_cards(dom: str) -> list[tuple[str, str]]:
    """(title, the card's DOM) of each chart card on the runs chart view, in page order."""
    marker = 'data-testid="experiment-view-compare-runs-card"'
    pieces = dom.split(marker)[1:]
    cards = []
    for piece in pieces:
        title = re.search(r'title="([^"]+)"', piece)
        if title:
            cards.append((title.group(1), piece))
    return cards


def test_compare_page_shows_both_runs(idmctl_home: Path, tmp_path: Path):
    idmctl_home.mkdir(parents=True, exist_ok=True)
    experiment_id, first = _log_run("latent_c_n4", 1, [(20000, 130.0), (60000, 121.25)])
    port = free_port()
    env = {**os.environ, ENV_HOME: str(idmctl_home), "PYTHONUNBUFFERED": "1"}
    # Ctrl-C is what a user stops `idmctl ui` with. A suite started in the background (scripts/cpu_hog.sh
    # runs its command with `&`) inherits SIGINT ignored, and Python then keeps ignoring it: give the UI
    # the default disposition a terminal would.
    ui = subprocess.Popen([sys.executable, "-m", "idmctl", "ui", "--port", str(port)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        banner = _read_until(ui, "EEF mm charts first:", timeout_s=120)
        assert f"MLflow UI: http://127.0.0.1:{port}" in banner, banner
        chart_link = re.search(r"runs, EEF mm charts first: (\S+)", banner)
        assert chart_link, banner
        assert chart_link.group(1) == (f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs"
                                       "?workflowType=machine_learning&viewStateShareKey=idmctl-eef-first&compareRunsMode=CHART")
        server_pids = _children(ui.pid)
        assert len(server_pids) == 1 and _session_members(server_pids[0])
        _, second = _log_run("latent_c_n6_d12", 2, [(20000, 127.5)])

        url = compare_url([first, second], [experiment_id], f"http://127.0.0.1:{port}")
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        dom = _chromium(url, artifacts / "ui_compare_runs.png", tmp_path / "chromium-profile", 15000)
        assert "latent_c_n4#1" in dom and "latent_c_n6_d12#2" in dom, dom[-2000:]
        assert "eef_mm_24ep" in dom
        assert "Comparing 2 Runs" in dom

        # The runs chart view: the runs page in the model-training view (MLflow's GenAI side nav would
        # call it "Training runs" and list an Overview), idmctl's view applied, and the first chart an
        # EEF mm chart that draws every run of the experiment.
        dom = _chromium(chart_link.group(1), artifacts / "ui_runs_charts.png", tmp_path / "chromium-profile-2", 60000)
        assert "<title>Runs - " in dom and "Training runs" not in dom, dom[-2000:]
        assert f"#/experiments/{experiment_id}/overview" not in dom
        assert "EEF mm first (idmctl)" in dom
        cards = _chart_cards(dom)
        assert [title for title, _ in cards[:2]] == ["eef_mm_24ep", "data_wait_frac"], [t for t, _ in cards]
        first_card = cards[0][1]
        assert "latent_c_n4#1" in first_card and "latent_c_n6_d12#2" in first_card
        assert first_card.count('class="trace scatter') >= 2  # a drawn line per run
    finally:
        ui.send_signal(signal.SIGINT)  # Ctrl-C
        output, _ = ui.communicate(timeout=60)
    assert ui.returncode == 0, output
    assert "MLflow UI stopped" in output
    assert _session_members(server_pids[0]) == []
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)
    shutil.rmtree(tmp_path / "chromium-profile-2", ignore_errors=True)

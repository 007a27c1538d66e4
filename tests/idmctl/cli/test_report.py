"""``idmctl report``: card A written from the record.

The golden: card A's seven jobs as sync records them (``test_failures_cli.add_card_a_jobs``: the store
rows the replay on the local Slurm leaves, the same fixture ``ledger`` is tested on), the fixes the card
lists recorded with ``failures fix``, then ``report latent_c_n12_dense latent_c_n4 --markdown`` must give
card A's failure table — job, setting, cause, fix, caught now by — and the week's GPU-hours.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_failures_cli import add_card_a_jobs

CARD_A_FIXES = [
    (["5961"], "switch to own quota"),
    (["6054", "6108", "6158"], "own/extra quota (sub does not fit long-stage jobs)"),
    (["5845"], "--dataloader_num_workers 0 everywhere"),
    (["6262"], "persistent_workers=(num_workers > 0)"),
    (["6321"], "fix __init__ and __getitem__ of the right class; confirmed with Python introspection"),
]


def _card_a(cli) -> None:
    add_card_a_jobs()
    for jobs, note in CARD_A_FIXES:
        result = cli("failures", "fix", *jobs, "--note", note)
        assert result.exit_code == 0, result.output


def test_card_a_golden_failure_table_with_fixes(cli, store_backend) -> None:
    _card_a(cli)
    result = cli("report", "latent_c_n12_dense", "latent_c_n4", "--markdown")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "# Where latent_c_n12_dense, latent_c_n4 stands"
    start = lines.index("| job | experiment | setting | cause | evidence | fix | caught now by |")
    end = lines.index("", start)
    table = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines[start + 2:end]}
    # Card A's table: job → (setting, cause, fix, caught now by), the fix as recorded.
    expected = {
        "5961": ("8 GPU core-extra, N=12", "queue_cancelled", "switch to own quota"),
        "6054, 6108, 6158": ("4 GPU sub, N=12", "preempted ×3", "own/extra quota (sub does not fit long-stage jobs)"),
        "5845": ("4 GPU sub, N=12", "shm_enospc", "--dataloader_num_workers 0 everywhere"),
        "6262": ("8 GPU core-own, N=12", "loader_config", "persistent_workers=(num_workers > 0)"),
        "6321": ("8 GPU core-own, N=4", "python_exception",
                 "fix __init__ and __getitem__ of the right class; confirmed with Python introspection"),
    }
    assert set(table) == set(expected)
    for job, (setting, cause, fix) in expected.items():
        cells = table[job]
        assert (cells[2], cells[3]) == (setting, cause), cells
        assert cells[5].startswith(fix), cells
    caught = {job: cells[6].rstrip(" |") for job, cells in table.items()}
    assert caught == {"5961": "qos", "6054, 6108, 6158": "qos", "5845": "shm", "6262": "loader", "6321": "introspection"}
    assert "7 failed jobs, 7 with a recorded fix, 0 open." in lines
    # The week's GPU-hours, as the ledger counts them: 3 × 4 GPU × 59 min + 16 + 16 + 8 + 1 GPU-min.
    gpu = lines[lines.index("## GPU-hours") + 4]
    assert gpu == "| 51.82 | 0.02 | 51.80 | loader_config 16.00, python_exception 16.00, preempted 11.80, shm_enospc 8.00 | 3 | 3.93 |"
    assert "- GPU-hours: 51.82 charged, 0.02 useful, 51.80 lost" in lines
    # Card A's parameter table, counted on the model latent_c_n4 builds (meta device), the card's beside it.
    assert ("| latent_c_n4 | 83,963,904 | 20,975,616 | 138,563,968 | 243,503,488 | 84.2M / 20.5M / 138.0M / 242.6M "
            "(the card's, rounded) |") in lines
    # Every attempt, the completed one too; card A's baselines under their protocols, said to be point estimates.
    assert any(line.startswith("| 6400 | latent_c_n4 | — | core-own | 1 | COMPLETED |") for line in lines)
    assert ("| Latent-A multistream | eef_mm_24ep | 105 | card-A/MG-30-held-out:24ep | a mean only: a point estimate "
            "without a spread |") in lines
    assert lines[lines.index("## Still open") + 2] == "- latent_c_n12_dense: no tracked run evaluated yet"


def test_html_is_one_self_contained_file_with_its_plots(cli, tmp_path: Path) -> None:
    _card_a(cli)
    out = tmp_path / "card.html"
    result = cli("report", "latent_c_n12_dense", "latent_c_n4", "--html", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert result.output == f"report: {out} ({out.stat().st_size:,} B, 1 plots embedded)\n"
    assert text.count("src='data:image/png;base64,iVBORw0KGgo") == 1  # a real PNG, embedded
    assert "<td>6054, 6108, 6158</td>" in text and "http" not in text.replace("http-equiv", "")  # nothing fetched


def test_an_experiment_with_no_runs_says_what_there_is(cli) -> None:
    result = cli("report", "latent_c_n4_d12", "--json")
    assert result.exit_code == 0, result.output
    card = json.loads(result.output)
    sections = {s["heading"]: s["lines"] for s in card["sections"]}
    assert sections["TL;DR"][0] == "- status: nothing submitted yet for latent_c_n4_d12"
    assert sections["Every attempt"] == ["No job has been submitted yet."]
    assert sections["GPU-hours"] == ["No run has ended: nothing charged yet."]
    assert sections["The plan's arithmetic"] == ["latent_c_n4_d12: no preflight recorded (run `idmctl preflight latent_c_n4_d12`)."]
    # No history at all: the finish date is the range its stated assumptions give, and says so.
    finish = sections["Finish date (P10–P90)"]
    assert finish[0].startswith("### latent_c_n4_d12: ") and " steps to go on core-own × 8 GPU" in finish[0]
    assert finish[2].startswith("- finish P10 ") and finish[2].endswith(
        "(too little history (0 past jobs): the range its assumptions give)")


def test_bad_input_is_one_line(cli, tmp_path: Path) -> None:
    result = cli("report", "latent_c_n5")
    assert result.exit_code == 2 and result.output.startswith("error: ") and len(result.output.splitlines()) == 1
    result = cli("report", "latent_c_n4", "--html", str(tmp_path / "card.png"))
    assert (result.exit_code, result.output) == (2, "error: --html: card.png is not an .html file (e.g. --html card.html)\n")
    result = cli("report", "latent_c_n4#3")
    assert result.exit_code == 2 and "give the experiment, not the chain" in result.output


def test_a_pending_job_says_why_it_waits(cli) -> None:
    from datetime import datetime, timedelta, timezone

    from idmctl.record import session
    from idmctl.record.models import Job

    with session() as db:
        db.add(Job(scheduler_id="7001", experiment="latent_c_n4", state="PENDING", reason="QOSMaxGRESPerUser",
                   gpus=8, qos="core-own", submitted_at=datetime.now(timezone.utc) - timedelta(hours=3)))
    result = cli("report", "latent_c_n4", "--json")
    assert result.exit_code == 0, result.output
    [line] = [item for item in json.loads(result.output)["open"] if "7001" in item]
    assert line == ("- job 7001 (latent_c_n4) is pending for 3.0 h: qos limit — its QoS is at a limit: it waits for the "
                    "QoS's other jobs (often the team's own) to end (Slurm reason QOSMaxGRESPerUser)")


def test_a_decided_experiment_has_its_decision_in_the_tldr_and_its_plot_in_the_html(cli, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """Two runs logged by the trainer's own RunLogger (test_decide's helper) into a real MLflow store."""
    from ground.contract import ENV_EXPERIMENTS
    from test_decide import SPEC, _train_run

    specs = tmp_path / "experiments"
    specs.mkdir()
    (specs / "qcard.yaml").write_text(SPEC.format(lr="3.0e-3"))
    monkeypatch.setenv(ENV_EXPERIMENTS, str(specs))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _train_run(tmp_path, "qcard", 1, {200: [38.0, 44.5, 41.0, 35.5]})
    result = cli("report", "qcard", "--markdown")
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("- decision: ")]
    # 38.0, 44.5, 41.0, 35.5 mm → mean 39.75 mm, interval [34.0, 47.8] mm (test_decide's numbers).
    assert line.startswith("- decision: qcard#1: PASS for sim_eef_mm_4ep <= 60 — mean 39.75 mm, 95 % interval [33.98, 47.82] mm")
    out = tmp_path / "card.html"
    result = cli("report", "qcard", "--html", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text().count("src='data:image/png;base64,iVBORw0KGgo") == 1  # the decision's figure

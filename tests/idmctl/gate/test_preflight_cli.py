"""``idmctl preflight``: one row per check, --json, exit 1 on FAIL, exit 2 on bad input with nothing
recorded, and the queue-wait WARN from job history recorded in a real store."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlmodel import select

from idmctl.core.checks import CHECK_NAMES
from idmctl.record import session
from idmctl.record.models import Job, PreflightCheck, PreflightRun

REPO = Path(__file__).resolve().parents[3]
MISTAKES = REPO / "experiments" / "mistakes"
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)


def test_table_has_one_row_per_check_and_fail_exits_1(cli):
    result = cli("preflight", str(MISTAKES / "shm_overflow.yaml"), "--cluster", "card", "--no-smoke")
    assert result.exit_code == 1
    rows = [line for line in result.stdout.splitlines() if line.startswith("│ ") and "│" in line[2:]]
    names = [row.split("│")[1].strip() for row in rows if row.split("│")[1].strip()]
    assert names == list(CHECK_NAMES)
    assert "preflight failed: shm" in result.stderr
    assert "FAIL: shm" in result.stdout and "code " in result.stdout


def test_json_is_recorded_under_the_key(cli):
    result = cli("preflight", "latent_c_n4", "--cluster", "card", "--no-smoke", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [c["name"] for c in report["checks"]] == list(CHECK_NAMES)
    assert report["failed"] == [] and report["unlocks_submit"] is False and report["cluster"] == "card"
    with session() as db:
        run = db.exec(select(PreflightRun).where(PreflightRun.id == report["run_id"])).one()
        checks = db.exec(select(PreflightCheck).where(PreflightCheck.run_id == run.id)).all()
    assert (run.spec_hash, run.code_version, run.profile_name) == (report["spec_hash"], report["code_version"], "card")
    assert {c.name: c.status for c in checks} == {c["name"]: c["status"] for c in report["checks"]}


def test_bad_spec_is_one_line_exit_2_and_records_nothing(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "experiments" / "quickstart.yaml").read_text().replace("num_workers: 0", "num_worker: 0"))
    result = cli("preflight", str(bad), "--no-smoke")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {bad}:loader.num_worker: unknown key (did you mean 'num_workers'?)"]
    unknown = cli("preflight", "quickstart", "--cluster", "nowhere", "--no-smoke")
    assert unknown.exit_code == 2 and "no cluster profile named 'nowhere'" in unknown.stderr
    with session() as db:
        assert db.exec(select(PreflightRun)).all() == []


def test_long_queue_wait_in_recorded_history_warns(cli):
    with session() as db:
        db.add_all([
            # Card job 5961: 8 GPUs on core-extra, cancelled after 6 days pending.
            Job(experiment="latent_c_n12_dense", scheduler_id="5961", state="CANCELLED", qos="core-extra", gpus=8,
                submitted_at=T0, ended_at=T0 + timedelta(days=6)),
            Job(experiment="latent_c_n4", scheduler_id="6321", state="FAILED", qos="core-own", gpus=8,
                submitted_at=T0, started_at=T0 + timedelta(hours=3), ended_at=T0 + timedelta(hours=5)),
            # Same QoS, other GPU count: not evidence for an 8-GPU job.
            Job(experiment="x", scheduler_id="7000", state="COMPLETED", qos="core-extra", gpus=1,
                submitted_at=T0, started_at=T0 + timedelta(minutes=1)),
        ])
    result = cli("preflight", str(MISTAKES / "core_extra_queue.yaml"), "--cluster", "card", "--no-smoke", "--json")
    assert result.exit_code == 0, result.output
    qos = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "qos")
    assert qos["status"] == "WARN"
    assert ("expected queue wait 6.0 d = median of 1 recorded 8-GPU core-extra job(s): 5961 6.0 d "
            "(cancelled while pending)") in qos["summary"]
    assert qos["fix"] == ("consider core-own: median 3.0 h over 1 job(s); "
                          "what-ifs: resources.qos=core-own → expected queue wait 3.0 h")
    assert qos["numbers"]["expected_wait_s"] == 6 * 86400


def test_job_flags_a_sweep_or_what_if_would_drop_are_refused(cli):
    # A sweep's table and --what-if check the spec's own resources: --mem there used to change nothing, silently.
    sweep = cli("preflight", "latent_c_phase2", "--mem", "800GB", "--cluster", "card")
    assert sweep.exit_code == 2
    assert sweep.stderr.strip().splitlines() == [
        "error: --mem: --mem 800GB applies to one job's preflight, not to a sweep "
        "(pass it as --what-if resources.mem=VALUE)"]
    what_if = cli("preflight", "latent_c_n4", "--qos", "sub", "--what-if", "loader.repeats=2", "--cluster", "card")
    assert what_if.exit_code == 2
    assert what_if.stderr.strip().splitlines() == [
        "error: --qos: --qos sub applies to one job's preflight, not to --what-if "
        "(pass it as --what-if resources.qos=VALUE)"]
    with session() as db:
        assert db.exec(select(PreflightRun)).all() == []

"""Accounts, constraints, reservations and CPUs per rank, judged and run on the real local Slurm.

The local cluster (scripts/slurm/up.sh, ClusterName ``idmctl``) gives root an association with account
``root`` granting core-own, core-extra, share and sub; account ``team`` exists for other users only; no
node has a feature and no reservation exists. Nothing here changes the cluster: the checks read it
(``sacctmgr``, ``sbatch --test-only``) and one real job runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sqlmodel import select

from idmctl.gate.assoc import parse_assoc
from idmctl.record.db import session
from idmctl.record.models import Chain, Job
from slurm_support import text_so_far, wait_until

REPO = Path(__file__).resolve().parents[3]

# `sacctmgr -n -P show assoc format=cluster,account,user,partition,qos,defaultqos` on the local cluster
# (Slurm 22.05.8, Debian bookworm's slurmdbd; the project's own scripts/slurm/up.sh set it up), as recorded.
ASSOC_22_05 = """idmctl|root|||normal|
idmctl|root|root||core-extra,core-own,normal,share,sub|share
idmctl|team|||normal|
idmctl|team|idmctl-alice||core-extra,core-own,normal,share,sub|share
idmctl|team|idmctl-bob||core-extra,core-own,normal,share,sub|share
"""


def test_associations_are_the_users_own_rows() -> None:
    rows = parse_assoc(ASSOC_22_05, "root")
    assert [(r.account, r.partition, r.qos) for r in rows] == [
        ("root", None, ("core-extra", "core-own", "normal", "share", "sub"))]
    assert [r.account for r in parse_assoc(ASSOC_22_05, "idmctl-alice")] == ["team"]
    assert parse_assoc(ASSOC_22_05, "nobody") == []  # an account's own row grants nothing to anyone


def _profile(directory: Path, **changes: object) -> Path:
    profile = yaml.safe_load((REPO / "clusters" / "local-slurm.yaml").read_text())
    profile.update(name="local-slurm-accounts", **changes)
    path = directory / "local-slurm-accounts.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def _rows() -> tuple[int, int]:
    with session() as db:
        return len(db.exec(select(Job)).all()), len(db.exec(select(Chain)).all())


def _qos_row(result) -> dict:  # type: ignore[no-untyped-def]
    report = json.loads(result.stdout)
    assert report["refused"] is True
    return next(c for c in report["checks"] if c["name"] == "qos")


@pytest.mark.slurm
@pytest.mark.cluster_reader
def test_a_job_without_the_account_the_profile_requires_is_refused_before_any_row(cli, slurm_home: Path,
                                                                                  tmp_path: Path) -> None:
    profile = _profile(tmp_path, account_required=True)
    result = cli("submit", "quickstart", "--cluster", str(profile), "--json")
    assert result.exit_code == 1, result.output
    qos = _qos_row(result)
    assert qos["status"] == "FAIL"
    assert "no account: cluster local-slurm-accounts refuses a job without one (profile account_required)" in qos["summary"]
    assert qos["fix"].startswith("set resources.account or pass --account")
    assert _rows() == (0, 0) and not (slurm_home / "runs").exists()

    # An account the user has no association with: the gate names the ones it has (sacctmgr show assoc).
    team = cli("submit", "quickstart", "--cluster", str(profile), "--account", "team", "--json")
    assert team.exit_code == 1, team.output
    qos = _qos_row(team)
    assert "account 'team': root has no association with it on idmctl (sacctmgr show assoc: root)" in qos["summary"]
    assert qos["fix"] == "use --account root"
    assert _rows() == (0, 0)

    # The user's own account passes the gate, and the QoS is judged against what it grants.
    dry = cli("submit", "quickstart", "--cluster", str(profile), "--account", "root", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert "#SBATCH --account=root\n" in dry.stdout
    assert "account root grants core-own (sacctmgr show assoc)" in " ".join(dry.stderr.replace("│", " ").split())
    reserved = cli("submit", "quickstart", "--cluster", str(profile), "--account", "root", "--qos", "core-reserved", "--json")
    qos = _qos_row(reserved)
    assert "QoS 'core-reserved' is not granted to root under account root (sacctmgr show assoc: core-extra, core-own, " \
           "normal, share, sub)" in qos["summary"]


@pytest.mark.slurm
@pytest.mark.cluster_reader
@pytest.mark.parametrize(("flag", "value", "said", "fix"), [
    ("--constraint", "h100", "Invalid feature specification",
     "no node has the --constraint / resources.constraint asked; the nodes' features: none"),
    ("--reservation", "ended-2026-11", "Requested reservation is invalid",
     "the reservation has ended or does not exist (`scontrol show reservation`)"),
])
def test_what_only_the_scheduler_knows_is_refused_with_its_fix_and_nothing_written(
        cli, slurm_home: Path, flag: str, value: str, said: str, fix: str) -> None:
    result = cli("submit", "quickstart", flag, value, "--cluster", "local-slurm", "--force", "--reason", "test-only")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("submit refused by the scheduler (sbatch --test-only): "), result.stderr
    assert said in lines[0] and f"(fix: {fix}" in lines[0], lines[0]
    assert _rows() == (0, 0) and not (slurm_home / "runs").exists()
    dry = cli("submit", "quickstart", flag, value, "--cluster", "local-slurm", "--dry-run")
    assert f"#SBATCH {flag}={value}\n" in dry.stdout
    assert f"fix: {fix}" in dry.stderr


@pytest.mark.slurm
def test_each_rank_runs_on_the_cpus_per_task_it_was_given(cli, slurm_home: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A real 2-rank job, one rank on each node with both of its CPUs: each rank's affinity is its
    --cpus-per-task. (Measured on this 22.05.8 cluster: with one task per node, srun without
    --cpus-per-task also got both CPUs; with 8 ranks on card A's node it binds each to one. The test fails
    whenever the rendered CPUs per task and the CPUs a rank gets differ.)"""
    spec = tmp_path / "affinity.yaml"
    spec.write_text(yaml.safe_dump({"extends": "quickstart", "resources": {"nodes": 2, "cpu_ranks": 1, "cpus": 2,
                                                                           "mem": "300M", "time_limit": "0:05:00"}}))
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "affinity")
    result = cli("submit", str(spec), "--cluster", "local-slurm", "--qos", "core-own", "--entry", "tests.jobs_entry",
                 "--force", "--reason", "affinity test", "--json")
    assert result.exit_code == 0, result.output
    submitted = json.loads(result.stdout)
    run_dir = Path(submitted["script"]).parent
    script = Path(submitted["script"]).read_text()
    assert "#SBATCH --cpus-per-task=2\n" in script and "--cpus-per-task=2); else LAUNCH=()" in script

    def reported() -> list[dict] | None:
        files = sorted(run_dir.glob("affinity-*.json"))
        return [json.loads(f.read_text()) for f in files] if len(files) == 2 else None

    ranks = wait_until(reported, 240, lambda: f"both ranks' affinity files in {run_dir} (log so far: "
                                              f"{text_so_far(Path(submitted['log']))[-400:]})", poll_s=1.0)
    assert [r["cpus"] for r in ranks] == [2, 2], ranks
    assert all(r["SRUN_CPUS_PER_TASK"] == "2" and r["SLURM_CPUS_PER_TASK"] == "2" for r in ranks), ranks
    assert sorted(r["node"] for r in ranks) == ["n1", "n2"], ranks

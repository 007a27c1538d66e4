"""Where run directories live: the cluster profile's ``runs_root`` (the shared filesystem, while the SQLite store
stays on the login node's disk), else ``$IDMCTL_HOME/runs``; the doctor row that checks it from the login node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ground.contract import ENV_CLUSTER, ENV_HOME
from ground.paths import REPO_ROOT, runs_root
from idmctl.ops.executors.local import LocalExecutor

CLUSTERS = REPO_ROOT / "clusters"


def _profile(tmp_path: Path, base: str, **fields: object) -> Path:
    """A copy of a shipped profile beside this test, with ``fields`` set."""
    document = yaml.safe_load((CLUSTERS / f"{base}.yaml").read_text())
    document.update(fields)
    path = tmp_path / "profiles" / f"{base}-runs.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def test_runs_root_is_the_profiles_folder_else_under_home(idmctl_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert runs_root() == idmctl_home / "runs" and runs_root(None) == idmctl_home / "runs"
    monkeypatch.setenv("TEAM_NFS", "/nfs/team")
    assert runs_root("$TEAM_NFS/idmctl/runs") == Path("/nfs/team/idmctl/runs")


def test_a_relative_runs_root_is_the_profiles_neighbour_and_unset_keeps_the_hash(tmp_path: Path) -> None:
    from idmctl.core.profile import load_profile

    absent, absent_hash = load_profile(str(_profile(tmp_path, "local-slurm")))
    null, null_hash = load_profile(str(_profile(tmp_path, "local-slurm", runs_root=None)))
    assert absent.runs_root is None and null.runs_root is None
    assert null_hash == absent_hash  # unset is out of the hash: preflights recorded before the field stay valid
    relative, relative_hash = load_profile(str(_profile(tmp_path, "local-slurm", runs_root="shared/runs")))
    assert relative.runs_root == str(tmp_path / "profiles" / "shared" / "runs")
    assert relative_hash != absent_hash  # where runs live is part of what a preflight judged, once set


def test_doctor_runs_row(idmctl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from idmctl.ops.doctor import check_runs

    monkeypatch.setenv(ENV_CLUSTER, "local-slurm")
    row = check_runs()
    assert (row.status, row.detail) == ("OK", f"{idmctl_home}/runs: under {ENV_HOME} (the cluster profile sets no runs_root)")
    shared = tmp_path / "nfs" / "runs"
    monkeypatch.setenv(ENV_CLUSTER, str(_profile(tmp_path, "local-slurm", runs_root=str(shared))))
    mounts = f"/dev/sda1 / ext4 rw 0 0\nnas:/export {tmp_path / 'nfs'} nfs4 rw 0 0\n"
    row = check_runs(mounts)
    assert (row.status, row.detail) == ("OK", f"{shared} (the profile's runs_root; nfs4 on {tmp_path / 'nfs'}), writable: "
                                              "a shared filesystem, as jobs on the compute nodes need (`doctor --nodes` "
                                              "writes there from each node)")
    assert shared.is_dir()
    local = check_runs("/dev/sda1 / ext4 rw 0 0\n")
    assert local.status == "WARN" and local.detail.endswith(
        "ext4 on /), writable: a local filesystem; jobs on other hosts cannot write their run directories there "
        "(fine only where the nodes are this host)")
    assert local.fix == "point the cluster profile's runs_root at a folder on the shared filesystem every compute node mounts"
    monkeypatch.setenv(ENV_CLUSTER, str(_profile(tmp_path, "local", runs_root=str(shared))))
    assert check_runs("/dev/sda1 / ext4 rw 0 0\n").status == "OK"  # the local executor's jobs run on this host
    monkeypatch.setenv(ENV_CLUSTER, str(_profile(tmp_path, "local-slurm", runs_root="/proc/idmctl-runs")))
    refused = check_runs()
    assert refused.status == "FAIL" and refused.detail.startswith("/proc/idmctl-runs (the profile's runs_root) is not writable")


def test_preflight_measures_and_scans_the_profiles_runs_root(idmctl_home: Path, tmp_path: Path) -> None:
    from ground.spec import load_spec
    from idmctl.core.profile import load_profile
    from idmctl.gate.runner import gather

    # /proc holds no free bytes: the measurement is of the profile's folder, not of $IDMCTL_HOME's disk.
    profile = load_profile(str(_profile(tmp_path, "local", runs_root="/proc/idmctl-runs")))[0]
    assert gather(load_spec("quickstart"), profile).runs_free_bytes == 0
    assert (gather(load_spec("quickstart"), load_profile("local")[0]).runs_free_bytes or 0) > 0


def test_a_chain_runs_under_the_profiles_runs_root_and_keeps_its_folder_when_resumed(
        cli, idmctl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real local-executor job: its script, log and run directory are under the profile's runs_root, not
    under $IDMCTL_HOME; resumed under a profile that names another root, the chain stays where its
    checkpoints are."""
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:3:0.05")
    shared = tmp_path / "shared" / "runs"
    first = cli("submit", "quickstart", "--cluster", str(_profile(tmp_path, "local", runs_root=str(shared))),
                "--entry", "tests.jobs_entry", "--force", "--reason", "runs_root test", "--json")
    assert first.exit_code == 0, first.output
    job = json.loads(first.stdout)
    run_dir = shared / "quickstart" / str(job["chain"])
    assert Path(job["script"]).parent == run_dir and Path(job["log"]).parent == run_dir
    assert not (idmctl_home / "runs").exists()
    LocalExecutor().wait(job["scheduler_id"], timeout_s=60)
    assert cli("sync").exit_code == 0
    elsewhere = tmp_path / "elsewhere" / "runs"
    again = cli("submit", "quickstart", "--resume", str(job["chain"]), "--cluster",
                str(_profile(tmp_path, "local", runs_root=str(elsewhere))), "--entry", "tests.jobs_entry",
                "--force", "--reason", "runs_root test", "--json")
    assert again.exit_code == 0, again.output
    resumed = json.loads(again.stdout)
    assert Path(resumed["script"]).parent == run_dir and not elsewhere.exists()
    LocalExecutor().wait(resumed["scheduler_id"], timeout_s=60)

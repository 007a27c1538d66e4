"""``idmctl doctor``: one table, every failing row with its fix, --json, exit 1 when something required is missing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ground.contract import ENV_CLUSTER, ENV_DB_URL, ENV_HOME
from idmctl.record.head import HEAD_REVISION

REPO = Path(__file__).resolve().parents[3]
ROWS = ["python", "packages", ENV_HOME, "store", "mlflow store", "slurm", "cluster settings", "rendering", "/dev/shm", "scratch", "code store", "runs"]


def _rows(result) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {row["name"]: row for row in json.loads(result.output)["rows"]}


def test_a_ready_machine_passes_every_row_and_renders_one_clean_frame(cli, idmctl_home: Path) -> None:
    result = cli("doctor", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [row["name"] for row in report["rows"]] == ROWS
    assert report["ok"] is True and report["failed"] == []
    rows = _rows(result)
    assert all(row["status"] in ("OK", "WARN") for row in rows.values()), rows
    assert rows["python"]["detail"].startswith("3.11.")
    assert "torch 2.13.0" in rows["packages"]["detail"] and "mlflow 3.17.2" in rows["packages"]["detail"]
    assert rows[ENV_HOME]["status"] == "OK" and str(idmctl_home) in rows[ENV_HOME]["detail"]
    assert "not created yet" in rows["store"]["detail"]
    assert rows["rendering"]["status"] == "OK"
    assert "64×64 agentview frame" in rows["rendering"]["detail"] and "noise > 40" in rows["rendering"]["detail"]
    assert "free of" in rows["/dev/shm"]["detail"] and "free of" in rows["scratch"]["detail"]


def test_unwritable_home_and_a_slurm_profile_without_sbatch_fail_with_their_fixes(cli, monkeypatch) -> None:
    monkeypatch.setenv(ENV_HOME, "/proc/idmctl-doctor")  # not writable, even for root
    monkeypatch.setenv(ENV_CLUSTER, "card")  # scheduler: slurm
    monkeypatch.setenv("PATH", "/nonexistent")
    result = cli("doctor", "--json", "--no-render")
    assert result.exit_code == 1
    rows = _rows(result)
    assert rows[ENV_HOME]["status"] == "FAIL"
    assert "not writable" in rows[ENV_HOME]["detail"] and ENV_HOME in rows[ENV_HOME]["fix"]
    assert rows["slurm"]["status"] == "FAIL"
    assert "'card'" in rows["slurm"]["detail"] and "sbatch, sacct, squeue not on PATH" in rows["slurm"]["detail"]
    assert "IDMCTL_CLUSTER=local" in rows["slurm"]["fix"]
    assert rows["rendering"]["status"] == "SKIP"
    assert json.loads(result.output)["failed"] == [ENV_HOME, "slurm"]


def test_the_table_shows_each_failing_row_with_its_fix_and_a_verdict(cli, monkeypatch) -> None:
    monkeypatch.setenv(ENV_CLUSTER, "no-such-cluster")
    result = cli("doctor", "--no-render")
    assert result.exit_code == 1
    line = next(line for line in result.output.splitlines() if line.startswith("│ slurm"))
    assert "FAIL" in line and "no such profile" in line and "set IDMCTL_CLUSTER to one of" in line
    assert result.output.strip().splitlines()[-1].startswith("doctor: ")
    assert "fix the FAIL rows: slurm" in result.output


def test_a_corrupt_store_fails_and_an_old_one_warns(cli, idmctl_home: Path) -> None:
    idmctl_home.mkdir(parents=True)
    (idmctl_home / "idmctl.sqlite").write_bytes(b"not a database" * 100)
    result = cli("doctor", "--json", "--no-render")
    assert result.exit_code == 1
    assert _rows(result)["store"]["status"] == "FAIL" and "move it aside" in _rows(result)["store"]["fix"]

    (idmctl_home / "idmctl.sqlite").unlink()
    with sqlite3.connect(idmctl_home / "idmctl.sqlite") as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES ('0000')")
    result = cli("doctor", "--json", "--no-render")
    assert result.exit_code == 0, result.output
    store = _rows(result)["store"]
    assert store["status"] == "WARN" and f"revision 0000, head is {HEAD_REVISION}" in store["detail"]


def test_a_network_filesystem_home_fails(monkeypatch, tmp_path: Path) -> None:
    from idmctl.ops.doctor import check_home, mount_of

    mounts = f"/dev/sda1 / ext4 rw 0 0\nnas:/export {tmp_path} nfs4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n"
    assert mount_of(tmp_path / "deep" / "idmctl", mounts) == (str(tmp_path), "nfs4")
    assert mount_of(Path("/dev/shmother"), mounts) == ("/", "ext4")
    monkeypatch.setenv(ENV_HOME, str(tmp_path / "idmctl"))
    row = check_home(mounts)
    assert row.status == "FAIL" and "nfs4" in row.detail and "SQLite on NFS corrupts" in row.detail
    assert "the store and MLflow's store would be SQLite" in row.detail
    assert "local disk" in row.fix
    # With the team's PostgreSQL and an MLflow server nothing SQLite lives there: NFS is where run
    # directories and code snapshots belong, so compute nodes see them.
    monkeypatch.setenv(ENV_DB_URL, "postgresql://idmctl@db.example:5432/idmctl")
    assert check_home(mounts).status == "FAIL"  # MLflow's store would still be SQLite there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    row = check_home(mounts)
    assert row.status == "OK" and "a shared filesystem, as run directories need" in row.detail


def test_migration_heads_are_read_from_the_files() -> None:
    from mlflow.store.db.utils import _get_latest_schema_revision

    from idmctl.ops.doctor import _mlflow_versions_dir, migration_head
    from idmctl.record.db import HEAD_REVISION
    from idmctl.record.migrate import MIGRATIONS_DIR

    assert migration_head(MIGRATIONS_DIR / "versions") == HEAD_REVISION
    assert migration_head(_mlflow_versions_dir()) == _get_latest_schema_revision()


def test_the_doctor_command_imports_nothing_heavy(tmp_path: Path) -> None:
    code = ("import sys, json; from typer.testing import CliRunner; from idmctl.cli.app import app; "
            "r = CliRunner().invoke(app, ['doctor', '--no-render', '--json']); "
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'mlflow', 'robosuite', 'mujoco', 'sqlalchemy', 'lightning_fabric', 'diffusers'}); "
            "print(json.dumps({'exit': r.exit_code, 'heavy': heavy}))")
    env = {**os.environ, ENV_HOME: str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO, env=env)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"exit": 0, "heavy": []}


@pytest.mark.parametrize("debug", [False, True])
def test_a_check_that_breaks_is_a_failing_row_unless_debug(monkeypatch, debug: bool) -> None:
    from idmctl.ops import doctor

    def broken():  # type: ignore[no-untyped-def]
        raise OSError("boom")

    monkeypatch.setattr(doctor, "CHECKS", (("python", broken),))
    if debug:
        with pytest.raises(OSError, match="boom"):
            doctor.run_doctor(debug=True)
    else:
        row, = doctor.run_doctor().rows
        assert row.status == "FAIL" and "OSError: boom" in row.detail and "--debug" in row.fix


def test_the_code_store_row_counts_snapshots_and_their_distinct_bytes(cli, idmctl_home: Path, tmp_path: Path) -> None:
    from ground.code_snapshot import default_store, materialize, tree

    assert "no snapshots yet" in _rows(cli("doctor", "--json", "--no-render"))["code store"]["detail"]
    root = tmp_path / "code"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "pkg" / "b.py").write_text("B = 22\n")
    materialize(tree(root), default_store())
    (root / "pkg" / "b.py").write_text("B = 333\n")
    materialize(tree(root), default_store())  # a.py is shared: 3 distinct contents, not 4
    row = _rows(cli("doctor", "--json", "--no-render"))["code store"]
    assert row["status"] == "OK" and "2 snapshot(s), 3 distinct files, 21 B" in row["detail"], row


def test_a_code_store_the_profile_names_that_is_a_file_fails(cli, idmctl_home: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from ground.contract import ENV_CLUSTER

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    profile = tmp_path / "cluster.yaml"
    profile.write_text((REPO / "clusters" / "local.yaml").read_text() + f"code_store: {blocked}/code\n")
    monkeypatch.setenv(ENV_CLUSTER, str(profile))
    row = _rows(cli("doctor", "--json", "--no-render"))["code store"]
    assert row["status"] == "FAIL" and "is not a writable folder" in row["detail"], row

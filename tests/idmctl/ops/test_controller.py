"""The controller's parts that need no cluster: the scheduled sync's scrontab block (rendered, and the
command it runs, run), and a controller whose store does not answer (tests/idmctl/ops/test_slurm_controller.py runs
controller jobs on the local Slurm)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ground.contract import ENV_DB_URL
from ground.paths import REPO_ROOT, clusters_dir
from idmctl.core.profile import load_profile
from idmctl.ops.scron import BEGIN, END, render_block, without_block
from net_support import free_port


def test_the_scrontab_block_names_the_controller_settings_and_runs_sync(tmp_path: Path) -> None:
    profile = load_profile(str(clusters_dir() / "local-slurm.yaml"))[0]
    block = render_block(profile, "/srv/idmctl/clusters/local-slurm.yaml", python="/opt/venv/bin/python",
                         repo_root=Path("/srv/idmctl"), idmctl_home=Path("/home/op/idmctl"))
    assert block == (
        f"{BEGIN}\n"
        "#SCRON --job-name=idmctl-scron\n"
        "#SCRON --qos=share\n"
        "#SCRON --cpus-per-task=1\n"
        "#SCRON --mem=400M\n"
        "#SCRON --time=0-00:03:00\n"
        "#SCRON --output=/home/op/idmctl/controller-scron.out\n"
        "#SCRON --open-mode=append\n"
        "*/10 * * * * cd /srv/idmctl && IDMCTL_HOME=/home/op/idmctl IDMCTL_CLUSTER=/srv/idmctl/clusters/local-slurm.yaml "
        "/opt/venv/bin/python -m idmctl sync\n"
        f"{END}\n")
    # Installing again replaces the block; the user's own entries stay.
    theirs = "0 3 * * * /home/op/backup.sh\n"
    assert without_block(theirs + block) == theirs
    assert without_block(theirs + block + "@daily /home/op/other\n") == theirs + "@daily /home/op/other\n"
    # The cron line's command, as scrontab would run it, syncs this home's (empty) store.
    here = render_block(profile, None, python=sys.executable, repo_root=REPO_ROOT, idmctl_home=tmp_path)
    command = here.splitlines()[-2].split(" ", 5)[5]
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("synced 0 unfinished jobs"), result.stdout


def test_install_without_scrontab_says_so_in_one_line(cli, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = cli("controller", "install", "--cluster", "local-slurm")
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and "scrontab is not installed" in result.output, result.output


def test_a_controller_that_cannot_reach_the_store_fails_loudly_and_never_prints_the_password(cli, monkeypatch) -> None:
    monkeypatch.setenv(ENV_DB_URL, f"postgresql://ops:s3cr3t-pw@127.0.0.1:{free_port()}/idmctl")
    result = cli("sync", "--chain", "4", "--controller-for", "2318")
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "s3cr3t-pw" not in result.output
    assert lines[0].startswith("error: controller for chain 4 (after job 2318): "), lines[0]
    assert "nothing was recorded: the next controller or `idmctl sync` catches up from sacct" in lines[0]


def test_the_controller_script_runs_its_sync_for_the_chain(tmp_path: Path) -> None:
    """The rendered controller script, run by bash as slurmd would (outside Slurm here): it syncs the chain
    (none in this empty store) and exits 0; its own id comes through, the allocation's variables do not."""
    import os

    from idmctl.job.controller_script import ControllerContext, controller_request, render_controller_script

    ctx = ControllerContext(chain_id=1, attempt=1, after="123", log_path=str(tmp_path / "controller-%j.out"),
                            idmctl_home=tmp_path)
    script = tmp_path / "controller-1.sbatch"
    script.write_text(render_controller_script(controller_request(ctx, "share", "0:03:00", "400MiB"), ctx))
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_CPUS_PER_TASK": "1"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "idmctl: controller 4242 for chain 1 after job 123" in result.stdout
    assert "controller for chain 1 after job 123: 0 checked, none ended" in result.stdout
    assert "idmctl: controller exited 0" in result.stdout

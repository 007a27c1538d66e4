"""The controller's parts that need no cluster: the scheduled sync's scrontab block (rendered, and the
command it runs, run), and a controller whose store does not answer (tests/idmctl/ops/test_slurm_controller.py runs
controller jobs on the local Slurm)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ground.contract import ENV_DB_URL
from ground.paths import REPO_ROOT, clusters_dir
from idmctl.core.profile import load_profile
from idmctl.ops.scron import BEGIN, END, render_block, without_block
from net_support import free_port
from test_notify import webhook  # noqa: F401  (the fixture: a real JSON webhook on 127.0.0.1)


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


# -- a store outage: follow-ups, the team told, and which idmctl a controller runs ---------------------------

def _as_controller(monkeypatch, follow_up: int, origin: str | None = None) -> None:
    """This process as controller job 7001 of attempt 2 would be (its script's exports), try ``follow_up``."""
    from idmctl.job.controller_script import ENV_CONTROLLER, ENV_CONTROLLER_JOB, FollowUp

    monkeypatch.setenv(ENV_CONTROLLER_JOB, "7001")
    monkeypatch.setenv(ENV_CONTROLLER, FollowUp(2, "/nonexistent/run", follow_up, origin).encoded())


def test_a_controller_with_no_follow_up_left_tells_the_team_and_names_the_sync(cli, monkeypatch, webhook) -> None:
    """The profile's last try (local's default: 6) found the store down: no sbatch, one line, one message."""
    from ground.contract import ENV_NOTIFY

    monkeypatch.setenv(ENV_DB_URL, f"postgresql://ops:s3cr3t-pw@127.0.0.1:{free_port()}/idmctl")
    monkeypatch.setenv(ENV_NOTIFY, webhook.url("/team"))
    _as_controller(monkeypatch, follow_up=6, origin="7000")
    result = cli("sync", "--chain", "4", "--controller-for", "2318")
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("error: controller for chain 4 (after job 2318): ") and "s3cr3t-pw" not in line, line
    assert line.endswith("nothing was recorded: no follow-up controller left (6 follow-ups ran); "
                         "run `idmctl sync --chain 4` once the store and Slurm answer"), line
    (message,) = webhook.messages("/team")
    assert message["title"] == "idmctl: chain 4 waits for a sync: its controller gave up"
    assert message["event"] == "controller_gave_up" and message["type"] == "failure"
    assert message["done"] == ("no follow-up controller left (6 follow-ups ran); run `idmctl sync --chain 4` once "
                               "the store and Slurm answer")
    assert "s3cr3t-pw" not in json.dumps(webhook.received)


def test_a_store_newer_than_the_controllers_idmctl_leaves_no_follow_up_and_names_code_current(
        cli, monkeypatch, webhook, idmctl_home: Path) -> None:
    """A newer idmctl migrated the store: a follow-up on the same snapshot would find the same, so the first
    controller says at once how to move the chain on (a real SQLite store, stamped one revision ahead)."""
    import sqlite3

    from ground.contract import ENV_NOTIFY

    assert cli("jobs").exit_code == 0  # creates the store at head
    with sqlite3.connect(idmctl_home / "idmctl.sqlite") as db:
        db.execute("UPDATE alembic_version SET version_num = '9999_from_a_newer_idmctl'")
    from idmctl.record import db as store_db

    store_db.dispose_engines()
    store_db._engine_for.cache_clear()  # as a controller job would: a process that opens the store afresh
    monkeypatch.setenv(ENV_NOTIFY, webhook.url("/team"))
    _as_controller(monkeypatch, follow_up=0)
    result = cli("sync", "--chain", "4", "--controller-for", "2318")
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert "the store is at schema 9999_from_a_newer_idmctl, newer than this idmctl knows" in line, line
    assert line.endswith("move the chain on with `idmctl submit … --resume 4 --code current`, or run `idmctl sync "
                         "--chain 4` from the upgraded idmctl"), line
    (message,) = webhook.messages("/team")
    assert message["event"] == "controller_gave_up"
    assert message["title"] == "idmctl: chain 4 waits for a sync: its store is newer than its idmctl"


def test_a_follow_up_waits_on_no_job_and_starts_after_its_backoff(tmp_path: Path) -> None:
    from idmctl.core.profile import ControllerJob
    from idmctl.job.controller_script import (ENV_CONTROLLER, ControllerContext, FollowUp, controller_request,
                                              render_controller_script)
    from idmctl.ops.controller import follow_up_delay_s

    ctx = ControllerContext(chain_id=4, attempt=2, after="2318", log_path=str(tmp_path / "controller-%j.out"),
                            idmctl_home=tmp_path, begin="now+8", follow_up=2, origin="7000",
                            repo_root=tmp_path / "code" / "snapshots" / "35f7d4283a17d4c7")
    script = render_controller_script(controller_request(ctx, "share", "0:03:00", "400MiB"), ctx)
    assert "#SBATCH --begin=now+8" in script and "--dependency" not in script and "--kill-on-invalid-dep" not in script
    assert f"cd {tmp_path}/code/snapshots/35f7d4283a17d4c7 || exit 1" in script
    exported = next(line for line in script.splitlines() if line.startswith(f"export {ENV_CONTROLLER}="))
    value = subprocess.run(["bash", "-c", f"{exported}; printf %s \"${ENV_CONTROLLER}\""], capture_output=True,
                           text=True, check=True).stdout
    assert FollowUp.decoded(value) == FollowUp(2, str(tmp_path), 2, "7000")
    # The default backoff doubles from 2 min over 6 tries: 2 + 4 + 8 + 16 + 32 + 64 = 126 min covered.
    defaults = ControllerJob()
    delays = [follow_up_delay_s(defaults, n) for n in range(1, defaults.outage_tries + 1)]
    assert delays == [120, 240, 480, 960, 1920, 3840] and sum(delays) == 126 * 60


def test_a_controller_is_charged_to_the_attempts_account_and_its_follow_ups_too(tmp_path: Path) -> None:
    from idmctl.job.controller_script import (ENV_CONTROLLER, ControllerContext, FollowUp, controller_request,
                                              render_controller_script)

    ctx = ControllerContext(chain_id=4, attempt=1, after="2318", log_path=str(tmp_path / "controller-%j.out"),
                            idmctl_home=tmp_path, account="team", repo_root=tmp_path)
    script = render_controller_script(controller_request(ctx, "share", "0:03:00", "400MiB"), ctx)
    assert "#SBATCH --qos=share\n#SBATCH --account=team\n" in script
    exported = next(line for line in script.splitlines() if line.startswith(f"export {ENV_CONTROLLER}="))
    value = subprocess.run(["bash", "-c", f"{exported}; printf %s \"${ENV_CONTROLLER}\""], capture_output=True,
                           text=True, check=True).stdout
    assert FollowUp.decoded(value) == FollowUp(1, str(tmp_path), 0, None, None, "team")
    # Without an account nothing changes: no directive, and the variable as scripts of old wrote it.
    plain = ControllerContext(chain_id=4, attempt=1, after="2318", log_path=str(tmp_path / "controller-%j.out"),
                              idmctl_home=tmp_path, repo_root=tmp_path)
    script = render_controller_script(controller_request(plain, "share", "0:03:00", "400MiB"), plain)
    assert "--account" not in script and '"account"' not in script


def test_jobs_show_says_which_idmctl_the_controller_runs() -> None:
    from idmctl.ops.controller import controller_code_line

    code = {"version": "35f7d4283a17d4c7", "directory": "/h/code/snapshots/35f7d4283a17d4c7"}
    assert controller_code_line({"scheduler_id": "140", "code": code}, code) == (
        "controller job 140 runs idmctl from this attempt's snapshot 35f7d4283a17d4c7 in "
        "/h/code/snapshots/35f7d4283a17d4c7, not the live clone")
    assert controller_code_line({"scheduler_id": "140", "code": {"version": None, "directory": "/srv/idmctl"}}, None) == (
        "controller job 140 runs the live clone /srv/idmctl (the attempt has no code snapshot)")
    assert controller_code_line({"scheduler_id": "140"}, code) == (
        "controller job 140 runs the live clone (submitted before controllers ran from the chain's snapshot)")


def test_jobs_lists_a_run_that_caught_up_after_an_outage() -> None:
    from idmctl.ops.controller import controller_line

    followed = {"scheduler_id": "140", "submitted_at": "2026-12-07T21:00:00+00:00",
                "last_run": {"at": "2026-12-07T21:03:10+00:00", "result": "1 ended, nothing to resubmit", "ok": True,
                             "scheduler_id": "152", "follow_up": 2, "outage_from": "140"}}
    assert controller_line(followed) == ("controller job 140 (submitted 2026-12-07T21:00:00+00:00), last ran "
                                         "2026-12-07T21:03:10+00:00 (follow-up 2 after a store outage): "
                                         "1 ended, nothing to resubmit")
    del followed["last_run"]["follow_up"]
    assert controller_line(followed).endswith("last ran 2026-12-07T21:03:10+00:00: 1 ended, nothing to resubmit")


def test_a_profile_gone_bad_since_submit_leaves_no_follow_up_and_says_why(cli, monkeypatch, webhook,
                                                                          tmp_path: Path) -> None:
    from ground.contract import ENV_CLUSTER, ENV_NOTIFY

    broken = tmp_path / "team.yaml"
    broken.write_text("name: team\nscheduler: slurm\nqos: [not, a, mapping]\n")
    monkeypatch.setenv(ENV_CLUSTER, str(broken))
    monkeypatch.setenv(ENV_DB_URL, f"postgresql://ops:s3cr3t-pw@127.0.0.1:{free_port()}/idmctl")
    monkeypatch.setenv(ENV_NOTIFY, webhook.url("/team"))
    _as_controller(monkeypatch, follow_up=0)
    result = cli("sync", "--chain", "4", "--controller-for", "2318")
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert f"nothing was recorded: no follow-up controller left ({broken}" in line, line
    (message,) = webhook.messages("/team")
    assert message["event"] == "controller_gave_up" and message["done"].startswith(f"no follow-up controller left ({broken}")

"""A chain's controllers run the idmctl that admitted it, on the real local Slurm: the chain is submitted
from a copy of the project (the "live clone", ``snapshot_support.make_project``), the copy's taxonomy is
then changed as a ``git pull`` would change it, and the queued chain's controller still classifies and
decides with the taxonomy the chain was admitted with. ``submit --resume CHAIN --code current`` moves the
chain, its controller included, onto the copy as it is then. No sync is run by the test: the controllers
do it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ground import contract
from ground.code_snapshot import MANIFEST
from ground.paths import clusters_dir
from snapshot_support import chain_rows, chain_status, idmctl, make_project
from slurm_support import sh, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STOP_TO_RESUME = re.compile(r"^(\s+action:) stop$", re.M)


def _profile(home: Path) -> Path:
    """local-slurm with its controller on (the suite's own local-slurm.yaml keeps it off)."""
    profile = yaml.safe_load((clusters_dir() / "local-slurm.yaml").read_text())
    profile["controller"] = {**profile["controller"], "enabled": True}
    path = home / "controlled.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def _controller_fact(home: Path, chain_id: int, attempt: int) -> dict:
    row = chain_rows(home, chain_id)[attempt - 1]
    return json.loads(row["controller"] or "null") or {}


def test_a_queued_chain_is_classified_by_the_taxonomy_it_was_admitted_with(slurm_home: Path) -> None:
    home = slurm_home
    clone = make_project(home)
    env = {contract.ENV_CLUSTER: str(_profile(home)), "IDMCTL_TEST_BEHAVIOR": "typeerror"}
    sub = json.loads(idmctl(clone, home, "submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason",
                            "controller version test", "--json", "--mem", "300MB", "--retries", "2", "--hold",
                            "-J", "ctl-version", **env).stdout)
    chain_id, admitted = sub["chain"], chain_rows(home, sub["chain"])[0]
    code = json.loads(admitted["code"])
    fact = _controller_fact(home, chain_id, 1)
    assert fact["code"] == {"version": code["version"], "directory": code["directory"]}, fact
    script = Path(fact["script"]).read_text()
    assert f"cd {code['directory']} || exit 1" in script, script  # never `cd <the clone>`

    # The live clone is upgraded while the chain waits in the queue: every cause that stops a chain now
    # resumes it. A controller that read the clone would resubmit the failed attempt (2 retries left).
    taxonomy = clone / "idmctl" / "ops" / "failures" / "taxonomy.yaml"
    admitted_text = taxonomy.read_text()
    upgraded, changed = STOP_TO_RESUME.subn(r"\1 resume", admitted_text)
    assert changed > 5, "the copy's taxonomy has no `action: stop` to change"
    taxonomy.write_text(upgraded)
    snapshot_taxonomy = Path(code["directory"]) / "idmctl" / "ops" / "failures" / "taxonomy.yaml"
    assert snapshot_taxonomy.read_text() == admitted_text

    shown = idmctl(clone, home, "jobs", "show", str(sub["job"]), **env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert (f"controller: controller job {fact['scheduler_id']} runs idmctl from this attempt's snapshot "
            f"{code['version']} in {code['directory']}, not the live clone") in shown.stdout.splitlines(), shown.stdout

    sh("scontrol", "release", sub["scheduler_id"])
    wait_until(lambda: chain_status(home, chain_id) != "ACTIVE", 120,
               lambda: f"chain {chain_id} to be decided by its controller (now {chain_status(home, chain_id)}, "
                       f"attempts {[(r['attempt'], r['state']) for r in chain_rows(home, chain_id)]})")
    rows = chain_rows(home, chain_id)
    assert chain_status(home, chain_id) == "FAILED" and len(rows) == 1, [(r["attempt"], r["state"]) for r in rows]
    ran = wait_until(lambda: _controller_fact(home, chain_id, 1).get("last_run"), 60,
                     f"chain {chain_id}'s controller to record its run")
    assert ran["ok"] and "chain stopped" in ran["result"], ran

    # The team moves the chain on: the resumed attempt and its controller run the clone as it is now.
    resumed = idmctl(clone, home, "submit", "quickstart", "--resume", str(chain_id), "--code", "current", "--entry",
                     "tests.jobs_entry", "--force", "--reason", "moved on", "--json", "--mem", "300MB", "--hold", **env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    moved = json.loads(resumed.stdout)
    try:
        second = chain_rows(home, chain_id)[-1]
        new_code = json.loads(second["code"])
        assert new_code["version"] != code["version"]
        new_fact = _controller_fact(home, chain_id, second["attempt"])
        assert new_fact["code"] == {"version": new_code["version"], "directory": new_code["directory"]}, new_fact
        assert f"cd {new_code['directory']} || exit 1" in Path(new_fact["script"]).read_text()
        assert (Path(new_code["directory"]) / "idmctl" / "ops" / "failures" / "taxonomy.yaml").read_text() == upgraded
        assert (Path(new_code["directory"]) / MANIFEST).is_file()
    finally:
        sh("scancel", moved["scheduler_id"], check=False)
        # Its controller then runs (afterany) and records the cancel: let it finish before the home goes.
        wait_until(lambda: not sh("squeue", "-h", "-n", f"idmctl-controller-{chain_id}", "-o", "%i", check=False).strip(),
                   60, f"chain {chain_id}'s controllers to leave the queue")

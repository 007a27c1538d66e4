"""What runs is what was checked, on the real local Slurm: a job held in the queue while its tree changes
runs the snapshot it was admitted with, and so does sync's resubmission; a snapshot edited by hand or an
environment changed before the job starts stops it with its cause; a resubmission the checks would now
refuse is not sent.

Each test works in a copy of the project (a git repository of its own), so editing "the live tree" never
touches the tree the suite runs from. ``submit --hold`` keeps the job pending, as a job waiting days for its
slot would be when its tree changes (card A, job 5961: six days in the queue)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ground import code_snapshot as snap
from ground import contract
from ground.tracking import TAG_CODE_VERSION
from slurm_support import sh
from snapshot_support import BREAKS_THE_TRAINER, REPO, chain_rows, home, idmctl, job_row, project, submitted  # noqa: F401
from snapshot_support import sync_as_attempts_end

pytestmark = pytest.mark.slurm


def test_a_held_job_and_its_resubmission_run_the_admitted_snapshot_after_the_tree_changed(
        tiny_cache, project: Path, home: Path) -> None:
    spec = tiny_cache.spec_file(home / "specs", "tiny_snapshot", resources={"mem": "1500MB"},
                                train={"steps": 4, "checkpoint_every": 1, "log_every": 1, "effective_batch": 4})
    admitted = snap.tree(project).version
    # Attempt 1 turns its loss NaN at step 3 (a test hook of the trainer): sync resubmits it as the
    # chain's rollback, a resubmission of sync's own, after the tree has changed.
    job = submitted(idmctl(project, home, "submit", str(spec), "--force", "--reason", "snapshot test", "--json", "--retries", "2",
                           "--hold", **{contract.ENV_INJECT_NAN_AT_STEP: "3"}))
    assert sh("squeue", "-h", "-j", job["scheduler_id"], "-o", "%r").strip() in ("JobHeldUser", "JobHeldAdmin")
    # While it waits, the tree moves on: the trainer's model module now crashes at import.
    model = project / "trainers" / "model.py"
    model.write_text(BREAKS_THE_TRAINER + model.read_text())
    assert snap.tree(project).version != admitted
    sh("scontrol", "release", job["scheduler_id"])
    ended = sync_as_attempts_end(project, home, job["chain"], timeout_s=300)
    attempts = chain_rows(home, job["chain"])
    assert ended == "COMPLETED", [(a["state"], a["reason"], a["log_tail"]) for a in attempts]
    assert [a["state"] for a in attempts] == ["FAILED", "COMPLETED"], attempts
    log = Path(attempts[-1]["log_path"]).read_text()
    assert "done: step 4" in log and "the live tree was edited" not in log, log[-2000:]
    for attempt in attempts:
        assert attempt["code_version"] == admitted
        code = json.loads(attempt["code"])
        assert code["version"] == admitted  # the folder is named by the whole tree, the version by what runs
        assert Path(code["directory"]).name == snap.read_manifest(Path(code["directory"]))["digest"][:snap.VERSION_LENGTH]
        assert f"idmctl: code {admitted} verified" in Path(attempt["log_path"]).read_text()
    # The resubmission was admitted again, on its own effective job, and says so.
    readmitted = json.loads(attempts[-1]["admitted"])
    assert readmitted["resubmission_of"] == attempts[0]["id"] and readmitted["admission"]["failed"] == []
    with sqlite3.connect(home / "mlflow.sqlite") as db:
        tags = {v for (v,) in db.execute("SELECT value FROM tags WHERE key = ?", (TAG_CODE_VERSION,))}
    assert tags == {admitted}


def test_an_edited_snapshot_or_a_changed_environment_stops_the_job_before_it_runs(
        project: Path, home: Path) -> None:
    extra_site = home / "site"  # a folder on the job's import path, where a new distribution "appears"
    extra_site.mkdir()
    common = dict(PYTHONPATH=str(extra_site), IDMCTL_TEST_BEHAVIOR="steps:2:0.1")
    first = submitted(idmctl(project, home, "submit", "quickstart", "--entry", "tests.jobs_entry", "--mem", "300MB",
                             "--force", "--reason", "env test", "--json", "--hold", **common))
    info = extra_site / "fakepkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
    sh("scontrol", "release", first["scheduler_id"])
    assert sync_as_attempts_end(project, home, first["chain"], timeout_s=120) == "FAILED"
    row = job_row(home, first["job"])
    assert (row["state"], row["exit_code"]) == ("FAILED", f"{contract.EXIT_CODE_MISMATCH}:0"), row
    failures = json.loads(idmctl(project, home, "failures", "--json").stdout)
    (failure,) = [f for f in failures if f["job_pk"] == first["job"]]
    assert failure["cause"] == contract.CAUSE_ENV_CHANGED and "+ fakepkg 1.0" in "\n".join(failure["evidence_lines"]), failure
    assert "entry:" not in Path(row["log_path"]).read_text(), "the entry must not have started"

    shutil.rmtree(info)  # the environment is as admitted again; now the snapshot itself is edited
    second = submitted(idmctl(project, home, "submit", "quickstart", "--entry", "tests.jobs_entry", "--mem", "300MB",
                              "--force", "--reason", "edit test", "--json", "--hold", **common))
    directory = Path(json.loads(job_row(home, second["job"])["code"])["directory"])
    target = directory / "tests" / "jobs_entry.py"
    target.unlink()
    target.write_text("print('edited by hand')\n")
    sh("scontrol", "release", second["scheduler_id"])
    assert sync_as_attempts_end(project, home, second["chain"], timeout_s=120) == "FAILED"
    failures = json.loads(idmctl(project, home, "failures", "--json").stdout)
    (failure,) = [f for f in failures if f["job_pk"] == second["job"]]
    assert failure["cause"] == contract.CAUSE_SNAPSHOT_MODIFIED and "edited tests/jobs_entry.py" in "\n".join(failure["evidence_lines"])
    assert "edited by hand" not in Path(job_row(home, second["job"])["log_path"]).read_text()


def test_a_resubmission_the_checks_now_refuse_is_not_sent_and_the_chain_says_why(tiny_cache, project: Path,
                                                                                  home: Path) -> None:
    """The chain's first attempt fails on an unfit node (sync would exclude it and resubmit); meanwhile the
    cluster's QoS lost its long wall clock. The resubmission is judged on its new effective job: refused."""
    profile = home / "cluster.yaml"
    profile.write_text((REPO / "clusters" / "local-slurm.yaml").read_text())
    sample = home / "unfit.json"
    sample.write_text(json.dumps({"exit": contract.EXIT_NODE_UNFIT,
                                  "log": f"{contract.FAILURE_MARKER} cause=node_unfit node=n1 phase=train check=gpus"}))
    spec = tiny_cache.spec_file(home / "specs", "tiny_refused", resources={"qos": "core-own"})
    record = (f"from ground.spec.loader import load_spec; from idmctl.core.profile import load_profile; "
              f"from idmctl.record.preflights import code_version, record_run; r = load_spec({str(spec)!r}); "
              f"p, h = load_profile({str(profile)!r}); "
              f"record_run(r, p.name, h, code_version(), [], with_smoke=True, seconds=0.1, "
              f"job={{'smoke_flags': {{'--entry': 'tests.jobs_entry'}}}})")
    passed = subprocess.run([sys.executable, "-c", record], cwd=project, capture_output=True, text=True, timeout=120,
                            env={**os.environ, contract.ENV_HOME: str(home)})
    assert passed.returncode == 0, passed.stderr
    job = submitted(idmctl(project, home, "submit", str(spec), "--entry", "tests.jobs_entry", "--mem", "300MB",
                           "--time", "0:05:00", "--cluster", str(profile), "--retries", "3", "--json", "--hold",
                           IDMCTL_TEST_BEHAVIOR=f"emit:{sample}"))
    assert job_row(home, job["job"])["preflight_id"] is not None  # admitted through the gate, not forced
    tiers = yaml.safe_load(profile.read_text())
    tiers["qos"]["core-own"]["max_wall"] = "0:01:00"
    profile.write_text(yaml.safe_dump(tiers))
    sh("scontrol", "release", job["scheduler_id"])
    assert sync_as_attempts_end(project, home, job["chain"], timeout_s=120) == "FAILED"
    attempts = chain_rows(home, job["chain"])
    assert [(a["attempt"], a["state"], a["scheduler_id"]) for a in attempts] == [
        (1, "FAILED", job["scheduler_id"]), (2, "SUBMIT_FAILED", None)], attempts
    assert "resubmission refused: qos FAIL" in attempts[1]["reason"] and "max wall 0:01:00" in attempts[1]["reason"]
    shown = idmctl(project, home, "jobs", "show", str(attempts[1]["id"]))
    assert shown.returncode == 0 and "resubmission refused: qos FAIL" in shown.stdout, shown.stdout + shown.stderr

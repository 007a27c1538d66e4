"""Kills and concurrent use on the real local cluster.

- A real trainer job SIGKILLed mid-run (as by a node reboot or the OOM killer): every checkpoint
  under its final name loads, and the same batch script submitted again resumes from the newest one,
  sweeps the killed attempt's temp files and finishes with the exact step count.
- Four processes submitting and syncing on one store while their jobs run: every job recorded, each
  ends COMPLETED, no process sees "database is locked" or a traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path


import pytest
import torch
from sqlmodel import select

from ground.paths import REPO_ROOT, temp_files
from idmctl.record.db import session
from idmctl.record.models import Job
from slurm_support import sacct_state, sh, text_so_far, wait_until
from trainers.checkpoint import checkpoint_dir, complete_checkpoints, state_file, verify

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_home")]


def _trainer_pid(run_dir: Path) -> int | None:
    """The trainer process of this test's job: `python -m trainers.train --run-dir RUN_DIR` (a process
    this test started through Slurm; found by its unique run directory, killed by pid). Not the `srun`
    that launched it, whose command line holds the same words: killing srun has Slurm stop the step with
    SIGTERM, the trainer's cue to checkpoint and exit 75, and that checkpoint could land after the job
    had ended (seen: the survivors ended at step 15 and the rerun resumed at 16)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (b"trainers.train" in argv and str(run_dir).encode() in argv
                and Path(argv[0].decode(errors="replace")).name != "srun"):
            return int(entry.name)
    return None


def test_trainer_sigkilled_on_the_cluster_leaves_only_whole_checkpoints_and_the_rerun_finishes(
        cli, tiny_cache, slurm_home: Path) -> None:
    total = 200
    spec = tiny_cache.spec_file(slurm_home / "specs", "tiny_killed", resources={"cpus": 2, "mem": "1500MB"},
                                train={"steps": total, "checkpoint_every": 5, "log_every": 10})
    result = cli("submit", str(spec), "--force", "--reason", "kill test", "--json")
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    run_dir, log = Path(job["script"]).parent, Path(job["log"])
    wait_until(lambda: len(complete_checkpoints(run_dir)) >= 2, 240, "two checkpoints of the trainer job")
    pid = wait_until(lambda: _trainer_pid(run_dir), 30, "the trainer's pid")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: sacct_state(job["scheduler_id"]) not in ("", "RUNNING", "PENDING", "COMPLETING"), 120,
               f"job {job['scheduler_id']} to end after the kill")
    wait_until(lambda: _trainer_pid(run_dir) is None, 60, "no trainer process of the job left")
    survivors = complete_checkpoints(run_dir)
    assert survivors, "the kill came after two checkpoints"
    for step, path in survivors:  # a name is a promise: every checkpoint under its name is whole
        assert verify(path, step) is None, verify(path, step)  # the manifest's sizes and sha256 hold
        assert torch.load(state_file(path), weights_only=True)["step"] == step
    rerun = sh("sbatch", "--parsable", job["script"]).strip().split(";")[0]
    wait_until(lambda: sacct_state(rerun) not in ("", "RUNNING", "PENDING", "COMPLETING"), 300,
               f"the resubmitted script (job {rerun}) to end")
    text = text_so_far(log.with_name(f"slurm-{rerun}.out"))  # --output is slurm-%j.out: the rerun's own log
    assert sacct_state(rerun) == "COMPLETED", text[-3000:]
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", text)]
    assert resumed and resumed[-1] == survivors[-1][0], text[-3000:]
    assert f"done: step {total}" in text
    assert complete_checkpoints(run_dir)[-1][0] == total
    assert temp_files(checkpoint_dir(run_dir)) == [] and temp_files(run_dir) == []


WORKER = """
import json, subprocess, sys, time
idmctl = [sys.executable, "-m", "idmctl"]
mine = []
for _ in range(2):
    out = subprocess.run(idmctl + ["submit", "quickstart", "--force", "--reason", "concurrency", "--json",
                                   "--entry", "tests.jobs_entry", "--mem", "300MB"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("submit: " + out.stderr)
    mine.append(json.loads(out.stdout)["job"])
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    out = subprocess.run(idmctl + ["sync", "--no-retry"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("sync: " + out.stderr)
    rows = json.loads(subprocess.run(idmctl + ["jobs", "--json", "--limit", "100"], capture_output=True,
                                     text=True, check=True).stdout)
    if all(r["state"] == "COMPLETED" for r in rows if r["job"] in mine) and len(mine) == 2:
        print(json.dumps(mine))
        sys.exit(0)
sys.exit("timed out waiting for " + repr(mine))
"""


def test_four_processes_submit_and_sync_one_store_while_jobs_run(slurm_home: Path) -> None:
    env = {**os.environ, "IDMCTL_TEST_BEHAVIOR": "steps:2:0.1", "PYTHONPATH": str(REPO_ROOT)}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [worker.communicate(timeout=400) for worker in workers]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0 and "Traceback" not in err, err[-2000:]
        assert "database is locked" not in err
    submitted = sorted(job for out, _ in outputs for job in json.loads(out.strip().splitlines()[-1]))
    with session() as db:
        jobs = db.exec(select(Job)).all()
    assert sorted(job.id for job in jobs) == submitted and len(submitted) == 8
    assert {job.state for job in jobs} == {"COMPLETED"}
    assert all(job.exit_code == "0:0" and job.ended_at is not None for job in jobs)

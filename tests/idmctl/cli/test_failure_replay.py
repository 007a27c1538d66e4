"""Card A's seven failures, replayed in miniature as real jobs on the local Slurm cluster
(scripts/slurm/up.sh), then classified by `sync` + `failures`, with the preflight that stops each.

Each replay spec extends the card-scale mistake spec in experiments/mistakes/ (so it keeps the
mistake) and only shrinks data, model and resources to run on one CPU in seconds. The jobs run the
real trainer (trainers.train) on real tiny HDF5/safetensors data; the /dev/shm one runs it in a
private mount namespace with a 1 MB tmpfs at /dev/shm; the queue and preemption ones use the test
entry (tests.jobs_entry), whose job is only to be scheduled, checkpoint and requeue.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlmodel import select

from idmctl.record.db import session
from idmctl.record.models import Job
from slurm_support import release_requeued, sh, squeue_state, text_so_far, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("local_slurm")]
REPO = Path(__file__).resolve().parents[3]
MISTAKES = REPO / "experiments" / "mistakes"
TINY = {
    "model": {"depth": 2, "hidden_dim": 32, "num_heads": 2, "kv_dim": 32, "mlp_ratio": 2.0,
              "timestep_dim": 32},
    "train": {"steps": 2, "lr": 1.0e-3, "warmup_steps": 0, "effective_batch": 2, "checkpoint_every": 1,
              "log_every": 1},
    "resources": {"gpus_per_node": 0, "cpu_ranks": 1, "cpus": 1, "mem": "1500MB", "time_limit": "0:10:00",
                  "exclude": [], "retries": 0},
    "stage": {"enabled": False},
    "eval": {"metric": "eef_mm_2ep", "episodes": [2]},
    "goal": None,
}


def replay_spec(tmp_path: Path, mistake: str, *, grid: tuple[int, int] = (2, 2), channels: int = 16,
                **sections: dict) -> Path:
    """``mistakes/<mistake>.yaml`` shrunk to tiny real data; ``sections`` override further."""
    from trainers.tiny_data import write_tiny_routed_data

    data = write_tiny_routed_data(tmp_path / f"data_{mistake}", demos=6, valid=2, steps=12, frames=6,
                                  layers=4, grid=grid, channels=channels)
    spec = {"extends": str(MISTAKES / f"{mistake}.yaml"), **TINY,
            "data": {**data, "cache_files": None, "selected_layer_indices": [0, 2], "frame_window": 2,
                     "action_horizon": 4, "train_split": "train", "eval_split": "valid"},
            "loader": {"batch_size": 2, "pin_memory": False}}
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    path = tmp_path / f"replay_{mistake}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def submit(cli, spec: Path | str, *args: str) -> dict:
    result = cli("submit", str(spec), "--force", "--reason", "failure replay", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def job_row(job_id: int) -> Job:
    with session() as db:
        job = db.get(Job, job_id)
        assert job is not None
        return job


def sync_until_final(cli, job_ids: list[int], timeout_s: float = 150) -> None:
    from idmctl.core.job_state import is_terminal

    def all_final() -> bool:
        assert cli("sync", "--no-retry").exit_code == 0
        return all(is_terminal(job_row(job_id).state) for job_id in job_ids)

    wait_until(all_final, timeout_s, f"jobs {job_ids} to end", poll_s=2.0)


def preflight(cli, spec: Path | str, *args: str) -> dict[str, dict]:
    result = cli("preflight", str(spec), "--no-smoke", "--json", *args)
    assert result.exit_code in (0, 1), result.output
    return {check["name"]: check for check in json.loads(result.stdout)["checks"]}


def failures_by_job(cli) -> dict[str, dict]:
    result = cli("failures", "--json")
    assert result.exit_code == 0, result.output
    return {row["job"]: row for row in json.loads(result.output)}


@pytest.mark.slow
def test_replay_card_a_failures_side_by_side(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """6321, 6262, 5845 and 5961 at once, spread over n1 and n2; then the card's table."""
    wrong_class = replay_spec(tmp_path, "wrong_class_kwarg")
    loader_conflict = replay_spec(tmp_path, "persistent_workers_conflict")
    # 5845 in miniature: 2 layers × 2 frames × 8 × 8 tokens × 256 ch × 4 B = 262,144 B/sample;
    # batch 2 → 0.5 MB per batch × 4 workers × prefetch 2 = 4.2 MB through a 1 MB /dev/shm.
    shm_overflow = replay_spec(tmp_path, "shm_overflow", grid=(8, 8), channels=256,
                               loader={"num_workers": 4, "prefetch_factor": 2})
    # 5961 in miniature: all of a node's GPUs (2) on core-extra.
    queue = replay_spec(tmp_path, "core_extra_queue", resources={"gpus_per_node": 2, "cpus": 2},
                        train={"effective_batch": 4})

    # Three trainers opening a new MLflow SQLite store at once race in MLflow's own migrations
    # ("duplicate column name: step"); create the store first, as any earlier run would have.
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    MlflowClient(tracking_uri=mlflow_tracking_uri()).search_experiments()
    jobs = {
        "6321": submit(cli, wrong_class, "--exclude", "n2"),
        "6262": submit(cli, loader_conflict, "--exclude", "n1"),
    }
    monkeypatch.setenv("IDMCTL_REPLAY_SHM", "1m")
    jobs["5845"] = submit(cli, shm_overflow, "--entry", "tests.replay_shm_entry", "--exclude", "n2")
    # 5961: a core-extra job asking for both GPUs of n2 while another job holds them → pending.
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:200:0.5")
    blocker = submit(cli, queue, "--entry", "tests.jobs_entry", "--qos", "core-own", "--exclude", "n1",
                     "-J", "blocker")
    wait_until(lambda: squeue_state(blocker["scheduler_id"]) == "RUNNING", 60, "the blocker to run")
    jobs["5961"] = submit(cli, queue, "--entry", "tests.jobs_entry", "--exclude", "n1")
    wait_until(lambda: squeue_state(jobs["5961"]["scheduler_id"]) == "PENDING", 30, "the queued job")
    time.sleep(4)  # the wait the record must show
    assert squeue_state(blocker["scheduler_id"]) == "RUNNING", "the blocker ended early: 5961 would run, not wait"
    assert cli("cancel", str(jobs["5961"]["job"])).exit_code == 0
    assert cli("cancel", str(blocker["job"])).exit_code == 0

    # The blocker too: its row is asserted below, and a running trainer takes seconds to stop on TERM.
    sync_until_final(cli, [job["job"] for job in jobs.values()] + [blocker["job"]])
    found = failures_by_job(cli)
    by_card = {card: found[job["scheduler_id"]] for card, job in jobs.items()}

    assert by_card["6321"]["cause"] == "python_exception"
    assert by_card["6321"]["detail"]["exception_type"] == "TypeError"
    assert "HiddenSingleLayerDataset" in by_card["6321"]["detail"]["message"]
    assert "unexpected keyword argument" in by_card["6321"]["detail"]["message"]
    assert by_card["6321"]["detail"]["frame"].startswith("cache/registry.py:"), by_card["6321"]

    assert by_card["6262"]["cause"] == "loader_config"
    assert by_card["6262"]["detail"]["message"] == "persistent_workers option needs num_workers > 0"

    assert by_card["5845"]["cause"] == "shm_enospc", by_card["5845"]
    assert any("No space left on device" in line or "Bus error" in line
               for line in by_card["5845"]["evidence_lines"]), by_card["5845"]

    assert by_card["5961"]["cause"] == "queue_cancelled"
    assert by_card["5961"]["detail"]["waited_seconds"] >= 4
    assert by_card["5961"]["evidence"].startswith("cancelled after waiting ")
    assert by_card["5961"]["setting"] == "2 GPU core-extra, N=2"

    # The preflight on the same specs stops them before submission.
    assert preflight(cli, wrong_class)["introspection"]["status"] == "FAIL"
    assert preflight(cli, loader_conflict)["loader"]["status"] == "FAIL"
    # The shm check measures this machine's /dev/shm: run it where /dev/shm is the job's 1 MB tmpfs.
    command = (f"mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm && "
               f"{sys.executable} -m idmctl preflight {shm_overflow} --no-smoke --json")
    in_small_shm = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=120)
    shm_check = next(c for c in json.loads(in_small_shm.stdout)["checks"] if c["name"] == "shm")
    assert shm_check["status"] == "FAIL", shm_check
    assert "4,194,304 B" in shm_check["summary"]
    # The queue: qos estimates the wait from recorded jobs of the same QoS and GPU count, now including
    # the replayed one (cancel − submit), and WARNs past the cluster's queue_wait_warn (3 s on the
    # miniature cluster, 1 day on the card's).
    queue_check = preflight(cli, queue)["qos"]
    assert "no recorded" not in queue_check["summary"], queue_check
    assert queue_check["status"] == "WARN", queue_check
    assert "long: expected queue wait" in queue_check["summary"]
    assert jobs["5961"]["scheduler_id"] in queue_check["summary"]  # the replayed job is the history

    fixes = [("6321", "kwarg on the class the spec names (introspection)"), ("6262", "persistent_workers derived"),
             ("5845", "loader.num_workers 0"), ("5961", "switch to own quota")]
    for card, note in fixes:
        assert cli("failures", "fix", jobs[card]["scheduler_id"], "--note", note).exit_code == 0
    markdown = cli("failures", "--markdown").output
    assert "| job | experiment | setting | cause | evidence | fix | caught now by |" in markdown
    for card, note in fixes:
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {jobs[card]['scheduler_id']} |"))
        assert note in row
    # The blocker was cancelled while running: a failure too, of another cause, left open.
    assert found[blocker["scheduler_id"]]["cause"] == "cancelled"
    assert "5 failed jobs, 4 with a recorded fix, 1 open." in markdown


@pytest.mark.slow
def test_replay_preempted_three_times_in_one_chain(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """6054/6108/6158: a job on the preemptible `sub` QoS loses its node three times to core-own."""
    spec = replay_spec(tmp_path, "preemptible_sub_stage")
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:60:0.3")  # ~18 s of work: outlives 3 preemptions
    low = submit(cli, spec, "--entry", "tests.jobs_entry", "-c", "2", "--exclude", "n2", "--mem", "300MB",
                 "--retries", "0", "-J", "sub_low")
    low_id = low["scheduler_id"]
    log = Path(low["log"])
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.1")
    for preemption in range(1, 4):
        # Each preemptor waits held and is released once the run steps: a release is one RPC, where a
        # submit at that point spends the sub job's 18 s of work (three of them, under a CPU hog).
        high = submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--qos", "core-own", "-c", "2",
                      "--mem", "300MB", "--exclude", "n2", "-J", f"own_{preemption}", "--hold")
        wait_until(lambda: squeue_state(low_id) == "RUNNING" and "entry: step" in text_so_far(log).split(
            f"restart {preemption - 1}")[-1], 90, f"run {preemption} of the sub job to step")
        sh("scontrol", "release", high["scheduler_id"])

        def requeued_and_released() -> bool:
            if f"restart {preemption}" in text_so_far(log):
                return True
            if squeue_state(high["scheduler_id"]) in ("COMPLETED", ""):
                release_requeued(low_id)
            return False

        wait_until(requeued_and_released, 120, f"preemption {preemption} and restart", poll_s=1.0)
    # Not `idmctl cancel` to end it: the job script now checkpoints on TERM and requeues itself, so a
    # cancelled running job comes back (seen here; reported to the job/render owner).
    sync_until_final(cli, [low["job"]], timeout_s=240)
    assert job_row(low["job"]).state == "COMPLETED"
    rows = json.loads(cli("failures", spec.stem, "--json").output)
    causes = [row["cause"] for row in rows]
    assert causes.count("preempted") == 3, rows
    assert {row["chain_id"] for row in rows} == {low["chain"]}
    markdown = cli("failures", "--markdown").output
    assert "| preempted ×3 |" in markdown
    assert preflight(cli, MISTAKES / "preemptible_sub_stage.yaml", "--cluster", "card")["qos"]["status"] == "FAIL"


def test_jobs_import_pulls_a_job_submitted_without_idmctl(cli, tmp_path: Path) -> None:
    """A team member's plain sbatch job that dies on a TypeError enters the postmortem log."""
    from slurm_support import sacct_state

    script = tmp_path / "legacy_job.sh"
    script.write_text("#!/bin/bash\n"
                      f"{sys.executable} -c 'import collections; collections.OrderedDict(1, 2, 3)'\n")
    job_id = sh("sbatch", "--parsable", "-J", "legacy_latentC", "--qos", "core-own", "--mem", "200M",
                "--chdir", str(tmp_path), str(script)).strip()
    wait_until(lambda: sacct_state(job_id) == "FAILED", 60, f"sbatch job {job_id} to fail")

    def imported_now() -> bool:
        # sacct's time-window query (-S) can list a job a moment after `sacct -j` shows it ended.
        result = cli("jobs", "import", "--since", "1h", "--json")
        assert result.exit_code == 0, result.output
        return job_id in json.loads(result.stdout)["imported"]

    wait_until(imported_now, 30, f"sacct -S to list job {job_id}", poll_s=1.0)
    with session() as db:
        job = db.exec(select(Job).where(Job.scheduler_id == job_id)).one()
        assert (job.imported, job.experiment, job.state, job.qos) == (True, "legacy_latentC", "FAILED", "core-own")
        assert job.log_path == str(tmp_path / f"slurm-{job_id}.out")
        assert job.user == pwd.getpwuid(os.getuid()).pw_name  # sacct's User: who ran the sbatch
    # (the hour's window also imports every other job on this shared test cluster: pick ours)
    row = next(r for r in json.loads(cli("failures", "legacy_latentC", "--json").output) if r["job"] == job_id)
    assert row["cause"] == "python_exception"
    assert row["detail"]["exception_type"] == "TypeError"
    assert row["imported"] is True
    again = json.loads(cli("jobs", "import", "--since", "1h", "--json").stdout)
    assert job_id not in again["imported"]  # idempotent: known ids are skipped

"""Submit, sync, retries and requeue against the real local Slurm cluster (scripts/slurm/up.sh):
two nodes n1/n2, QoS `sub` (preemptible, requeue, GraceTime 10) preempted by `core-own`.

A requeue after a node failure is here; each preemption scenario is driven once, where more of its
record is checked: the test entry's in test_slurm_controller (requeued, resumed, its chain completed),
the real trainer's in test_slurm_eval_jobs (resumed at its checkpointed step, then its eval jobs),
PreemptMode=cancel in test_slurm_cancel_preempt and three preemptions in cli/test_failure_replay."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from sqlmodel import select

from idmctl.record.db import session
from idmctl.record.models import Chain, Job
from slurm_support import cluster_changing, release_requeued, sh, squeue_state, text_so_far, wait_until
from ground.contract import MLFLOW_RUN_ID_FILE

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_home")]
REPO = Path(__file__).resolve().parents[3]


def _submit(cli, experiment: str, *args: str) -> dict:
    result = cli("submit", experiment, "--force", "--reason", "slurm test", "--json", *args)
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _job(job_id: int) -> Job:
    with session() as db:
        job = db.get(Job, job_id)
        assert job is not None
        return job


def _sync_until_final(cli, job_id: int, timeout_s: float = 90) -> Job:
    from idmctl.core.job_state import is_terminal

    def ended() -> Job | None:
        assert cli("sync").exit_code == 0
        job = _job(job_id)
        return job if is_terminal(job.state) else None

    return wait_until(ended, timeout_s, f"job {job_id} to end", poll_s=1.0)


def _chain_jobs(chain_id: int) -> list[Job]:
    with session() as db:
        return list(db.exec(select(Job).where(Job.chain_id == chain_id).order_by(Job.id)).all())


@pytest.mark.cluster_reader
def test_dry_run_script_is_accepted_by_sbatch_test_only(cli, tmp_path: Path) -> None:
    result = cli("submit", "quickstart", "--dry-run", "--qos", "sub", "--gres", "gpu:2", "--exclude", "n2")
    assert result.exit_code == 0, result.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(result.stdout)
    test_only = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True)
    assert test_only.returncode == 0, test_only.stderr
    assert re.search(r"sbatch: Job \d+ to start at .* using 2 processors on nodes n1 in partition main", test_only.stderr)
    # The same header with a GPU count no node has is refused: --test-only really checks.
    script.write_text(result.stdout.replace("--gres=gpu:2", "--gres=gpu:3"))
    assert subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True).returncode != 0


@pytest.mark.cluster_reader
def test_a_qos_the_cluster_does_not_grant_is_refused_by_sbatch_test_only_and_nothing_is_recorded(
        cli, slurm_home: Path) -> None:
    """The profile lists core-reserved; the cluster has it but never granted it (scripts/slurm/up.sh).
    Only the scheduler knows that: submit asks it before writing a row, and --force cannot get past it."""
    from idmctl.ops.verdict import scheduler_verdict

    result = cli("submit", "quickstart", "--qos", "core-reserved", "--force", "--reason", "test-only refusal")
    assert result.exit_code == 1, result.output + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("submit refused by the scheduler (sbatch --test-only): ")
    assert "Invalid qos specification" in lines[0]  # Slurm's own words
    assert "Traceback" not in result.output + result.stderr
    with session() as db:
        assert db.exec(select(Chain)).all() == []
        assert db.exec(select(Job)).all() == []
    assert not (slurm_home / "runs").exists()
    assert not any(line.split("|")[0] == "quickstart" for line in
                   sh("squeue", "-h", "-t", "all", "-o", "%j|%q").splitlines() if line.endswith("|core-reserved"))

    # --dry-run shows the same verdict (exit 0: showing it is the point), and so does the one function
    # resubmissions call; a granted QoS is accepted with the node and partition Slurm would use.
    dry = cli("submit", "quickstart", "--dry-run", "--qos", "core-reserved")
    assert dry.exit_code == 0, dry.stderr
    assert re.search(r"^scheduler \(sbatch --test-only\) refuses the job: .*Invalid qos specification \(\d+ ms\)$",
                     dry.stderr, re.M), dry.stderr
    granted = scheduler_verdict("slurm", dry.stdout.replace("--qos=core-reserved", "--qos=core-own"))
    assert granted.accepted and re.search(r"Job \d+ to start at .* on nodes n[12] in partition main", granted.words)
    refused = scheduler_verdict("slurm", dry.stdout)
    assert not refused.accepted and "Invalid qos specification" in refused.words


def test_submit_asks_the_scheduler_before_the_real_sbatch(cli, slurm_home: Path) -> None:
    """An accepted job goes on as before: one chain, one job row, the job known to Slurm."""
    submitted = _submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--qos", "core-own")
    job = _job(submitted["job"])
    assert job.state == "PENDING" and job.scheduler_id and job.scheduler_id.isdigit()
    assert squeue_state(job.scheduler_id) or sh("sacct", "-n", "-X", "-j", job.scheduler_id).strip()
    cli("cancel", str(job.id))


@pytest.mark.slow
def test_two_task_fabric_job_completes_and_sync_records_times(cli, tiny_cache, slurm_home: Path) -> None:
    """The real trainer (trainers.train, Fabric DDP over gloo) as 2 Slurm tasks under srun on one node."""
    spec = tiny_cache.spec_file(slurm_home / "specs", "tiny_slurm",
                                resources={"cpu_ranks": 2, "cpus": 2, "mem": "1500MB"},
                                train={"steps": 4, "checkpoint_every": 2, "log_every": 2, "effective_batch": 4})
    submitted = _submit(cli, str(spec))
    job = _sync_until_final(cli, submitted["job"], timeout_s=240)
    assert "done: step 4" in (job.log_tail or ""), job.log_tail
    assert "Starting with 2 processes" in Path(submitted["log"]).read_text()
    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", "0:0", 0), job.log_tail
    assert job.submitted_at and job.started_at and job.ended_at
    assert job.submitted_at <= job.started_at <= job.ended_at
    assert job.node_list in ("n1", "n2")
    options = json.loads(job.options_json)
    assert (options["ranks_per_node"], options["nodes"]) == (2, 1)
    with session() as db:
        chain = db.get(Chain, job.chain_id)
        assert chain.status == "COMPLETED"
        assert chain.mlflow_run_id == (Path(submitted["script"]).parent / MLFLOW_RUN_ID_FILE).read_text().strip()
    listing = cli("jobs", "--json")
    (row,) = json.loads(listing.stdout)
    assert row["state"] == "COMPLETED" and row["queue_wait_s"] is not None and row["queue_wait_s"] >= 0


def test_job_exceeding_mem_ends_out_of_memory_and_is_not_retried(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "oom")
    submitted = _submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--mem", "200MB", "--retries", "3")
    job = _sync_until_final(cli, submitted["job"])
    assert (job.state, job.exit_code) == ("OUT_OF_MEMORY", "0:125")
    assert len(_chain_jobs(job.chain_id)) == 1
    with session() as db:
        assert db.get(Chain, job.chain_id).status == "FAILED"


def test_type_error_at_start_is_failed_and_not_retried_with_retries_5(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "typeerror")
    submitted = _submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--mem", "500MB", "--retries", "5")
    job = _sync_until_final(cli, submitted["job"])
    assert (job.state, job.exit_code) == ("FAILED", "1:0")
    assert "TypeError: HiddenMultiLayer.__init__()" in (job.log_tail or "")
    assert len(_chain_jobs(job.chain_id)) == 1
    with session() as db:
        chain = db.get(Chain, job.chain_id)
        assert (chain.status, chain.retries_used) == ("FAILED", 0)


def test_cancel_records_cancelled(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:200:0.5")
    submitted = _submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--mem", "300MB", "--retries", "2")
    # Cancel a job that is really running: the trainer checkpoints on TERM, and the job script must
    # not mistake a cancel for a preemption and requeue itself.
    log = lambda: Path(_job(submitted["job"]).log_path)  # noqa: E731
    wait_until(lambda: "entry: step 1" in text_so_far(log()), 60, "the job to run a step")
    assert cli("cancel", str(submitted["job"])).exit_code == 0
    job = _sync_until_final(cli, submitted["job"])
    assert job.state.startswith("CANCELLED")
    time.sleep(3)  # a wrongful self-requeue would show within a second or two
    assert squeue_state(job.scheduler_id) in ("", "CANCELLED"), "a cancelled job was requeued"
    assert "requeued" not in log().read_text()
    assert len(_chain_jobs(job.chain_id)) == 1


@pytest.mark.slow
def test_node_failure_requeues_resumes_and_excludes_the_node(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    total_steps = 20
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", f"steps:{total_steps}:0.3")
    job = _submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--mem", "300MB", "-J", "nodefail")
    run_dir = Path(job["script"]).parent
    ckpt = run_dir / "ckpt.json"
    wait_until(lambda: ckpt.exists() and json.loads(ckpt.read_text())["step"] >= 3, 60, "3 steps")
    failed = sh("squeue", "-h", "-j", job["scheduler_id"], "-o", "%N").strip()
    survivor = {"n1": "n2", "n2": "n1"}[failed]
    # A node down is a change of the shared cluster: no reader test runs until it is back in service.
    with cluster_changing():
        # DRAIN first: with ReturnToService=2 a DOWN node whose slurmd still answers rejoins at once and
        # would take the requeued job back; a drained one stays out, like a dead machine.
        sh("scontrol", "update", f"NodeName={failed}", "State=DRAIN", "Reason=idmctl-test-node-fail")
        sh("scontrol", "update", f"NodeName={failed}", "State=DOWN", "Reason=idmctl-test-node-fail")
        try:
            def release_and_check() -> bool:
                release_requeued(job["scheduler_id"])
                return "restart 1" in text_so_far(Path(job["log"]))

            wait_until(release_and_check, 120, f"the job to restart on {survivor}", poll_s=1.0)
            assert cli("sync").exit_code == 0
            # The node that failed is left out of the next submission's script.
            dry = cli("submit", "quickstart", "--dry-run")
            assert dry.exit_code == 0 and re.search(rf"#SBATCH --exclude=\S*{failed}", dry.stdout), dry.stdout
            final = _sync_until_final(cli, job["job"], timeout_s=120)
        finally:
            sh("scontrol", "update", f"NodeName={failed}", "State=RESUME", check=False)
            # Back in service and responding before other tests schedule onto it.
            wait_until(lambda: sh("sinfo", "-h", "-n", failed, "-o", "%T", check=False).strip() in ("idle", "mixed", "allocated"),
                       60, f"{failed} to return to service")
    assert final.state == "COMPLETED", final.log_tail
    runs = final.runs
    assert runs[0]["state"] == "NODE_FAIL" and runs[-1]["state"] == "COMPLETED", runs
    assert runs[-1]["node_list"] == survivor
    resumed = [int(s) for s in re.findall(r"entry: resumed from step (\d+)", Path(job["log"]).read_text())]
    assert resumed and resumed[0] >= 3
    assert int((run_dir / "steps_done.txt").read_text()) == total_steps
    assert len(_chain_jobs(final.chain_id)) == 1

"""``submit --eval``: an evaluation job per checkpoint on the real local Slurm cluster, after a real
trainers.train chain that is preempted once (USR1 → checkpoint + exit 75 → self-requeue → resume at the
checkpointed step → all steps, one job), logging into the chain's one MLflow run at each checkpoint's
step; and a chain that ends early leaves no eval job pending."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlmodel import select

from idmctl.record.db import session
from idmctl.record.models import Chain, Job
from slurm_support import release_requeued, sh, text_so_far, wait_until
from test_slurm_jobs import _chain_jobs, _job, _submit
from ground.contract import MLFLOW_RUN_ID_FILE

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_home")]


def _sync_until_final(cli, job_ids: list[int], timeout_s: float) -> list[Job]:
    from idmctl.core.job_state import is_terminal

    def ended() -> list[Job] | None:
        assert cli("sync").exit_code == 0
        jobs = [_job(i) for i in job_ids]
        return jobs if all(is_terminal(j.state) for j in jobs) else None

    return wait_until(ended, timeout_s, f"jobs {job_ids} to end", poll_s=1.0)


@pytest.mark.slow
def test_a_preempted_trainer_resumes_at_its_checkpoint_and_an_eval_job_per_checkpoint_logs_into_its_one_run(
        cli, tiny_cache, slurm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trainers.train on `sub` preempted by a core-own job: the resume and its exact step count are checked
    on the same chain whose checkpoints the eval jobs score (one real preempted chain serves both)."""
    total, every = 200, 100
    spec = tiny_cache.spec_file(slurm_home / "specs", "tiny_eval", resources={"cpus": 2, "mem": "1500MB"},
                                # keep_last 3: the preemption's own checkpoint must not push step 100 out
                                train={"steps": total, "checkpoint_every": every, "log_every": 10, "keep_last": 3})
    # The preemptor waits held and is released at the trainer's first logged step: a release is one RPC,
    # where a submit at that point had the 200 tiny steps racing a whole `idmctl submit` (the team-repo
    # test lost that race under a CPU hog).
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:2:0.1")
    high = _submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--qos", "core-own", "-c", "2",
                   "--mem", "500MB", "--exclude", "n2", "--hold")
    monkeypatch.delenv("IDMCTL_TEST_BEHAVIOR")
    low = _submit(cli, str(spec), "--qos", "sub", "--exclude", "n2", "--eval", "each")
    evals = low["evals"]
    assert [e["step"] for e in evals] == [100, 200]
    # Waiting on the training job: Slurm holds them with reason Dependency.
    for e in evals:
        line = sh("squeue", "-h", "-j", e["scheduler_id"], "-o", "%T|%r|%E").strip()
        assert line.startswith("PENDING|Dependency|afterok:" + low["scheduler_id"]), line
    log_path = Path(low["log"])
    wait_until(lambda: re.search(r"^step \d+/", text_so_far(log_path), re.M), 180, "the trainer's first logged step")
    sh("scontrol", "release", high["scheduler_id"])

    def restarted() -> bool:
        release_requeued(low["scheduler_id"])
        return "restart 1" in text_so_far(log_path)

    wait_until(restarted, 180, "the preempted trainer to restart", poll_s=1.0)
    training, preempting, *evaluated = _sync_until_final(cli, [low["job"], high["job"], *(e["job"] for e in evals)], 300)
    log = log_path.read_text()
    assert preempting.state == "COMPLETED", preempting.log_tail
    assert training.state == "COMPLETED" and training.restarts >= 1, log[-2000:]
    assert "stop signal received: checkpointed step" in log  # preempted once, resumed: one chain, one job
    checkpointed = [int(s) for s in re.findall(r"stop signal received: checkpointed step (\d+)", log)]
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", log)]
    assert checkpointed and resumed and resumed[0] == checkpointed[0] > 0, log[-3000:]
    assert f"done: step {total}" in log
    assert len(_chain_jobs(training.chain_id)) == 1  # Slurm requeued it; the eval jobs have chains of their own
    for job in evaluated:
        eval_log = Path(job.log_path or "").read_text()
        assert job.state == "COMPLETED", eval_log[-2000:]
    # One MLflow run: the eval jobs logged into the training chain's, at each checkpoint's step.
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    run_id = (Path(low["script"]).parent / MLFLOW_RUN_ID_FILE).read_text().strip()
    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    run = client.get_run(run_id)
    assert len(client.search_runs([run.info.experiment_id])) == 1
    history = client.get_metric_history(run_id, "eef_mm_2ep")
    for job, step in zip(evaluated, (100, 200)):
        assert run.data.tags[f"idmctl.eval_job.step-{step}"] == job.scheduler_id
        printed = re.search(rf"eval job: step {step}: eef_mm_2ep ([0-9.]+) mm", Path(job.log_path or "").read_text())
        assert printed, Path(job.log_path or "").read_text()[-2000:]
        at_step = sorted((m.timestamp, m.value) for m in history if m.step == step)
        # The trainer's own evaluation of that checkpoint first, then the eval job's: the same weights,
        # episodes and seed give the same error.
        assert len(at_step) == 2, history
        assert at_step[-1][1] == pytest.approx(float(printed.group(1)), abs=0.01)
        assert at_step[-1][1] == pytest.approx(at_step[0][1], rel=1e-4)
        episodes = client.download_artifacts(run_id, f"episodes/eef_mm_2ep/step-{step:09d}.json")
        assert len(json.loads(Path(episodes).read_text())["episodes"]) == 2
    listed = json.loads(cli("jobs", "--json").stdout)
    assert {r["job"]: (r["eval"] or {}).get("step") for r in listed if r["eval"]} == {e["job"]: e["step"] for e in evals}


def test_a_cancelled_chain_leaves_no_eval_job_pending(cli, tiny_cache, slurm_home: Path) -> None:
    spec = tiny_cache.spec_file(slurm_home / "specs", "tiny_eval_cancel", resources={"cpus": 1, "mem": "500MB"})
    held = _submit(cli, str(spec), "--qos", "sub", "--hold", "--eval", "last")
    (evaluation,) = held["evals"]
    assert cli("cancel", str(held["job"])).exit_code == 0
    training, dependent = _sync_until_final(cli, [held["job"], evaluation["job"]], 60)
    assert training.state.startswith("CANCELLED") and dependent.state.startswith("CANCELLED"), dependent.reason
    assert dependent.started_at is None
    with session() as db:
        assert db.get(Chain, dependent.chain_id).status == "FAILED"
    assert sh("squeue", "-h", "-j", evaluation["scheduler_id"], check=False).strip() == ""


def test_eval_jobs_follow_a_resubmitted_attempt(cli, tiny_cache, slurm_home: Path) -> None:
    """A resubmission gives the chain's attempt a new job id: a waiting eval job is moved onto it
    (scontrol update), and one Slurm already killed is submitted again, waiting on the new id. The
    successor here is a second held job standing in for sync's resubmission (moved into the chain)."""
    from idmctl.ops.eval_jobs import follow

    def into_chain(job_id: int, chain_id: int, attempt: int) -> None:
        with session() as db:
            row = db.get(Job, job_id)
            row.chain_id, row.attempt = chain_id, attempt
            db.add(row)

    spec = tiny_cache.spec_file(slurm_home / "specs", "tiny_eval_follow", resources={"cpus": 1, "mem": "500MB"})
    held: list[str] = []  # every held job this test submits: cancelled however it ends, so none outlives it
    try:
        first = _submit(cli, str(spec), "--qos", "sub", "--hold", "--eval", "last")
        held += [first["scheduler_id"], *(e["scheduler_id"] for e in first["evals"])]
        successor = _submit(cli, str(spec), "--qos", "sub", "--hold")
        held.append(successor["scheduler_id"])
        into_chain(successor["job"], first["chain"], 2)
        (waiting,) = first["evals"]
        (line,) = follow([(first["job"], successor["job"])], [])
        assert line == f"eval job {waiting['job']}: now waits on job {successor['job']} ({successor['scheduler_id']})"
        assert sh("squeue", "-h", "-j", waiting["scheduler_id"], "-o", "%E").strip().startswith(
            f"afterok:{successor['scheduler_id']}")
        # Killed by Slurm when the attempt it waits on is cancelled, then its attempt "resubmitted" again.
        sh("scancel", successor["scheduler_id"])
        _, killed = _sync_until_final(cli, [successor["job"], waiting["job"]], 60)
        assert killed.state.startswith("CANCELLED") and killed.started_at is None
        third = _submit(cli, str(spec), "--qos", "sub", "--hold")
        held.append(third["scheduler_id"])
        into_chain(third["job"], first["chain"], 3)
        (line,) = follow([(successor["job"], third["job"])], [])
        fresh_id = int(re.search(r"re-submitted as eval job (\d+)", line).group(1))
        fresh = _job(fresh_id)
        held.append(fresh.scheduler_id)
        assert fresh.eval_replaces == waiting["job"]
        assert sh("squeue", "-h", "-j", fresh.scheduler_id, "-o", "%E").strip().startswith(f"afterok:{third['scheduler_id']}")
        for job in (first, third):
            sh("scancel", job["scheduler_id"])
        _sync_until_final(cli, [first["job"], third["job"], fresh_id], 60)
    finally:
        for scheduler_id in held:
            sh("scancel", scheduler_id, check=False)


def test_a_resumed_chain_gets_eval_jobs_for_the_checkpoints_no_eval_job_scored(cli, tiny_cache, slurm_home: Path) -> None:
    """A chain cancelled while held takes its eval jobs with it; `submit --resume C --eval each` sends the
    new attempt and an eval job for each checkpoint not yet scored, waiting on the new attempt. The first
    eval job's row is set COMPLETED by hand: it stands in for an eval job that ran (running one costs a
    whole training run; test_a_preempted_trainer_resumes_at_its_checkpoint_and_an_eval_job… runs them for real)."""
    spec = tiny_cache.spec_file(slurm_home / "specs", "tiny_eval_resume", resources={"cpus": 1, "mem": "500MB"},
                                train={"steps": 200, "checkpoint_every": 100, "log_every": 10, "keep_last": 3})
    held: list[str] = []
    try:
        first = _submit(cli, str(spec), "--qos", "sub", "--hold", "--eval", "each")
        held += [first["scheduler_id"], *(e["scheduler_id"] for e in first["evals"])]
        assert cli("cancel", str(first["job"])).exit_code == 0
        _sync_until_final(cli, [first["job"], *(e["job"] for e in first["evals"])], 60)
        scored, unscored = first["evals"]
        with session() as db:
            row = db.get(Job, scored["job"])
            row.state = "COMPLETED"
            db.add(row)
        # A flag that changes the chain's spec is bad input naming what it changes; nothing is sent.
        changed = cli("submit", str(spec), "--resume", str(first["chain"]), "-c", "2", "--hold", "--eval", "each",
                      "--force", "--reason", "slurm test")
        assert changed.exit_code == 2, changed.output
        assert f"chain {first['chain']} ran tiny_eval_resume at " in changed.output, changed.output
        assert "resources.cpus 1 → 2" in changed.output, changed.output
        assert [r["attempt"] for r in json.loads(cli("jobs", "--json").stdout) if r["chain"] == first["chain"]] == [1]
        # No flags: the chain's own (--qos sub) are used, and --hold is this submission's.
        result = cli("submit", str(spec), "--resume", str(first["chain"]), "--hold", "--eval", "each",
                     "--force", "--reason", "slurm test")
        assert result.exit_code == 0, result.output
        assert (f"checkpoint step 100: scored already by eval job {scored['job']} of chain {first['chain']}, "
                "no new eval job") in result.output
        resumed = [r for r in json.loads(cli("jobs", "--json").stdout) if r["chain"] == first["chain"]
                   and r["attempt"] == 2]
        assert len(resumed) == 1, resumed
        attempt = _job(resumed[0]["job"])
        held.append(attempt.scheduler_id)
        assert attempt.qos == "sub"
        with session() as db:
            fresh = [j for j in db.exec(select(Job).where(Job.eval_of_chain == first["chain"]))
                     if j.id not in (scored["job"], unscored["job"])]
        assert [(j.eval_step, j.eval_after) for j in fresh] == [(200, attempt.scheduler_id)], fresh
        held.append(fresh[0].scheduler_id)
        assert f"eval job {fresh[0].id} (slurm {fresh[0].scheduler_id}) checkpoint step 200" in result.output
        line = sh("squeue", "-h", "-j", fresh[0].scheduler_id, "-o", "%T|%r|%E").strip()
        assert line.startswith(f"PENDING|Dependency|afterok:{attempt.scheduler_id}"), line
    finally:
        for scheduler_id in held:
            sh("scancel", scheduler_id, check=False)

"""Chains that drive themselves on the real local Slurm: every attempt is followed by its controller job
(``--dependency=afterany``) that runs ``idmctl sync --chain``. These tests never call sync: the controllers
classify, record, exclude and resubmit, and the tests only watch the store and Slurm."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from sqlmodel import select

from ground import contract
from ground.paths import clusters_dir
from idmctl.record.db import session
from idmctl.record.models import Chain, Failure, Job, NodeExclusion
from slurm_support import release_requeued, sh, text_so_far, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_home")]


@pytest.fixture
def controlled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """local-slurm with its controller on (and a 10 s hang floor, 1 s poll: tiny jobs hang fast)."""
    profile = yaml.safe_load((clusters_dir() / "local-slurm.yaml").read_text())
    profile["controller"] = {**profile["controller"], "enabled": True}
    profile["hang"] = {"k": 5, "floor": "10s", "poll": "1s"}
    path = tmp_path / "controlled.yaml"
    path.write_text(yaml.safe_dump(profile))
    monkeypatch.setenv(contract.ENV_CLUSTER, str(path))
    return path


def _submit(cli, *args: str) -> dict:
    result = cli("submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason", "controller test",
                 "--json", *args)
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _chain(chain_id: int) -> tuple[Chain, list[Job]]:
    with session() as db:
        chain = db.get(Chain, chain_id)
        jobs = list(db.exec(select(Job).where(Job.chain_id == chain_id).order_by(Job.attempt)).all())
        assert chain is not None
        return chain, jobs


def _ended(chain_id: int, *, release: str | None = None) -> Chain | None:
    if release:
        release_requeued(release)
    chain, _ = _chain(chain_id)
    return chain if chain.status != "ACTIVE" else None


def _controllers_left(chain_id: int) -> str:
    """squeue's controllers of this chain that have not finished (pending or running)."""
    return sh("squeue", "-h", "-n", f"idmctl-controller-{chain_id}", "-o", "%i %T", check=False).strip()


def _assert_controlled(jobs: list[Job]) -> None:
    """Every attempt was followed by a controller that ran and recorded its result; none is left waiting."""
    chain_id = jobs[0].chain_id or 0
    for job in jobs:
        assert job.controller and job.controller.get("scheduler_id"), (job.attempt, job.controller)

    def recorded() -> list[Job] | None:
        _, now = _chain(chain_id)
        return now if all((job.controller or {}).get("last_run") for job in now) else None

    # The last controller notes its own run after the sync it ran has ended the chain (a loaded run saw
    # the chain FAILED before attempt 2's controller had written last_run): wait for that note.
    for job in wait_until(recorded, 60, f"every controller of chain {chain_id} to record its run"):
        assert job.controller["last_run"].get("ok"), (job.attempt, job.controller)
    wait_until(lambda: _controllers_left(chain_id) == "", 30,
               f"chain {chain_id}'s last controller to finish and none to be left pending")


def test_a_crash_loop_stops_after_two_attempts_with_no_sync_from_the_test(cli, controlled: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Every attempt deadlocks before its first checkpoint; the job's watchdog kills it as `hang`.
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "stuck:5:0.2")
    first = _submit(cli, "--mem", "300MB", "--retries", "4", "-J", "crashloop")
    script = Path(first["script"]).parent / "controller-1.sbatch"
    assert f"--dependency=afterany:{first['scheduler_id']}" in script.read_text()
    chain = wait_until(lambda: _ended(first["chain"]), 150, f"chain {first['chain']} to stop by its controllers")
    chain, jobs = _chain(first["chain"])
    assert chain.status == "FAILED" and [j.attempt for j in jobs] == [1, 2], [(j.attempt, j.state) for j in jobs]
    assert chain.retries_used == 1  # one resubmission of the budget of 4
    with session() as db:
        causes = {f.job_id: f.cause for f in db.exec(select(Failure))}
    assert [causes[j.id] for j in jobs] == ["hang", "crash_loop"]
    _assert_controlled(jobs)
    listing = cli("jobs").output
    for job in jobs:  # `idmctl jobs` shows each attempt's controller and its last run
        assert re.search(rf"^job {job.id} \(chain {job.chain_id}/{job.attempt}\): controller job \d+ \(submitted .+\), "
                         r"last ran \S+: ", listing, re.M), listing
    result = cli("failures", "--cause", "crash_loop", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["job"] == jobs[1].scheduler_id and row["cause"] == "crash_loop"
    assert row["evidence"] == (f"crash loop: attempt 1 (job {jobs[0].scheduler_id}) hang at step none, then attempt 2 "
                               f"(job {jobs[1].scheduler_id}) hang at step none; newest committed checkpoint still step none")


@pytest.mark.slow
def test_a_node_failure_mid_training_is_resumed_and_the_chain_completes(cli, controlled: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    total = 20
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", f"steps:{total}:0.3")
    job = _submit(cli, "--mem", "300MB", "-J", "ctl-nodefail")
    run_dir = Path(job["script"]).parent
    wait_until(lambda: "entry: step 3" in text_so_far(Path(job["log"])), 60, "3 steps of training")
    failed = sh("squeue", "-h", "-j", job["scheduler_id"], "-o", "%N").strip()
    sh("scontrol", "update", f"NodeName={failed}", "State=DRAIN", "Reason=idmctl-test-node-fail")
    sh("scontrol", "update", f"NodeName={failed}", "State=DOWN", "Reason=idmctl-test-node-fail")
    try:
        chain = wait_until(lambda: _ended(job["chain"], release=job["scheduler_id"]), 150,
                           f"chain {job['chain']} to complete after {failed} failed")
    finally:
        sh("scontrol", "update", f"NodeName={failed}", "State=RESUME", check=False)
        wait_until(lambda: sh("sinfo", "-h", "-n", failed, "-o", "%T", check=False).strip() in ("idle", "mixed", "allocated"),
                   60, f"{failed} to return to service")
    chain, jobs = _chain(job["chain"])
    assert chain.status == "COMPLETED", [(j.attempt, j.state, j.log_tail) for j in jobs]
    runs = jobs[-1].runs
    assert runs[0]["state"] == "NODE_FAIL" and runs[-1]["state"] == "COMPLETED", runs
    with session() as db:
        assert failed in {e.node for e in db.exec(select(NodeExclusion))}  # the controller's sync excluded it
    resumed = [int(s) for s in re.findall(r"entry: resumed from step (\d+)", Path(jobs[-1].log_path).read_text())]
    assert resumed and resumed[0] >= 3
    assert int((run_dir / "steps_done.txt").read_text()) == total
    _assert_controlled(jobs)


@pytest.mark.slow
def test_a_preempted_attempt_is_requeued_by_slurm_resumes_and_its_chain_completes(cli, controlled: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A sub job preempted by core-own: Slurm requeues it (one chain, one job, its restarts and runs recorded
    by the controllers' syncs) and it resumes from its checkpoint, not step 0."""
    total = 24
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", f"steps:{total}:0.3")
    # Both want all of n1's CPUs: the core-own job runs only by preempting the sub job.
    low = _submit(cli, "--qos", "sub", "-c", "2", "--mem", "400MB", "--exclude", "n2", "-J", "ctl-low")
    wait_until(lambda: "entry: step 3" in text_so_far(Path(low["log"])), 60, "3 steps of the sub job")
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:2:0.2")
    high = _submit(cli, "--qos", "core-own", "-c", "2", "--mem", "400MB", "--exclude", "n2", "-J", "ctl-high")
    wait_until(lambda: _ended(high["chain"]), 120, f"the preempting chain {high['chain']} to complete")
    wait_until(lambda: _ended(low["chain"], release=low["scheduler_id"]), 150,
               f"the preempted chain {low['chain']} to resume and complete")
    chain, jobs = _chain(low["chain"])
    assert chain.status == "COMPLETED", [(j.attempt, j.state, j.log_tail) for j in jobs]
    assert len(jobs) == 1, [(j.attempt, j.state) for j in jobs]  # Slurm requeued it: no resubmission
    (low_job,) = jobs
    assert low_job.state == "COMPLETED", low_job.log_tail
    assert low_job.restarts >= 1
    runs = low_job.runs
    assert runs[0]["state"] in ("PREEMPTED", "REQUEUED") and runs[-1]["state"] == "COMPLETED", runs
    log = Path(low["log"]).read_text()
    resumed = [int(s) for s in re.findall(r"entry: resumed from step (\d+)", log)]
    assert resumed and resumed[0] >= 3, log[-2000:]  # from its checkpoint, not step 0
    assert int((Path(low["script"]).parent / "steps_done.txt").read_text()) == total
    assert f"entry: done {total} steps" in log
    _assert_controlled(jobs)
    high_jobs = _chain(high["chain"])[1]
    assert [j.state for j in high_jobs] == ["COMPLETED"], [(j.attempt, j.state, j.log_tail) for j in high_jobs]
    _assert_controlled(high_jobs)

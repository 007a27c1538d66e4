"""The retry policy is taxonomy.yaml's data: every cause there, and sync does exactly what it says.

Each cause has a sample outcome below (Slurm's record and log lines as the local cluster and the
trainer write them). The unit walk drives sync's decision function with every cause; the real walk
runs one job per cause through the local executor, syncs once and reads what sync did to each chain.
A cause added to the yaml without a sample here fails both walks.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import select

from ground import contract
from ground.errors import UserError
from idmctl.ops.executors.local import LocalExecutor
from idmctl.ops.failures.classify import ACTIONS, classify, get_cause, load_taxonomy
from idmctl.ops.retry import decide
from idmctl.record.db import session
from idmctl.record.models import Chain, Job, NodeExclusion

# cause → (state, exit code, log text, started). States are the local executor's (it reports exit 75
# as PREEMPTED, any other failure as FAILED), except queue_cancelled, which needs a job cancelled
# before it ever started.
SAMPLES: dict[str, tuple[str, str, str, bool]] = {
    "queue_cancelled": ("CANCELLED by 0", "0:0", "", False),
    "preempted": ("PREEMPTED", f"{contract.EXIT_REQUEUE}:0",
                  f"entry: checkpointed at step 3 on signal, exiting {contract.EXIT_REQUEUE}", True),
    "node_fail": ("FAILED", "1:0", "slurmstepd: error: *** JOB 57 ON n2 CANCELLED AT 2026-11-30T10:01:02 "
                                   "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", True),
    # The new causes' samples are lines of the failure corpus (tests/idmctl/ops/failure_corpus), as published:
    # huggingface/accelerate#1192 (issue body), NVIDIA/nccl-tests#252 (ismailguzel's comment), lyulyul/shine-cluster#30.
    "gpu_hardware": ("FAILED", "1:0", "RuntimeError: CUDA error: uncorrectable ECC error encountered", True),
    "network_fault": ("FAILED", "1:0", "kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from "
                                       "peer 10.0.35.1<49189> with error 4, opcode 5327, len 5327, vendor err 81 (Send)", True),
    "driver_mismatch": ("FAILED", "1:0", "Failed to initialize NVML: Driver/library version mismatch", True),
    "node_unfit": ("FAILED", f"{contract.EXIT_NODE_UNFIT}:0", f"{contract.FAILURE_MARKER} cause=node_unfit node=n2 "
                   "phase=stage check=shm shm_free_bytes=0 shm_need_bytes=4194304 stale_segments=3", True),
    "shm_enospc": ("FAILED", "1:0", "RuntimeError: unable to write to file </torch_1234_567_0>: "
                                    "No space left on device (28) /dev/shm", True),
    "hang": ("FAILED", f"{contract.EXIT_HANG}:0", f"{contract.FAILURE_MARKER} cause=hang node=n2 step=5 silent_s=31", True),
    # OFA-Sys/OFA#271 (JamesZhutheThird's comment)
    "collective_timeout": ("FAILED", "1:0", "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation "
                           "timeout: WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 "
                           "milliseconds before timing out.", True),
    "timeout": ("FAILED", "1:0", "slurmstepd: error: *** JOB 58 ON n1 CANCELLED AT 2026-11-30T10:01:02 "
                                 "DUE TO TIME LIMIT ***", True),
    "oom_host": ("FAILED", "1:0", "slurmstepd: error: Detected 1 oom_kill event in StepId=21.0. "
                                  "Some of the step tasks have been OOM Killed.", True),
    "stage_failed": ("FAILED", "1:0", "idmctl: stage-in FAILED (cp exit 1): cp: error writing "
                                      "'/scratch/cache/x.pt': No space left on device", True),
    "nan_loss": ("FAILED", f"{contract.EXIT_NAN}:0", f"{contract.FAILURE_MARKER} cause=nan_loss step=12", True),
    "oom_cuda": ("FAILED", "1:0", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
    # NOAA-EPIC/EAGLE#121 (issue body)
    "checkpoint_write_failed": ("FAILED", "1:0", "OSError: [Errno 122] Disk quota exceeded", True),
    # The build job's markers (trainers.build_job / the builders), as they print them.
    "disk_full": ("FAILED", "1:0", f"{contract.FAILURE_MARKER} cause={contract.CAUSE_DISK_FULL} path=/cache/"
                                   "5x32x32_rgb/.demo_3_s0.safetensors.tmp77: No space left on device", True),
    # ground.code_snapshot's lines, as the job script's verify step prints them.
    "env_changed": ("FAILED", f"{contract.EXIT_CODE_MISMATCH}:0", f"{contract.FAILURE_MARKER} cause={contract.CAUSE_ENV_CHANGED} "
                    "the Python environment changed since submit (/work/.venv): torch 2.13.0 → 2.14.0", True),
    "snapshot_modified": ("FAILED", f"{contract.EXIT_CODE_MISMATCH}:0", f"{contract.FAILURE_MARKER} "
                          f"cause={contract.CAUSE_SNAPSHOT_MODIFIED} the code in /h/code/snapshots/a60b is not the "
                          "admitted a60ba47465cff30c: edited trainers/model.py", True),
    "missing_weights": ("FAILED", "1:0", f"{contract.FAILURE_MARKER} cause={contract.CAUSE_MISSING_WEIGHTS} "
                                         "field=latent.vae: VAE weights directory /models/wan does not exist", True),
    "pt_norm_missing": ("FAILED", "1:0", f"{contract.FAILURE_MARKER} cause={contract.CAUSE_PT_NORM_MISSING} "
                                         "field=latent.pt_norm_path: FF needs the PT norm file", True),
    "loader_config": ("FAILED", "1:0", "ValueError: persistent_workers option needs num_workers > 0", True),
    "python_exception": ("FAILED", "1:0", "Traceback (most recent call last):\n"
                                          '  File "/home/team/idm/cache/dataset.py", line 568, in __init__\n'
                                          "TypeError: HiddenMultiLayer.__init__() got an unexpected keyword "
                                          "argument 'selected_layer_indices'", True),
    "cancelled": ("CANCELLED", "0:15", "", True),
    "unknown": ("FAILED", "7:0", "starting\nsomething odd happened", True),
}
NODE = "n2"


def test_every_cause_has_an_action_and_a_sample() -> None:
    # A cause named from the chain (crash_loop) has no rules: tests/idmctl/ops/test_crash_loop.py walks it.
    causes = [cause for cause in load_taxonomy() if not cause.from_chain]
    assert [cause.name for cause in causes] == list(SAMPLES)  # the yaml's order, no cause untested
    for cause in causes:
        assert cause.action in ACTIONS, cause.name
        state, exit_code, log, started = SAMPLES[cause.name]
        assert classify(state, exit_code=exit_code, log_tail=log, started=started).cause == cause.name


@pytest.mark.parametrize("name", list(SAMPLES))
def test_sync_decision_does_what_the_taxonomy_says(name: str) -> None:
    policy = get_cause(name)
    decision = decide(name, NODE, retries_left=5, earlier_for_cause=0)
    assert decision.cause == name
    if policy.action == "stop":
        assert (decision.action, decision.exclude_nodes, decision.extra_env) == ("stop", [], {})
        assert decision.why.endswith(f"fix: {policy.fix}")
        return
    assert decision.action == "retry"
    expected_env = {contract.ENV_ROLLBACK: "1"} if policy.action == "rollback" else {}
    assert decision.extra_env == expected_env
    if policy.action == "exclude_node_and_resume":
        assert decision.exclude_nodes == [NODE]
        assert decision.exclude_for == timedelta(seconds=policy.exclude_node_for_s or 0) > timedelta(0)
    else:
        assert (decision.exclude_nodes, decision.exclude_for) == ([], None)
    # Budgets: the chain's retries, then the cause's own max_per_chain.
    assert decide(name, NODE, retries_left=0).action == "stop"
    if policy.max_per_chain is not None:
        assert decide(name, NODE, 5, earlier_for_cause=policy.max_per_chain - 1).action == "retry"
        assert decide(name, NODE, 5, earlier_for_cause=policy.max_per_chain).action == "stop"
    else:
        assert decide(name, NODE, 5, earlier_for_cause=10).action == "retry"


def test_the_card_causes_keep_their_documented_actions() -> None:
    """What runbook.md promises; a change here is a change of policy, made in the yaml."""
    actions = {cause.name: cause.action for cause in load_taxonomy()}
    assert {name for name, action in actions.items() if action != "stop"} == {
        "preempted", "timeout", "node_fail", "node_unfit", "hang", "nan_loss",
        "gpu_hardware", "network_fault", "driver_mismatch", "collective_timeout", "checkpoint_write_failed"}
    assert (actions["node_fail"], get_cause("node_fail").exclude_node_for_s) == ("exclude_node_and_resume", 6 * 3600)
    assert (actions["nan_loss"], get_cause("nan_loss").max_per_chain) == ("rollback", 1)


def test_the_v2_causes_refine_older_ones_and_say_what_sync_does() -> None:
    """Taxonomy v2: each new cause narrows an older one and has the action its failure calls for: a node's
    fault leaves the node out (a broken driver for a day), a collective timeout leaves the suspect node out
    like a hang, a failed save is retried once and then stops."""
    v2 = {"gpu_hardware": ("node_fail", "exclude_node_and_resume", 24 * 3600, 3),
          "network_fault": ("node_fail", "exclude_node_and_resume", 6 * 3600, 3),
          "driver_mismatch": ("node_fail", "exclude_node_and_resume", 24 * 3600, 2),
          "collective_timeout": ("hang", "exclude_node_and_resume", 2 * 3600, 2),
          "checkpoint_write_failed": ("disk_full", "resume", None, 1)}
    for name, (refines, action, exclude_s, limit) in v2.items():
        cause = get_cause(name)
        assert (cause.refines, cause.action, cause.exclude_node_for_s, cause.max_per_chain) == \
            (refines, action, exclude_s, limit), name
        assert cause.meaning and cause.fix and cause.caught_by
    assert "admins" in get_cause("driver_mismatch").fix
    assert decide("checkpoint_write_failed", NODE, 5, earlier_for_cause=1).action == "stop"
    assert all(get_cause(name).refines is None for name in SAMPLES if name not in v2)


def test_refines_must_name_another_cause(tmp_path: Path) -> None:
    bad = tmp_path / "taxonomy.yaml"
    bad.write_text("causes:\n  - {name: x, meaning: m, fix: f, caught_by: none, action: stop, mlflow_status: FAILED,"
                   " refines: node_fial, rules: [{state: [FAILED]}]}\n"
                   "  - {name: unknown, meaning: m, fix: f, caught_by: none, action: stop, mlflow_status: FAILED, rules: []}\n")
    with pytest.raises(UserError) as raised:
        load_taxonomy(bad)
    assert raised.value.line().startswith(f"error: {bad}:causes[0].refines: refines 'node_fial' is not another cause")


@pytest.mark.parametrize("entry,error", [
    ("action: retry", "causes[0].action: action 'retry' is not one of resume, exclude_node_and_resume, rollback, stop"),
    ("action: stop, max_per_chain: 1", "causes[0].max_per_chain: max_per_chain 1 needs a retrying action"),
    ("action: exclude_node_and_resume", "causes[0].exclude_node_for: exclude_node_for goes with, and only with"),
    ("action: exclude_node_and_resume, exclude_node_for: soon", "causes[0].exclude_node_for: not a duration: 'soon'"),
    ("action: stop, from_chain: sometimes", "causes[0].from_chain: from_chain 'sometimes' needs true/false and no rules"),
])
def test_a_bad_policy_is_a_user_error(tmp_path: Path, entry: str, error: str) -> None:
    bad = tmp_path / "taxonomy.yaml"
    bad.write_text(f"causes:\n  - {{name: x, meaning: m, fix: f, caught_by: none, {entry}, mlflow_status: FAILED,"
                   " rules: []}\n")
    with pytest.raises(UserError) as raised:
        load_taxonomy(bad)
    assert raised.value.line().startswith(f"error: {bad}:{error}")


def _jobs_by_chain() -> dict[int, list[Job]]:
    with session() as db:
        chains: dict[int, list[Job]] = {}
        for job in db.exec(select(Job).order_by(Job.id)):
            chains.setdefault(job.chain_id or 0, []).append(job)
        return chains


def test_sync_obeys_the_taxonomy_for_real_jobs(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One local job per cause (all but queue_cancelled, which needs a job cancelled before it started),
    one sync: stopped chains end FAILED, resumed ones get attempt 2 with the cause as the retry reason,
    the rollback carries IDMCTL_ROLLBACK=1, and the node of a node failure is excluded."""
    executor = LocalExecutor()
    submitted: dict[str, dict] = {}
    for name, (state, exit_code, log, _) in SAMPLES.items():
        if name == "queue_cancelled":
            continue
        sample = tmp_path / f"{name}.json"
        sample.write_text(json.dumps({"log": log, "exit": int(exit_code.split(":")[0])}))
        behavior = "steps:600:0.1" if name == "cancelled" else f"emit:{sample}"
        monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", behavior)
        result = cli("submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason", "policy walk",
                     "--retries", "2", "--json")
        assert result.exit_code == 0, result.output + result.stderr
        submitted[name] = json.loads(result.stdout)
    executor.cancel(submitted["cancelled"]["scheduler_id"])  # a user's cancel of a running job
    for name, job in submitted.items():
        executor.wait(job["scheduler_id"], timeout_s=120)
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")  # what every resubmitted attempt does
    result = cli("sync", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    chains = _jobs_by_chain()
    with session() as db:
        exclusions = {(e.node, e.reason) for e in db.exec(select(NodeExclusion))}
        status = {chain.id: chain.status for chain in db.exec(select(Chain))}
    for name, job in submitted.items():
        policy = get_cause(name)
        jobs = chains[job["chain"]]
        first = jobs[0]
        assert first.state.split()[0] == SAMPLES[name][0], name
        excluded = (first.node_list, f"{name} under job {first.scheduler_id}") in exclusions
        assert excluded == (policy.action == "exclude_node_and_resume"), name
        if policy.action == "stop":
            assert (len(jobs), status[job["chain"]]) == (1, "FAILED"), name
            continue
        assert (len(jobs), status[job["chain"]]) == (2, "ACTIVE"), name
        script = Path(jobs[1].script_path or "").read_text()
        assert f"export {contract.ENV_RETRY_REASON}={name}:" in script.replace("'", ""), name
        assert (f"export {contract.ENV_ROLLBACK}=1" in script) == (policy.action == "rollback"), name
    for name, job in submitted.items():  # the resubmitted attempts run and complete their chains
        jobs = chains[job["chain"]]
        if len(jobs) == 2:
            executor.wait(jobs[1].scheduler_id or "", timeout_s=120)
    assert cli("sync").exit_code == 0
    with session() as db:
        done = {chain.id for chain in db.exec(select(Chain)) if chain.status == "COMPLETED"}
    assert done == {job["chain"] for name, job in submitted.items() if get_cause(name).action != "stop"}


def test_a_budget_of_the_yaml_holds_across_real_attempts(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nan_loss's max_per_chain: the first NaN gets its rollback attempt; the same NaN again stops the chain,
    with budget left in --retries."""
    limit = get_cause("nan_loss").max_per_chain
    assert limit == 1
    state, exit_code, log, _ = SAMPLES["nan_loss"]
    sample = tmp_path / "nan.json"
    sample.write_text(json.dumps({"log": log, "exit": int(exit_code.split(":")[0])}))
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", f"emit:{sample}")  # every attempt of this chain NaNs
    result = cli("submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason", "nan budget",
                 "--retries", "5", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    first = json.loads(result.stdout)
    executor = LocalExecutor()
    executor.wait(first["scheduler_id"], timeout_s=120)
    assert cli("sync").exit_code == 0
    jobs = _jobs_by_chain()[first["chain"]]
    assert len(jobs) == 2 and f"export {contract.ENV_ROLLBACK}=1" in Path(jobs[1].script_path or "").read_text()
    executor.wait(jobs[1].scheduler_id or "", timeout_s=120)
    result = cli("sync", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    stopped = json.loads(result.stdout)["stopped"]
    assert stopped == [[jobs[1].id, f"nan_loss: already resubmitted 1× for nan_loss in this chain (max_per_chain 1); "
                                     f"fix: {get_cause('nan_loss').fix}"]]
    with session() as db:
        chain = db.get(Chain, first["chain"])
        assert chain is not None and (chain.status, chain.retries_used) == ("FAILED", 1)
    assert len(_jobs_by_chain()[first["chain"]]) == 2

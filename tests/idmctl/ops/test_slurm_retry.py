"""Retries by cause (pure policy over real sacct-style records) and node exclusion in later scripts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ground.contract import ENV_ROLLBACK, FAILURE_MARKER
from idmctl.ops.failures.classify import classify
from idmctl.ops.retry import decide
from idmctl.record.db import session
from idmctl.record.models import NodeExclusion

TRACEBACK = """Traceback (most recent call last):
  File "/home/team/idm/cache/dataset.py", line 568, in __init__
TypeError: HiddenMultiLayer.__init__() got an unexpected keyword argument 'selected_layer_indices'
srun: error: n1: task 0: Exited with exit code 1"""


def _decide(state: str, exit_code: str = "0:0", log: str = "", retries_left: int = 5, rollbacks: int = 0,
            nodes: str | None = "n2"):
    """Classify a sacct-style record the way sync does, then decide (``rollbacks``: earlier NaNs in the chain)."""
    cause = None if state == "COMPLETED" else classify(state, exit_code=exit_code, log_tail=log, started=True).cause
    return decide(cause, nodes, retries_left, earlier_for_cause=rollbacks)


@pytest.mark.parametrize("state", ["PREEMPTED", "NODE_FAIL", "TIMEOUT"])
def test_resumable_causes_are_resubmitted_while_budget_lasts(state: str) -> None:
    assert _decide(state).action == "retry"
    assert _decide(state, retries_left=0).action == "stop"


def test_node_failure_excludes_the_node() -> None:
    decision = _decide("NODE_FAIL")
    assert (decision.cause, decision.exclude_nodes) == ("node_fail", ["n2"])
    assert _decide("PREEMPTED").exclude_nodes == []


def test_deterministic_python_error_is_never_retried() -> None:
    decision = _decide("FAILED", "1:0", TRACEBACK, retries_left=5)
    assert (decision.action, decision.cause) == ("stop", "python_exception")


@pytest.mark.parametrize("state,exit_code", [("OUT_OF_MEMORY", "0:125"), ("FAILED", "1:0")])
def test_out_of_memory_is_not_retried_blindly(state: str, exit_code: str) -> None:
    log = "slurmstepd: error: Detected 1 oom_kill event in StepId=21.0" if state == "FAILED" else ""
    decision = _decide(state, exit_code, log)
    assert (decision.action, decision.cause) == ("stop", "oom_host")


def test_nan_rolls_back_at_most_once() -> None:
    log = f"{FAILURE_MARKER} cause=nan_loss step=12"
    first = _decide("FAILED", "3:0", log, rollbacks=0)
    assert (first.action, first.extra_env) == ("retry", {ENV_ROLLBACK: "1"})
    assert _decide("FAILED", "3:0", log, rollbacks=1).action == "stop"


def test_completed_is_done_and_cancelled_stops() -> None:
    assert _decide("COMPLETED").action == "done"
    assert _decide("CANCELLED by 0").action == "stop"


def test_active_node_exclusions_land_in_the_next_script(cli) -> None:
    now = datetime.now(timezone.utc)
    with session() as db:
        db.add(NodeExclusion(node="n2", until=now + timedelta(hours=1), reason="node_fail under job 7"))
        db.add(NodeExclusion(node="n9", until=now - timedelta(minutes=1), reason="expired"))
    result = cli("submit", "quickstart", "--dry-run", "--exclude", "worker-5")
    assert result.exit_code == 0, result.stderr
    assert "#SBATCH --exclude=worker-5,n2\n" in result.output


def test_a_cluster_that_cancels_on_preemption_gets_a_free_resubmit() -> None:
    # Slurm's requeue spends no retry; sync standing in for it where the cluster cancels spends none either.
    cancelled = decide("preempted", "n1", retries_left=0, cluster_cancels=True)
    assert (cancelled.action, cancelled.spends_retry) == ("retry", False)
    assert decide("preempted", "n1", retries_left=0).action == "stop"  # a --no-requeue job on a requeueing cluster
    assert decide("timeout", "n1", retries_left=0, cluster_cancels=True).action == "stop"  # only preemption is Slurm's


@pytest.mark.parametrize("config, qos, partition, mode", [
    ("PreemptMode             = REQUEUE\nPreemptType             = preempt/qos", "requeue", None, "requeue"),
    ("PreemptMode             = REQUEUE\nPreemptType             = preempt/qos", "cancel", None, "cancel"),
    ("PreemptMode             = CANCEL\nPreemptType             = preempt/qos", "cluster", None, "cancel"),
    ("PreemptMode             = GANG,SUSPEND\nPreemptType             = preempt/qos", None, None, "suspend"),
    ("PreemptMode             = REQUEUE\nPreemptType             = preempt/partition_prio", "cancel",
     "PartitionName=sub Nodes=n1 PreemptMode=CANCEL State=UP", "cancel"),
    ("PreemptMode             = REQUEUE\nPreemptType             = preempt/partition_prio", None,
     "PartitionName=main Nodes=n[1-2] PreemptMode=REQUEUE", "requeue"),
    ("PreemptMode             = OFF\nPreemptType             = preempt/none", "cancel", None, "off"),
])
def test_preemption_mode_is_read_the_way_slurm_applies_it(config, qos, partition, mode) -> None:
    from idmctl.ops.executors.preempt_mode import mode_for

    assert mode_for(config, qos, partition) == mode

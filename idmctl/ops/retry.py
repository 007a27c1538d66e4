"""Retries by cause, not blindly (card A's ``sbmr 5`` retried whatever failed).

The policy is data: each cause's ``action`` (resume, exclude_node_and_resume, rollback, stop), its
``max_per_chain`` and ``exclude_node_for`` live in ``idmctl/ops/failures/taxonomy.yaml`` beside the
patterns that recognise it. This module only carries the policy out; it names no cause. It decides
from the record: the Failure rows sync has just written (classified once, as ``idmctl failures`` shows
them), so the table and the retry always agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from ground import contract
from ground.units import format_duration
from idmctl.core.job_state import JobState, is_failed
from idmctl.ops.failures.classify import get_cause
from idmctl.record.records import ChainRecord, JobRecord
from idmctl.record.store import JobStore


@dataclass(frozen=True)
class Decision:
    action: str
    """``done`` (completed), ``retry`` (resubmit into the chain) or ``stop`` (the chain ends)."""
    cause: str
    why: str
    exclude_nodes: list[str] = field(default_factory=list)
    exclude_for: timedelta | None = None
    """How long ``exclude_nodes`` stay out of later submissions (the cause's ``exclude_node_for``)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    spends_retry: bool = True
    """False where sync stands in for a requeue the cluster did not do (preemption mode CANCEL)."""


def node_exclusion_time(cause: str) -> timedelta:
    """The cause's ``exclude_node_for`` (zero for a cause that excludes no node)."""
    return timedelta(seconds=get_cause(cause).exclude_node_for_s or 0)


def decide(cause: str | None, node_list: str | None, retries_left: int, earlier_for_cause: int = 0,
           cluster_cancels: bool = False) -> Decision:
    """What to do after a job ended: ``cause`` None means it completed.

    ``retries_left`` is the chain's budget (0 under ``sync --no-retry``); ``earlier_for_cause`` counts
    the chain's earlier attempts that ended with this same cause (each was resubmitted once);
    ``cluster_cancels``: the cluster's preemption mode for the job is CANCEL, not REQUEUE.
    """
    if cause is None:
        return Decision("done", "completed", "finished")
    policy = get_cause(cause)
    if policy.action == "stop":
        return Decision("stop", cause, f"not retried (taxonomy action: stop); fix: {policy.fix}")
    exclude = [node_list] if policy.action == "exclude_node_and_resume" and node_list else []
    exclude_for = timedelta(seconds=policy.exclude_node_for_s) if exclude and policy.exclude_node_for_s else None
    if policy.max_per_chain is not None and earlier_for_cause >= policy.max_per_chain:
        return Decision("stop", cause, f"already resubmitted {earlier_for_cause}× for {cause} in this chain "
                                       f"(max_per_chain {policy.max_per_chain}); fix: {policy.fix}",
                        exclude_nodes=exclude, exclude_for=exclude_for)
    if policy.scheduler_requeues and cluster_cancels:
        return Decision("retry", cause, "the cluster cancels preempted jobs instead of requeueing them: resubmit "
                                        "in its place and resume from the chain's checkpoint", spends_retry=False)
    if retries_left <= 0:
        return Decision("stop", cause, "no retries left in the chain's budget (--retries)",
                        exclude_nodes=exclude, exclude_for=exclude_for)
    if policy.action == "rollback":
        return Decision("retry", cause, "roll back to the last good checkpoint and skip past the failing step",
                        extra_env={contract.ENV_ROLLBACK: "1"})
    why = "resubmit and resume from the chain's checkpoint"
    if exclude and exclude_for is not None:
        why = f"exclude {', '.join(exclude)} for {format_duration(exclude_for.total_seconds())}, then {why}"
    return Decision("retry", cause, why, exclude_nodes=exclude, exclude_for=exclude_for)


def decide_for_job(records: JobStore, job: JobRecord, chain: ChainRecord, retry: bool = True) -> Decision:
    """:func:`decide` for a stored job that reached a final state, from the record: its cause and its chain's
    earlier attempts' causes are the failures recorded with their ends (what ``idmctl failures`` shows, a
    cause corrected in the store included), never classified again from the logs here. An attempt not yet
    recorded is classified and recorded first."""
    from idmctl.ops.failures.postmortem import classify_end, recorded_causes, store_history  # here: decide() stays pure and light

    if job.state is JobState.COMPLETED:
        return decide(None, job.node_list, 0)
    earlier = [other for other in records.attempts(chain.id, before=job.attempt)
               if other.id != job.id and is_failed(other.state_text)]
    attempts = [job, *earlier]
    causes = recorded_causes(records.failures([other.id for other in attempts]))
    unrecorded = [other for other in attempts if other.id not in causes]
    if unrecorded:  # sync records every job that ends before deciding; this is for a chain recorded before it did
        # The chain's MLflow run is marked by the attempt that ended now, not by an older one: none is marked here.
        for other in unrecorded:
            for failure in classify_end(other, store_history(records, other)):
                records.record_failure(other.id, failure)
        causes = recorded_causes(records.failures([other.id for other in attempts]))
    cause = causes[job.id]
    same = sum(1 for other in earlier if causes.get(other.id) == cause)
    retries_left = chain.retries_budget - chain.retries_used if retry else 0
    cancels = retry and get_cause(cause).scheduler_requeues and job.executor == "slurm" and _cluster_cancels(job)
    return decide(cause, job.node_list, retries_left, same, cluster_cancels=cancels)


def _cluster_cancels(job: JobRecord) -> bool:
    """Whether preemption cancels this job's QoS/partition on its cluster (read now, from Slurm)."""
    from idmctl.ops.executors.preempt_mode import CANCEL, preempt_mode  # here: asks Slurm; only a cause it requeues

    partition = job.options.get("partition")
    return preempt_mode(job.qos, partition if isinstance(partition, str) else None) == CANCEL


def what_sync_does(cause: str) -> str:
    """One sentence of what sync does after a job ends with ``cause`` in a chain that has retries left (the
    taxonomy's policy in words, from :func:`decide` itself, so the sentence and the deed never differ)."""
    policy = get_cause(cause)
    if policy.action == "stop":
        return "stop: the chain ends FAILED (not retried: the same code and spec fail the same way)"
    decision = decide(cause, "the job's node", retries_left=1)
    limit = f"; at most {policy.max_per_chain}× for {cause} in one chain, then stop" if policy.max_per_chain else ""
    free = "; Slurm requeues it itself where the QoS's preemption requeues" if policy.scheduler_requeues else ""
    return f"{policy.action}: {decision.why}{limit}{free}"

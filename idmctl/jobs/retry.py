"""Retries by cause, not blindly (card A's ``sbmr 5`` retried whatever failed).

The cause comes from the failure classifier (``idmctl.failures.classify``, taxonomy as data); this
module only decides what to do about it:

- preempted, node failure, time limit: resubmit into the same chain; the trainer resumes from the
  chain's checkpoint. After a node failure the node is excluded from later submissions for a while.
- a deterministic error (Python exception, loader config, stage-in failure): never retried, even with
  budget left: the same code fails the same way.
- out of memory (host or GPU, /dev/shm): not retried blindly; the fix is a different spec.
- non-finite loss: one rollback to the last good checkpoint per chain, never more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from idmctl.failures.classify import classify

NODE_EXCLUSION_TIME = timedelta(hours=6)
"""How long a node that failed under a job is left out of later submissions."""
RESUME_CAUSES = {"preempted", "node_fail", "timeout"}
HARDWARE_CAUSES = {"node_fail"}
ROLLBACK_CAUSES = {"nan_loss"}


@dataclass(frozen=True)
class Decision:
    action: str
    """``done`` (completed), ``retry`` (resubmit into the chain) or ``stop`` (the chain ends)."""
    cause: str
    why: str
    exclude_nodes: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)


def decide(
    state: str,
    reason: str | None,
    exit_code: str | None,
    log_tail: str,
    node_list: str | None,
    started: bool,
    restarts: int,
    retries_left: int,
    rollbacks_used: int,
) -> Decision:
    """What to do after a job reached a final state."""
    if state == "COMPLETED":
        return Decision("done", "completed", "finished")
    classification = classify(state, reason=reason, exit_code=exit_code, log_tail=log_tail,
                              restarts=restarts, started=started)
    cause = classification.cause
    exclude = [node_list] if cause in HARDWARE_CAUSES and node_list else []
    if cause in ROLLBACK_CAUSES:
        if rollbacks_used >= 1:
            return Decision("stop", cause, "non-finite loss again after one rollback: not retried")
        if retries_left <= 0:
            return Decision("stop", cause, "non-finite loss; no retries left in the budget")
        return Decision("retry", cause, "non-finite loss: roll back to the last good checkpoint (once)",
                        extra_env={"IDMCTL_ROLLBACK": "1"})
    if cause in RESUME_CAUSES:
        if retries_left <= 0:
            return Decision("stop", cause, f"{cause}; no retries left in the budget", exclude_nodes=exclude)
        return Decision("retry", cause, f"{cause}: resubmit and resume from the chain's checkpoint",
                        exclude_nodes=exclude)
    if cause in ("oom_host", "oom_cuda", "shm_enospc"):
        return Decision("stop", cause, "out of memory: not retried blindly (raise --mem or shrink the batch/workers)")
    if cause == "cancelled" or cause == "queue_cancelled":
        return Decision("stop", cause, "cancelled: not retried")
    return Decision("stop", cause, f"{cause}: deterministic or unknown; retrying would fail the same way")

"""What a Slurm cluster does to a preempted job: requeue it, or cancel it.

Read from the cluster, not assumed: ``scontrol show config`` gives PreemptType and the cluster-wide
PreemptMode; under ``preempt/qos`` the job's QoS may set its own (``sacctmgr show qos``, "cluster"
meaning the cluster's), under ``preempt/partition_prio`` the partition's (``scontrol show
partition``). Where it cancels, sync resubmits the chain itself (taxonomy ``scheduler_requeues``).
"""

from __future__ import annotations

import re

from idmctl.ops.executors.slurm import _run

CANCEL = "cancel"
REQUEUE = "requeue"
OFF = "off"


def _setting(text: str, key: str) -> str | None:
    """``Key = Value`` (scontrol show config) or ``Key=Value`` (show partition) → value."""
    match = re.search(rf"(?:^|\s){re.escape(key)}\s*=\s*(\S+)", text, re.M)
    return match.group(1) if match else None


def parse_mode(value: str | None) -> str:
    """``REQUEUE`` / ``CANCEL`` / ``GANG,SUSPEND`` / ``OFF`` → the word that decides a preempted job's
    fate (GANG only adds time-slicing)."""
    words = [w for w in (value or "").lower().split(",") if w and w != "gang"]
    return words[0] if words else OFF


def mode_for(config: str, qos_mode: str | None, partition_text: str | None) -> str:
    """The effective mode from ``scontrol show config``, the QoS's PreemptMode and the partition's."""
    preempt_type = (_setting(config, "PreemptType") or "preempt/none").lower()
    if preempt_type.endswith("none"):
        return OFF
    cluster = _setting(config, "PreemptMode")
    if preempt_type.endswith("qos") and qos_mode and qos_mode.strip().lower() not in ("", "cluster"):
        return parse_mode(qos_mode)
    if preempt_type.endswith("partition_prio") and partition_text:
        return parse_mode(_setting(partition_text, "PreemptMode") or cluster)
    return parse_mode(cluster)


def preempt_mode(qos: str | None, partition: str | None = None) -> str:
    """What preemption does to a job of this QoS/partition on the current cluster (three CLI calls)."""
    config = _run(["scontrol", "show", "config"]).stdout
    qos_mode = None
    if qos:
        qos_mode = _run(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=PreemptMode"]).stdout.strip() or None
    partition_text = None
    if partition or "partition_prio" in config:
        args = ["scontrol", "-o", "show", "partition"] + ([partition] if partition else [])
        lines = _run(args).stdout.splitlines()
        default = [line for line in lines if "Default=YES" in line]
        partition_text = (default or lines or [""])[0] if not partition else "\n".join(lines)
    return mode_for(config, qos_mode, partition_text)

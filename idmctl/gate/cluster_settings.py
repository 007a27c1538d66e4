"""The cluster's own settings, read from ``scontrol show config`` and judged for what they mean to idmctl.

Administrators choose settings that change idmctl's arithmetic: whether a preempted job hears about it
before it is killed (and so whether a checkpoint on preemption exists at all), how long it has to save
(GraceTime, per QoS under ``preempt/qos``, per partition under ``preempt/partition_prio``), whether batch
jobs may be requeued, how long ``scontrol``/``squeue`` remember an ended job, whether scrontab is on, and
whether each job gets a private /tmp and /dev/shm. :func:`judge` is a pure function of the texts Slurm
prints, so it is tested on real outputs; :func:`read_cluster` asks the cluster (three calls).
"""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass

from ground.units import format_duration, parse_duration

OK, WARN = "OK", "WARN"
SIGNAL_FLOOR_S = 60.0
"""The smallest signal lead idmctl derives (idmctl.plan.limits.SIGNAL_FLOOR_S: Slurm checks limits on a
30 s timer): a GraceTime under it cannot be relied on to hold one step and one checkpoint write."""
SHORT_MIN_JOB_AGE_S = 60.0
"""Below this, an ended job leaves ``squeue`` before a sync a minute later can see it there; sync reads
sacct for ended jobs, so this only matters where accounting is off."""
CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Finding:
    """One setting, what it is set to on this cluster, and what that means for idmctl's jobs."""

    setting: str
    """The slurm.conf (or QoS/partition) setting, as Slurm names it."""
    status: str
    """OK: idmctl's plan holds; WARN: it holds only with the change the fix names."""
    meaning: str
    """What the value does to a job idmctl submits, in one line with the value and its unit."""
    fix: str = ""
    """What the administrators (or the spec) can do; empty when nothing is needed."""


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` → {key: value}. Values may hold spaces (``MinJobAge = 300 sec``); the
    trailing per-plugin blocks (``Cgroup Support Configuration:``) are read with the same rule."""
    settings: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*([A-Za-z][\w/.-]*)\s+=\s?(.*)$", line)
        if match and match.group(1) not in settings:
            settings[match.group(1)] = match.group(2).strip()
    return settings


def _words(value: str | None) -> set[str]:
    if not value or value.startswith("(null"):
        return set()
    return {word.strip().lower() for word in value.split(",") if word.strip()}


def _seconds(value: str | None) -> float | None:
    """``300 sec`` / ``00:00:10`` / ``10`` → seconds; None when Slurm prints nothing usable."""
    if value is None:
        return None
    text = value.strip().removesuffix("sec").strip()
    if not text or text.lower() in ("(null)", "n/a", "unlimited", "infinite"):
        return None
    if text.isdigit():
        return float(text)
    try:
        return parse_duration(text)
    except ValueError:
        return None


def signal_on_preemption(config: dict[str, str]) -> str | None:
    """The setting that makes Slurm send the job's own ``--signal`` (USR1) when preemption starts, or None."""
    if "send_user_signal" in _words(config.get("PreemptParameters")):
        return "PreemptParameters=send_user_signal"
    if "preempt_send_user_signal" in _words(config.get("SlurmctldParameters")):
        return "SlurmctldParameters=preempt_send_user_signal"
    return None


def parse_grace_times(sacctmgr_qos: str, partitions: str) -> dict[str, float]:
    """Grace times of the preemptible tiers: ``sacctmgr -n -P show qos format=Name,Preempt,GraceTime``
    (a QoS named in another's Preempt list can be preempted) and ``scontrol -o show partition``
    (``GraceTime=`` per partition, in seconds). Keys are ``qos NAME`` / ``partition NAME``."""
    graces: dict[str, float] = {}
    rows = [line.split("|") for line in sacctmgr_qos.splitlines() if line.count("|") >= 2]
    preemptible = {name.strip() for row in rows for name in row[1].split(",") if name.strip()}
    for row in rows:
        name, grace = row[0].strip(), _seconds(row[2])
        if name in preemptible:
            graces[f"qos {name}"] = grace or 0.0
    for line in partitions.splitlines():
        name = re.search(r"PartitionName=(\S+)", line)
        grace = re.search(r"GraceTime=(\S+)", line)
        mode = re.search(r"PreemptMode=(\S+)", line)
        if name and grace and mode and mode.group(1).upper() not in ("OFF", "GANG"):
            graces[f"partition {name.group(1)}"] = _seconds(grace.group(1)) or 0.0
    return graces


def _secs(seconds: float) -> str:
    """Grace times and leads are tens of seconds: ``10 s``, ``60 s``; longer ones as durations."""
    return f"{seconds:.0f} s" if seconds < 120 else format_duration(seconds)


def judge(config_text: str, sacctmgr_qos: str = "", partitions: str = "") -> list[Finding]:
    """Each setting that changes idmctl's arithmetic, with what its value means here."""
    config = parse_config(config_text)
    findings: list[Finding] = []
    # 25.11 prints `PreemptType = (null)` where older releases print preempt/none
    preempt_type = (config.get("PreemptType") or "preempt/none").lower().replace("(null)", "preempt/none")
    if preempt_type.endswith("none"):
        findings.append(Finding("PreemptType", OK, "preempt/none: no job is ever preempted here"))
    else:
        findings.extend(_preemption(config, preempt_type, parse_grace_times(
            sacctmgr_qos if preempt_type.endswith("qos") else "",
            partitions if preempt_type.endswith("partition_prio") else "")))
    findings.append(_requeue(config))
    findings.append(_min_job_age(config))
    findings.append(_scrontab(config))
    findings.append(_job_container(config))
    return findings


def _preemption(config: dict[str, str], preempt_type: str, graces: dict[str, float]) -> list[Finding]:
    mode = config.get("PreemptMode", "OFF")
    findings = [Finding("PreemptType", OK, f"{preempt_type}, PreemptMode={mode}: a preempted job is "
                        + ("requeued by Slurm" if "REQUEUE" in mode.upper() else
                           "cancelled, and sync resubmits it (spending none of the chain's retries)"
                           if "CANCEL" in mode.upper() else f"handled as {mode} (per tier where set)"))]
    signalled = signal_on_preemption(config)
    if signalled:
        findings.append(Finding("preemption notice", OK, f"{signalled}: the job's USR1 arrives when preemption "
                                "starts; the trainer checkpoints and the job script requeues itself"))
    else:
        findings.append(Finding(
            "preemption notice", WARN,
            "no send_user_signal: a preempted job's tasks get TERM, not its USR1, at the start of GraceTime (the "
            "batch script hears nothing until the kill): the trainer checkpoints and exits, and the job script, "
            "taking TERM for a cancel, ends the job FAILED 75 before Slurm could requeue it; the qos check FAILs "
            "a job on a preemptible tier whose time limit is longer than the tier's preempt cycle",
            "ask the admins for SlurmctldParameters=preempt_send_user_signal (Slurm ≥ 23.02: "
            "PreemptParameters=send_user_signal)"))
    for tier, grace in sorted(graces.items()):
        if grace <= 0:
            findings.append(Finding(f"GraceTime ({tier})", WARN,
                                    "0 s: a preempted job is killed at once; no checkpoint on preemption, each one "
                                    "loses the steps since the last periodic checkpoint",
                                    "ask for a GraceTime ≥ 60 s on this tier, or checkpoint often (train.checkpoint_every)"))
        elif grace < SIGNAL_FLOOR_S:
            findings.append(Finding(f"GraceTime ({tier})", WARN,
                                    f"{_secs(grace)} < idmctl's smallest signal lead "
                                    f"{_secs(SIGNAL_FLOOR_S)}: a checkpoint on preemption fits only when "
                                    f"(step + write) × 3 ≤ {_secs(grace)}",
                                    f"ask for a GraceTime ≥ {_secs(SIGNAL_FLOOR_S)} on this tier"))
        else:
            findings.append(Finding(f"GraceTime ({tier})", OK,
                                    f"{_secs(grace)}: a preempted job has that long to finish its step and "
                                    "write a checkpoint (preflight compares it with each spec's signal lead)"))
    return findings


def _requeue(config: dict[str, str]) -> Finding:
    value = config.get("JobRequeue", "1")
    if value.strip() == "0":
        return Finding("JobRequeue", OK, "0: batch jobs are not requeueable by default; idmctl's scripts ask "
                       "for --requeue themselves, so preemption and the self-requeue still work")
    return Finding("JobRequeue", OK, f"{value}: batch jobs may be requeued (preemption, the job's own requeue)")


def _min_job_age(config: dict[str, str]) -> Finding:
    age = _seconds(config.get("MinJobAge"))
    if age is None:
        return Finding("MinJobAge", OK, "not printed: squeue's memory of ended jobs is unknown; sync reads sacct")
    accounting = (config.get("AccountingStorageType") or "").lower()
    if age < SHORT_MIN_JOB_AGE_S and "slurmdbd" not in accounting:
        return Finding("MinJobAge", WARN, f"{format_duration(age)} and no slurmdbd: an ended job leaves squeue "
                       "before sync can read its end", "enable accounting (slurmdbd): sync reads sacct")
    return Finding("MinJobAge", OK, f"{format_duration(age)}: squeue/scontrol forget an ended job after this; "
                   "sync reads its end from sacct (accounting), not from squeue")


def _scrontab(config: dict[str, str]) -> Finding:
    if "enable" in _words(config.get("ScronParameters")):
        return Finding("ScronParameters", OK, "enable: `idmctl controller install` can keep its scrontab entry")
    return Finding("ScronParameters", OK, "not enable: scrontab is off, so `idmctl controller install` cannot keep "
                   "an entry here; the controller job after each attempt still keeps chains going")


def private_containers(config: dict[str, str]) -> list[str]:
    """The plugins that give each job a private /tmp and /dev/shm (``job_container/tmpfs``,
    ``namespace/linux``); empty where both are the node's."""
    values = (config.get("JobContainerType") or "", config.get("NamespaceType") or "")
    return [v for v in values if v and not v.lower().endswith(("/none", "(null)"))]


def private_tmp(slurm_cluster: str | None) -> str | None:
    """On the cluster a profile names (and only there): the plugin that makes /tmp private to each job, so a
    copy staged there is gone when the job ends; None where /tmp is the node's or Slurm does not answer."""
    if not slurm_cluster:
        return None
    config = parse_config(cluster_texts()[0])
    if config.get("ClusterName") != slurm_cluster:
        return None
    return " / ".join(private_containers(config)) or None


def _job_container(config: dict[str, str]) -> Finding:
    container = config.get("JobContainerType") or "job_container/none"
    private = private_containers(config)
    if private:
        return Finding("JobContainerType", OK, f"{' / '.join(private)}: each job has a private /tmp and /dev/shm: "
                       "stale segments of dead jobs never shrink the loader's shm, and a stage-in to /tmp is "
                       "copied again on every attempt (count it in the plan)")
    return Finding("JobContainerType", OK, f"{container}: /tmp and /dev/shm are the node's, shared by every job "
                   "on it (the node guard checks for stale segments)")


@dataclass(frozen=True)
class PreemptionNotice:
    """What a preempted job of one QoS gets on this cluster before it is killed."""

    signalled: bool
    """Its own ``--signal`` (USR1) arrives when preemption starts; else TERM at the start of GraceTime."""
    grace_s: float
    """GraceTime of the job's tier: the seconds between the first signal and the kill."""
    source: str
    """Which settings said so (``scontrol show config``, the QoS's or partition's GraceTime)."""


def preemption_notice(qos: str, partition: str | None = None) -> PreemptionNotice | None:
    """For a job of ``qos`` (on ``partition``): the notice the cluster gives at preemption, read from the
    cluster (three calls, once per process); None where Slurm does not answer here."""
    config_text, qos_text, partitions = cluster_texts()
    if not config_text.strip():
        return None
    config = parse_config(config_text)
    graces = parse_grace_times(qos_text if "qos" in (config.get("PreemptType") or "") else "",
                               partitions if "partition_prio" in (config.get("PreemptType") or "") else "")
    key = f"qos {qos}" if f"qos {qos}" in graces else f"partition {partition}" if partition else None
    grace = graces.get(key or "", 0.0)
    signalled = signal_on_preemption(config)
    return PreemptionNotice(signalled is not None, grace,
                            f"{signalled or 'no send_user_signal'}, GraceTime {_secs(grace)}"
                            + (f" ({key})" if key in graces else " (no grace for this tier)"))


@functools.cache
def cluster_texts() -> tuple[str, str, str]:
    """:func:`read_cluster`, once per process (a preflight of a sweep asks for every variant); a process that
    moves to another cluster calls ``cluster_texts.cache_clear()``."""
    return read_cluster()


def _ask(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout if out.returncode == 0 else ""


def read_cluster() -> tuple[str, str, str]:
    """(``scontrol show config``, ``sacctmgr show qos``, ``scontrol -o show partition``) from this cluster;
    an empty text where a call fails or takes longer than :data:`CALL_TIMEOUT_S`."""
    return (_ask(["scontrol", "show", "config"]),
            _ask(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,Preempt,GraceTime"]),
            _ask(["scontrol", "-o", "show", "partition"]))

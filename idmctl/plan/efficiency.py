"""The efficiency report of a job that ended: sacct's CPU, memory and time figures beside
the trainer's own (data-wait fraction, peak memory, GPU utilisation), and what the next submit of the
same experiment should ask for instead, with the numbers.

- CPU efficiency = TotalCPU ÷ (Elapsed × AllocCPUS), as ``seff`` computes it;
- memory efficiency = peak memory per node × nodes ÷ ReqMem (the job's total), where the peak is the
  largest step's MaxRSS × its tasks per node (MaxRSS is one task's peak, so this is an upper bound);
- elapsed against the time limit.

Sacct prints sizes in binary units (``2862M`` is MiB, ``360120K`` KiB) and CPU time as
``[D-][HH:]MM:SS[.mmm]``; both are parsed here. The report is kept on the job row (its ``efficiency``
column), logged to the chain's MLflow run and shown by ``idmctl jobs show``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ground.units import format_bytes, format_duration, slurm_time
from idmctl.core.job_state import JobState
from idmctl.record.stored_json import newest_efficiency
from ground.units import parse_bytes, parse_duration

HEADROOM = 1.25
"""Suggested memory and CPUs: the measured peak plus a quarter (a later batch, another node)."""
TIME_HEADROOM = 1.5
"""Suggested time limit for a job that completed: its elapsed time plus half."""
LOW, HIGH = 0.5, 0.9
"""Below LOW the job asked for twice what it used; above HIGH memory is near the cgroup's kill line."""
MEM_STEP = 64 * 2**20
_SIZE = re.compile(r"^([0-9.]+)([KMGTP]?)[nc]?$")
_POWERS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def slurm_bytes(text: str | None) -> int | None:
    """``2862M`` → 2862 MiB; sacct's K/M/G are binary; an old ``n``/``c`` suffix (per node/CPU) is dropped."""
    match = _SIZE.match((text or "").strip())
    return int(float(match.group(1)) * _POWERS[match.group(2)]) if match else None


def job_req_mem(text: str | None, nodes: int, alloc_cpus: int | None) -> int | None:
    """sacct's ReqMem as the job's total: 21.08 and later print the total; 20.11 and earlier a per-node
    (``4000Mn``) or per-CPU (``4000Mc``) figure, multiplied out here (per CPU unknown without AllocCPUS)."""
    text = (text or "").strip()
    size = slurm_bytes(text)
    if size is None or not text:
        return None
    if text.endswith("n"):
        return size * max(1, nodes)
    if text.endswith("c"):
        return size * alloc_cpus if alloc_cpus else None
    return size


def slurm_seconds(text: str | None) -> float | None:
    """``00:10.682`` (MM:SS.mmm), ``01:02:03``, ``1-02:03:04`` → seconds; ``UNLIMITED``/empty → None."""
    text = (text or "").strip()
    if not text or not text[0].isdigit():
        return None
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
    parts = [float(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    hours, minutes, seconds = parts[-3:]
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


@dataclass
class Suggestion:
    flag: str
    value: str
    why: str

    def line(self) -> str:
        return f"{self.flag} {self.value}: {self.why}"


@dataclass
class EfficiencyReport:
    job: str
    state: str
    elapsed_s: float | None = None
    limit_s: float | None = None
    alloc_cpus: int | None = None
    total_cpu_s: float | None = None
    req_mem_bytes: int | None = None
    peak_rss_bytes: int | None = None
    """Largest step's MaxRSS × that step's tasks per node."""
    peak_step: str | None = None
    nodes: int = 1
    cpu_eff: float | None = None
    mem_eff: float | None = None
    time_frac: float | None = None
    data_wait_frac: float | None = None
    trainer_peak_mem_bytes: int | None = None
    device: str | None = None
    gpu_util: float | None = None
    trainer_steps: int | None = None
    suggestions: list[Suggestion] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The report, one figure a line, each with its arithmetic."""
        out = []
        if self.cpu_eff is not None:
            out.append(f"CPU efficiency {self.cpu_eff:.0%}: TotalCPU {self.total_cpu_s:,.1f} s ÷ (Elapsed "
                       f"{self.elapsed_s:,.0f} s × {self.alloc_cpus} CPUs)")
        if self.mem_eff is not None:
            nodes = f" × {self.nodes} nodes" if self.nodes > 1 else ""
            out.append(f"memory efficiency {self.mem_eff:.0%}: peak {format_bytes(self.peak_rss_bytes or 0, True)} "
                       f"({self.peak_step}){nodes} ÷ ReqMem {format_bytes(self.req_mem_bytes or 0, True)}")
        elif self.req_mem_bytes:
            out.append(f"memory efficiency: no MaxRSS recorded (steps shorter than sacct's sampling); "
                       f"ReqMem {format_bytes(self.req_mem_bytes, True)}")
        if self.time_frac is not None:
            out.append(f"time used {self.time_frac:.0%}: Elapsed {format_duration(self.elapsed_s or 0)} of the "
                       f"{format_duration(self.limit_s or 0)} limit")
        if self.data_wait_frac is not None:
            out.append(f"data wait {self.data_wait_frac:.1%} of step time over {self.trainer_steps} steps (trainer)")
        if self.trainer_peak_mem_bytes:
            what = "GPU memory allocated" if self.device == "cuda" else "host RSS of rank 0"
            out.append(f"peak {what} {format_bytes(self.trainer_peak_mem_bytes)} (trainer)")
        if self.gpu_util is not None:
            out.append(f"GPU utilisation {self.gpu_util:.0%} (mean of NVML samples at log lines)")
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EfficiencyReport":
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["suggestions"] = [Suggestion(**s) for s in data.get("suggestions", [])]
        return cls(**values)


def report(job_label: str, run: dict[str, Any], options: dict[str, Any], trainer: Any | None) -> EfficiencyReport:
    """The report of one run (``Job.runs[-1]``: sacct's usage) with the trainer's totals
    (``ground.trainer_stats.RunStats`` or None) and the options the job was submitted with."""
    usage = run.get("usage") or {}
    result = EfficiencyReport(job=job_label, state=run.get("state") or "")
    result.elapsed_s = slurm_seconds(usage.get("Elapsed"))
    result.limit_s = slurm_seconds(usage.get("Timelimit"))
    result.total_cpu_s = slurm_seconds(usage.get("TotalCPU"))
    result.alloc_cpus = int(usage["AllocCPUS"]) if usage.get("AllocCPUS", "").isdigit() else None
    result.nodes = int(usage["NNodes"]) if usage.get("NNodes", "").isdigit() else 1
    result.req_mem_bytes = job_req_mem(usage.get("ReqMem"), result.nodes, result.alloc_cpus)
    for step, values in (run.get("step_usage") or {}).items():
        rss = slurm_bytes(values.get("MaxRSS"))
        if not rss:
            continue
        tasks = int(values["NTasks"]) if values.get("NTasks", "").isdigit() else 1
        nodes = int(values["NNodes"]) if values.get("NNodes", "").isdigit() else 1
        per_node = rss * math.ceil(tasks / max(1, nodes))
        if result.peak_rss_bytes is None or per_node > result.peak_rss_bytes:
            result.peak_rss_bytes = per_node
            result.peak_step = f"MaxRSS of {step} {format_bytes(rss, True)} × {math.ceil(tasks / max(1, nodes))} task/node"
    ranks = int(options.get("ranks_per_node") or 1)
    if not result.peak_rss_bytes and trainer is not None and trainer.host_peak_rss_bytes:
        # sacct samples MaxRSS every JobAcctGatherFrequency (30 s by default): a shorter step has none.
        result.peak_rss_bytes = trainer.host_peak_rss_bytes * ranks
        result.peak_step = (f"no MaxRSS from sacct; the trainer's VmHWM {format_bytes(trainer.host_peak_rss_bytes, True)} "
                            f"× {ranks} rank/node")
    if result.elapsed_s and result.alloc_cpus and result.total_cpu_s is not None:
        result.cpu_eff = result.total_cpu_s / (result.elapsed_s * result.alloc_cpus)
    if result.peak_rss_bytes and result.req_mem_bytes:
        # ReqMem is the job's total (all nodes); the peak is per node: compare like with like.
        result.mem_eff = result.peak_rss_bytes * result.nodes / result.req_mem_bytes
    if result.elapsed_s is not None and result.limit_s:
        result.time_frac = result.elapsed_s / result.limit_s
    if trainer is not None:
        result.data_wait_frac = trainer.data_wait_frac
        result.trainer_peak_mem_bytes = trainer.peak_mem_bytes or None
        result.device, result.gpu_util, result.trainer_steps = trainer.device, trainer.gpu_util, trainer.steps
    result.suggestions = suggest(result, options)
    return result


def suggest(found: EfficiencyReport, options: dict[str, Any]) -> list[Suggestion]:
    """--mem / -c / --time for the next submit, only where the job was far off (below LOW, above HIGH)."""
    out: list[Suggestion] = []
    if found.mem_eff is not None and found.peak_rss_bytes and (found.mem_eff < LOW or found.mem_eff > HIGH):
        mem = math.ceil(found.peak_rss_bytes * HEADROOM / MEM_STEP) * MEM_STEP
        out.append(Suggestion("--mem", f"{mem // 2**20}MiB",
                              f"peak {format_bytes(found.peak_rss_bytes, True)} × {HEADROOM} headroom; job {found.job} "
                              f"asked {format_bytes(found.req_mem_bytes or 0, True)} and used {found.mem_eff:.0%}"))
    ranks = int(options.get("ranks_per_node") or 1)
    if found.cpu_eff is not None and found.alloc_cpus and found.elapsed_s:
        busy_per_node = (found.total_cpu_s or 0.0) / found.elapsed_s / max(1, found.nodes)
        per_node = found.alloc_cpus // max(1, found.nodes)
        arithmetic = (f"TotalCPU ÷ Elapsed = {busy_per_node:.2f} cores busy per node of {per_node}; "
                      f"CPU efficiency {found.cpu_eff:.0%}")
        if found.cpu_eff < LOW:
            cpus = max(ranks, math.ceil(busy_per_node * HEADROOM))
            if cpus < per_node:
                out.append(Suggestion("-c", str(cpus), f"{arithmetic} (× {HEADROOM} headroom, ≥ {ranks} ranks)"))
        elif found.cpu_eff > HIGH and (found.data_wait_frac or 0.0) > 0.2:
            out.append(Suggestion("-c", str(per_node * 2), f"{arithmetic} and the steps waited "
                                                            f"{found.data_wait_frac:.0%} for data: the loader is CPU-bound"))
    if found.elapsed_s and found.limit_s and found.state == JobState.COMPLETED and (found.time_frac or 0) < LOW:
        limit = max(300.0, math.ceil(found.elapsed_s * TIME_HEADROOM / 60) * 60)
        out.append(Suggestion("--time", slurm_time(limit),
                              f"completed in {format_duration(found.elapsed_s)} × {TIME_HEADROOM} (at least 5 min); "
                              f"asked {format_duration(found.limit_s)}, used {found.time_frac:.0%} (a shorter limit "
                              "backfills sooner)"))
    elif JobState.of(found.state) is JobState.TIMEOUT and found.limit_s:
        out.append(Suggestion("--time", slurm_time(found.limit_s * 2),
                              f"hit its {format_duration(found.limit_s)} limit; or let the chain resume from checkpoints"))
    return out


def last_report(experiment: str) -> EfficiencyReport | None:
    """The newest efficiency report of ``experiment``'s jobs (plain sqlite3: submit imports no ORM)."""
    data = newest_efficiency(experiment)
    return EfficiencyReport.from_dict(data) if data else None


def still_apply(found: EfficiencyReport, options: dict[str, Any]) -> list[Suggestion]:
    """The report's suggestions the job being submitted has not taken already."""

    current = {"--mem": parse_bytes(options.get("mem") or "0"), "-c": int(options.get("cpus_per_node") or 0),
               "--time": parse_duration(options.get("time_limit") or "0")}
    parse = {"--mem": parse_bytes, "-c": int, "--time": parse_duration}
    return [s for s in found.suggestions if s.flag not in parse or parse[s.flag](s.value) != current[s.flag]]

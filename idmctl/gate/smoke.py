"""Check ``smoke``: the real trainer code, in a subprocess with a timeout, builds the real dataset,
loads a sample, builds the real model and runs 3 optimizer steps at batch 2 on one device. PASS
needs finite losses. Card A: dataset 23 s, sample 0.7 s, model 39 s, peak 5.46 GB, loss 1.62 → 1.14 —
the one-minute check that would have caught jobs 6262 and 6321 before a 2 h stage.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from ground import contract
from ground.paths import atomic_write_text
from idmctl.plan.budget import fmt_seconds
from idmctl.core.checks import CheckResult, PreflightContext, SmokeMeasurement, Status
from idmctl.gate.tracebacks import last_frame_and_exception
from ground.spec.loader import ResolvedSpec
from ground.units import format_bytes
from ground.code_snapshot import default_store, materialize
from idmctl.gate import box
from idmctl.gate.entry_smoke import out_of_domain, run_entry_smoke

NAME = "smoke"
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_ENTRY = contract.DEFAULT_ENTRY
"""idmctl's own trainer is smoked through ``trainers.smoke`` (the same factories)."""
def _report_from_stdout(stdout: str) -> dict | None:
    """The smoke prints one JSON object; take the last line that parses as one."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def run_smoke(resolved: ResolvedSpec, timeout_s: float = DEFAULT_TIMEOUT_S, entry: str = DEFAULT_ENTRY) -> SmokeMeasurement:
    """The job's entry for a few steps: idmctl's trainer through ``python -m trainers.smoke --spec-json
    FILE`` (its own factories, timed part by part), any other entry under the entry contract
    (``entry_smoke``). Both run from a snapshot of the code, the very one submit will hand the job."""
    if entry != DEFAULT_ENTRY:
        from dataclasses import replace

        return replace(run_entry_smoke(resolved, entry, timeout_s), entry=entry)
    from idmctl.job.code import tree_for  # start-up: 11 more project modules only this path needs

    started = time.perf_counter()
    directory = materialize(tree_for(resolved.spec), default_store())
    with tempfile.TemporaryDirectory(prefix="idmctl_smoke_") as tmp:
        spec_file = Path(tmp) / f"{resolved.name}.json"
        atomic_write_text(spec_file, resolved.canonical_json)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))}
        # In the box (idmctl.gate.box): its own session, bounded output, everything it started ended with it.
        done = box.command([sys.executable, "-m", "trainers.smoke", "--spec-json", str(spec_file)],
                           env=env, cwd=directory, deadline_s=timeout_s)
        if done.timed_out:
            return SmokeMeasurement(ok=False, error=f"timed out after {timeout_s:.0f} s", wall_s=time.perf_counter() - started)
    wall = time.perf_counter() - started
    report = _report_from_stdout(done.stdout)
    # A report means the smoke ran to the end (it exits 1 on non-finite losses, which check() judges).
    if report is None:
        error = last_frame_and_exception(done.stderr or done.stdout)
        fact = f"exit {done.returncode}" if (done.returncode or 0) >= 0 else box.ended(done.returncode or 0)
        return SmokeMeasurement(ok=False, error=f"{fact}: {error}", wall_s=wall)
    return measured(report, wall)


def measured(report: dict, wall: float, where: str | None = None) -> SmokeMeasurement:
    """``trainers.smoke``'s report as the smoke measurement, each figure judged against its domain first
    (wherever the smoke ran: this host, or a job on the cluster)."""
    why = out_of_domain({k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    if why is not None:
        return SmokeMeasurement(ok=False, error=f"the smoke's report holds a figure outside its domain: {why}",
                                wall_s=wall, where=where)
    return SmokeMeasurement(
        ok=True, losses=[float(x) for x in report.get("losses", [])], device=str(report.get("device", "cpu")),
        batch_size=int(report.get("batch_size", 2)), dataset_s=report.get("dataset_s"), sample_s=report.get("sample_s"),
        model_s=report.get("model_s"), step_s=report.get("step_s"), peak_mem_bytes=report.get("peak_mem_bytes"),
        params=report.get("params"), wall_s=wall, checkpoint_s=report.get("checkpoint_s"),
        checkpoint_bytes=report.get("checkpoint_bytes"), loader_cpu_s_per_gb=report.get("loader_cpu_s_per_gb"),
        loader_direct_cpu_s_per_gb=report.get("loader_direct_cpu_s_per_gb"),
        where=where,
    )


def _timings(smoke: SmokeMeasurement) -> str:
    parts = []
    for label, value in (("dataset", smoke.dataset_s), ("sample", smoke.sample_s), ("model", smoke.model_s)):
        if value is not None:
            parts.append(f"{label} {fmt_seconds(value)}")
    if smoke.step_s is not None:
        parts.append(f"{fmt_seconds(smoke.step_s)}/step")
    if smoke.peak_mem_bytes is not None:
        parts.append(f"peak {format_bytes(smoke.peak_mem_bytes)}")
    if smoke.checkpoint_s is not None and smoke.checkpoint_bytes:
        parts.append(f"checkpoint {format_bytes(smoke.checkpoint_bytes)} in {fmt_seconds(smoke.checkpoint_s)}")
    if smoke.params is not None:
        parts.append(f"{smoke.params / 1e6:.1f}M params" if smoke.params >= 1e6 else f"{smoke.params:,} params")
    return ", ".join(parts)


def check(ctx: PreflightContext) -> CheckResult:
    smoke = ctx.measurements.smoke
    if smoke is None:
        return CheckResult(NAME, Status.SKIP, "not run (--no-smoke): a static-only preflight cannot unlock submit",
                           {}, "run `idmctl preflight EXP` without --no-smoke")
    numbers = smoke.as_dict()
    if not smoke.ok:
        who = f"the job's entry {smoke.entry!r}" if smoke.entry else "the real trainer"
        again = (f"`IDMCTL_SMOKE_STEPS=3 IDMCTL_RUN_DIR=DIR {smoke.entry}` from its root" if smoke.entry
                 else "`python -m trainers.smoke --spec-json FILE`")
        return CheckResult(NAME, Status.FAIL, f"{who} failed after {smoke.wall_s:.1f} s: {smoke.error}",
                           numbers, f"fix the error above; reproduce with {again}")
    if not smoke.losses or not all(math.isfinite(loss) for loss in smoke.losses):
        shown = ", ".join(f"{loss:.4g}" for loss in smoke.losses) or "none"
        return CheckResult(NAME, Status.FAIL, f"losses not finite on {smoke.device}: {shown}", numbers,
                           "look for NaN/inf in the inputs or lower the learning rate")
    trend = " → ".join(f"{loss:.3g}" for loss in smoke.losses)
    device = f"{smoke.device} of {smoke.where}" if smoke.where else smoke.device
    summary = (f"{len(smoke.losses)} steps at batch {smoke.batch_size} on {device}, finite losses {trend}; "
               f"{_timings(smoke)} (wall {smoke.wall_s:.1f} s)")
    res = ctx.spec.resources
    if smoke.device == "cpu" and res.gpus_per_node > 0:
        summary += (f"; measured on this host's CPU, which has no GPU: the step time does not stand for the "
                    f"job's {res.gpus_per_node} GPU(s) per node")
    if smoke.device == "cpu" and res.gpus_per_node == 0 and smoke.peak_mem_bytes:
        # The smoke's batch is at most the job's, so its peak is a lower bound per rank: if even that
        # overflows --mem, the job is OOM-killed (cause oom_host).
        need = smoke.peak_mem_bytes * res.ranks_per_node
        if need > res.mem_bytes:
            return CheckResult(NAME, Status.FAIL,
                               f"{summary}; host memory: peak {format_bytes(smoke.peak_mem_bytes)} × {res.ranks_per_node} "
                               f"ranks = {format_bytes(need)} > resources.mem {res.mem} → OOM kill", numbers,
                               f"raise resources.mem above {format_bytes(need)} or lower the batch/model size")
    return CheckResult(NAME, Status.PASS, summary, numbers)

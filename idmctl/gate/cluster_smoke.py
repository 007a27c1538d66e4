"""The smoke where the GPUs are: ``idmctl preflight EXP --smoke-on cluster``.

A login node often has no GPU, so the smoke it runs measures the CPU and every plan says "compute
unmeasured". Here the very smoke ``run_smoke`` runs (``python -m trainers.smoke`` from the code snapshot
submit will hand the job) goes to the cluster as a short job on the profile's smoke QoS/partition, one
node and the job's own device kind, and its report is the smoke: the plan then counts measured compute,
and the record says on which node and job it was measured.

It waits for the job with a deadline (pending included): a smoke job that never starts, fails or runs
out of time is a FAIL with the job's id, partition and log tail; nothing else is recorded.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ground.paths import atomic_write_text, home
from ground.spec.loader import ResolvedSpec
from idmctl.core.checks import SmokeMeasurement
from idmctl.core.job_state import is_terminal
from idmctl.core.profile import ClusterProfile, SmokeJob
from idmctl.gate.smoke import DEFAULT_ENTRY, _report_from_stdout, measured
from idmctl.gate.tracebacks import last_frame_and_exception

CALL_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 8


def _sh(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=CALL_TIMEOUT_S)


def _state(job_id: str) -> tuple[str, str]:
    """(state, node or pending reason) from squeue while queued, sacct after."""
    queued = _sh(["squeue", "-h", "-j", job_id, "-o", "%T|%R"]).stdout.strip()
    if queued:
        state, _, where = queued.partition("|")
        return state, where
    ended = _sh(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,NodeList"]).stdout.strip().splitlines()
    if not ended:
        return "UNKNOWN", ""
    state, _, node = ended[0].partition("|")
    return state.split()[0], node


def _tail(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"


def smoke_on_cluster(resolved: ResolvedSpec, profile: ClusterProfile, deadline_s: float,
                     entry: str = DEFAULT_ENTRY) -> SmokeMeasurement:
    """``preflight --smoke-on cluster``: the smoke on the profile's ``smoke_job``, from a snapshot in the
    profile's code store (which every node mounts)."""
    from ground.code_snapshot import materialize
    from idmctl.job.code import store_for, tree_for  # start-up: 11 more project modules only this path needs

    if profile.scheduler != "slurm":
        return SmokeMeasurement(ok=False, error=f"--smoke-on cluster needs a Slurm profile ({profile.name} runs jobs "
                                                "on this host): drop --smoke-on, or set IDMCTL_CLUSTER")
    if entry != DEFAULT_ENTRY:
        return SmokeMeasurement(ok=False, entry=entry,
                                error="--smoke-on cluster runs idmctl's trainer smoke; a team entry's smoke runs on "
                                      "this host: drop --smoke-on")
    code_dir = materialize(tree_for(resolved.spec), store_for(profile))
    return run_smoke_on_cluster(resolved, profile.smoke_job, deadline_s, code_dir=code_dir)


def run_smoke_on_cluster(resolved: ResolvedSpec, job: SmokeJob, deadline_s: float, *, code_dir: Path,
                         extra_sbatch: list[str] | None = None, poll_s: float = 2.0) -> SmokeMeasurement:
    """The smoke of ``resolved`` as a one-node Slurm job from ``code_dir`` (a code snapshot every node
    sees), waited for at most ``deadline_s``. ``extra_sbatch`` is for tests (a begin time in the future)."""
    started = time.perf_counter()
    folder = home() / "smokes" / f"{resolved.name}-{os.getpid()}-{int(time.time())}"
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / f"{resolved.name}.json"
    atomic_write_text(spec_file, resolved.canonical_json)
    log = folder / "smoke.out"
    command = (f"cd {shlex.quote(str(code_dir))} && PYTHONPATH={shlex.quote(str(code_dir))} exec "
               f"{shlex.quote(sys.executable)} -m trainers.smoke --spec-json {shlex.quote(str(spec_file))}")
    args = ["sbatch", "--parsable", "-J", f"idmctl-smoke-{resolved.name}", "-N", "1", "-n", "1", "-c", str(job.cpus),
            f"--mem={job.mem}", f"--time={job.time_limit}", "-o", str(log)]
    args += [f"--gres=gpu:{job.gpus}"] if job.gpus else []
    args += [f"--qos={job.qos}"] if job.qos else []
    args += [f"--partition={job.partition}"] if job.partition else []
    where = f"partition {job.partition}" if job.partition else "the default partition"
    submitted = _sh([*args, *(extra_sbatch or []), "--wrap", command])
    if submitted.returncode != 0:
        words = (submitted.stderr or submitted.stdout).strip().splitlines()
        return SmokeMeasurement(ok=False, error=f"the smoke job was refused in {where}: {words[-1] if words else ''}",
                                wall_s=time.perf_counter() - started, where=f"Slurm, {where}")
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + deadline_s
    state, detail = _state(job_id)
    while not is_terminal(state) and time.monotonic() < deadline:
        time.sleep(poll_s)
        state, detail = _state(job_id)
    wall = time.perf_counter() - started
    if not is_terminal(state):
        _sh(["scancel", job_id])
        return SmokeMeasurement(ok=False, wall_s=wall, where=f"Slurm job {job_id}, {where}",
                                error=f"smoke job {job_id} not done after {deadline_s:.0f} s in {where} "
                                      f"({state} {detail}); cancelled")
    text = log.read_text(errors="replace") if log.exists() else ""
    report = _report_from_stdout(text)
    here = f"Slurm job {job_id} on {detail or '?'} ({where})"
    # A report means the smoke ran to the end (it exits 1 on non-finite losses, which the check judges).
    if report is None:
        error = last_frame_and_exception(text) if "Traceback" in text else _tail(log)
        return SmokeMeasurement(ok=False, wall_s=wall, where=here, error=f"smoke job {job_id} ended {state}: {error}")
    return measured(report, wall, where=here)

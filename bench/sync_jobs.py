"""Sync of many jobs: ``idmctl sync`` over 1,000 recorded unfinished jobs on the local Slurm cluster.

Counts the Slurm commands it runs (a shim directory first on PATH logs each call, then execs the real
binary) and times it against the naive way: one ``sacct -j ID`` per job, extrapolated from a few calls.
``python -m bench.sync_jobs [--fast]`` prints the figures as a dict.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import Figure, print_figures
from ground.contract import ENV_HOME

SLURM_TOOLS = ("sacct", "squeue", "scontrol", "sbatch", "scancel", "sinfo")


def make_counting_shim(directory: Path) -> Path:
    """Write one script per Slurm tool that appends its name to ``directory/calls`` and execs the real one."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "calls"
    for tool in SLURM_TOOLS:
        real = shutil.which(tool)
        if real is None:
            continue
        shim = directory / tool
        shim.write_text(f'#!/bin/sh\necho {tool} >> "{log}"\nexec {real} "$@"\n')
        shim.chmod(0o755)
    return log


def count_calls(log: Path) -> Counter[str]:
    return Counter(log.read_text().split()) if log.exists() else Counter()


def known_job_ids(limit: int) -> list[str]:
    """Ids of jobs slurmdbd already holds (so sacct really answers for them)."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-S", "2020-01-01", "--format=JobID"],
                         capture_output=True, text=True, timeout=60).stdout.split()
    return [i for i in out if i.isdigit()][-limit:]


def populate(n_jobs: int, real_ids: list[str]) -> None:
    """``n_jobs`` RUNNING slurm jobs in the store of ``$IDMCTL_HOME``: the real ids first, then ids
    Slurm has never seen (as if sacct lagged), so both the sacct and the squeue path are exercised."""
    from idmctl.record.db import session
    from idmctl.record.models import Job

    ids = real_ids[:n_jobs] + [str(9_000_000 + i) for i in range(n_jobs - len(real_ids[:n_jobs]))]
    with session() as db:
        db.add_all(Job(experiment="bench_sync", executor="slurm", scheduler_id=i, state="RUNNING") for i in ids)


def _one_sync(n_jobs: int, real_ids: list[str]) -> tuple[float, Counter[str]]:
    from idmctl.ops.sync import sync

    with tempfile.TemporaryDirectory(prefix="idmctl-bench-sync-") as tmp:
        os.environ[ENV_HOME] = str(Path(tmp) / "home")
        populate(n_jobs, real_ids)
        log = make_counting_shim(Path(tmp) / "shim")
        old_path = os.environ["PATH"]
        os.environ["PATH"] = f"{log.parent}:{old_path}"
        try:
            start = time.perf_counter()
            report = sync()
            seconds = time.perf_counter() - start
        finally:
            os.environ["PATH"] = old_path
        assert report.checked >= min(len(real_ids), n_jobs)
        return seconds, count_calls(log)


def run(fast: bool = False) -> list[Figure] | str:
    if not os.environ.get("SLURM_CONF") or shutil.which("sacct") is None:
        return "not measured: no local Slurm cluster (scripts/slurm/up.sh, then source its env file)"
    n_jobs, repeats = (200, 1) if fast else (1000, 3)
    real_ids = known_job_ids(n_jobs)
    saved_home = os.environ.get(ENV_HOME)
    try:
        results = [_one_sync(n_jobs, real_ids) for _ in range(repeats)]
    finally:
        if saved_home is None:
            os.environ.pop(ENV_HOME, None)
        else:
            os.environ[ENV_HOME] = saved_home
    per_job = []
    for job_id in (real_ids or ["1"])[:3]:
        start = time.perf_counter()
        subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "--format=JobID,State"], capture_output=True, timeout=60)
        per_job.append((time.perf_counter() - start) * n_jobs)
    calls = results[0][1]
    return [
        Figure(f"idmctl sync of {n_jobs} unfinished jobs ({len(real_ids)} known to sacct)", "s",
               [seconds for seconds, _ in results], reference_name=f"one sacct call per job × {n_jobs} (extrapolated)",
               reference_samples=per_job, target="a bounded number of Slurm calls, whatever the job count",
               note=f"Slurm calls per sync: {dict(calls)} = {sum(calls.values())}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true")
    print_figures(run(parser.parse_args().fast))


if __name__ == "__main__":
    main()


# -- bench.run adapter: Slurm calls per sync as a count figure beside the
# seconds, against the naive loop's one sacct call per job. -----------------------------------------

_calls_per_sync: list[int] = []
_timed_sync = _one_sync
_seconds_figures = run


def _one_sync(n_jobs: int, real_ids: list[str]) -> tuple[float, Counter[str]]:  # type: ignore[no-redef]
    seconds, calls = _timed_sync(n_jobs, real_ids)
    _calls_per_sync.append(sum(calls.values()))
    return seconds, calls


def run(fast: bool = False) -> list[Figure] | str:  # type: ignore[no-redef]
    _calls_per_sync.clear()
    if os.environ.get("SLURM_CONF") and shutil.which("sacct"):
        # With slurmdbd unable to reach its database, every sacct fails in milliseconds and the
        # reference loop would time errors, not lookups.
        probe = subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            return f"not measured: sacct fails ({probe.stderr.strip().splitlines()[-1][:160]}); rerun scripts/slurm/up.sh"
    figures = _seconds_figures(fast)
    if isinstance(figures, str):
        return figures
    n_jobs = 200 if fast else 1000
    return figures + [Figure(f"Slurm calls per idmctl sync of {n_jobs} jobs", "calls", [float(c) for c in _calls_per_sync],
                             f"one sacct -j per job", [float(n_jobs)], target="bounded, whatever the job count")]

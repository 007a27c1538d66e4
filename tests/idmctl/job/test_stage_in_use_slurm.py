"""Two jobs on one node of the real local Slurm cluster, one stage.dest: a copy a running job reads is never
emptied by another job's stage-in; the second job fails in one line naming the first, and once the first has
ended the second replaces the copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ground.spec.loader import load_spec
from idmctl.core.job_options import JobRequest
from idmctl.job.render import RenderContext, render_script, resolve_options
from slurm_support import sacct_state, sh, text_so_far, wait_until

import yaml


def _python(home: Path) -> str:
    """The job script's ``python``: the stage helpers run for real; the node guard and watchdog succeed at once
    (not what this test is about) and the trainer stands in for a run reading its copy: it sleeps $TRAIN_SLEEP."""
    path = home / "bin" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/bash\ncase "$2" in ground.stage|cache.convert) exec {sys.executable} "$@" ;; '
                    'trainers.train) exec sleep "${TRAIN_SLEEP:-0}" ;; esac\nexit 0\n')
    path.chmod(0o755)
    return str(path)


def _script(home: Path, name: str, dest: Path) -> Path:
    cache = home / f"cache_{name}"
    cache.mkdir()
    (cache / "ep0.safetensors").write_bytes(name.encode() * 1000)
    spec = home / f"stage_{name}.yaml"
    spec.write_text(yaml.safe_dump({"extends": "quickstart", "data": {"cache_root": str(cache)},
                                    "stage": {"enabled": True, "dest": str(dest)}}))
    resolved = load_spec(str(spec))
    run_dir = home / "runs" / name
    run_dir.mkdir(parents=True)
    # Both on n1 (the other node excluded), 1 CPU and 500 MB each: they run side by side on one node.
    options = resolve_options(resolved, JobRequest(qos="core-own", exclude=("n2",), cpus_per_node=1, mem="500MB",
                                                   time_limit="0:05:00"))
    ctx = RenderContext(run_dir=run_dir, chain_id=1, attempt=1, idmctl_home=home, log_path=str(run_dir / "slurm-%j.out"),
                        python=_python(home), stage_wait_s=3)
    path = run_dir / "job.sh"
    path.write_text(render_script(resolved, options, ctx))
    return path


def _sbatch(script: Path, sleep_s: int) -> str:
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TRAIN_SLEEP": str(sleep_s)}, check=True)
    return out.stdout.strip().split(";")[0]


def test_a_running_jobs_copy_is_not_replaced_by_another_job_on_its_node(slurm_home: Path) -> None:
    home, dest = slurm_home, slurm_home / "scratch" / "idm"
    first, second = _script(home, "a", dest), _script(home, "b", dest)
    job_a = _sbatch(first, 300)
    try:
        log_a = first.parent / f"slurm-{job_a}.out"
        wait_until(lambda: "stage-in done" in text_so_far(log_a), 120,
                   lambda: f"job {job_a}'s stage-in ({sacct_state(job_a)}): {text_so_far(log_a)[-400:]}")
        job_b = _sbatch(second, 0)
        log_b = second.parent / f"slurm-{job_b}.out"
        wait_until(lambda: sacct_state(job_b) == "FAILED", 120,
                   lambda: f"job {job_b} to fail ({sacct_state(job_b)}): {text_so_far(log_b)[-400:]}")
        nodes = sh("sacct", "-n", "-P", "-X", "-j", f"{job_a},{job_b}", "--format=NodeList").split()
        assert nodes == ["n1", "n1"], nodes
        failed = [line for line in text_so_far(log_b).splitlines() if "FAILED" in line]
        assert len(failed) == 1 and failed[0].startswith(
            f"idmctl: stage-in FAILED (ground.stage exit 1): {dest} is in use by job {job_a} (reading the copy of all of "
            f"{home}/cache_a "), failed
        assert failed[0].endswith(f"not replaced after waiting 3 s; give experiments that run side by side their own "
                                  f"stage.dest, or submit this one after job {job_a} ends")
        assert (dest / "ep0.safetensors").read_bytes() == b"a" * 1000, "job A's copy was touched"
        assert sacct_state(job_a) == "RUNNING"
    finally:
        sh("scancel", job_a, check=False)
    ended = lambda: sh("sacct", "-n", "-P", "-X", "-j", job_a, "--format=State", check=False)  # noqa: E731 ("CANCELLED by 0")
    wait_until(lambda: ended().startswith("CANCELLED"), 60, lambda: f"job {job_a} to end ({ended()})")
    again = _sbatch(second, 0)
    log = second.parent / f"slurm-{again}.out"
    wait_until(lambda: sacct_state(again) in ("COMPLETED", "FAILED"), 120,
               lambda: f"job {again} to end ({sacct_state(again)}): {text_so_far(log)[-400:]}")
    assert sacct_state(again) == "COMPLETED", text_so_far(log)
    assert f"stage-in on n1 replaces the copy at {dest}" in text_so_far(log)
    assert (dest / "ep0.safetensors").read_bytes() == b"b" * 1000

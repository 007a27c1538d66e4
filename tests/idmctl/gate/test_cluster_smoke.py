"""``--smoke-on cluster``: the smoke as a one-node job on the local Slurm (n1/n2, fake GPUs in gres: the
smoke itself runs on the CPU there and says so), waited for with a deadline."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ground.code_snapshot import default_store, materialize
from ground.spec.loader import load_spec
from idmctl.core.profile import SmokeJob
from idmctl.gate.cluster_smoke import run_smoke_on_cluster
from idmctl.job.code import tree_for

pytestmark = [pytest.mark.slurm]


def _code(resolved) -> Path:  # type: ignore[no-untyped-def]
    return materialize(tree_for(resolved.spec), default_store())


@pytest.mark.slow
def test_the_smoke_runs_as_a_job_on_a_node_and_reports_where(tiny_cache, slurm_home: Path) -> None:
    resolved = load_spec(str(tiny_cache.spec_file(slurm_home / "specs", "tiny_cluster_smoke")))
    smoke = run_smoke_on_cluster(resolved, SmokeJob(qos="core-own", gpus=1, cpus=1, mem="1500M"), 240,
                                 code_dir=_code(resolved))
    assert smoke.ok, smoke.error
    assert len(smoke.losses) == 3 and smoke.device == "cpu" and smoke.step_s and smoke.step_s > 0
    assert smoke.where and smoke.where.startswith("Slurm job ") and " on n" in smoke.where
    job_id = smoke.where.split()[2]
    state = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,AllocTRES"], capture_output=True,
                           text=True).stdout
    assert state.startswith("COMPLETED|") and "gres/gpu=1" in state  # the device kind asked for


def test_a_smoke_job_that_never_starts_fails_after_its_deadline_naming_the_partition(tiny_cache,
                                                                                   slurm_home: Path) -> None:
    resolved = load_spec(str(tiny_cache.spec_file(slurm_home / "specs", "tiny_cluster_smoke_late")))
    smoke = run_smoke_on_cluster(resolved, SmokeJob(partition="main", gpus=0, cpus=1, mem="500M"), 3,
                                 code_dir=_code(resolved), extra_sbatch=["--begin=now+1hour"], poll_s=0.5)
    assert not smoke.ok
    assert "not done after 3 s in partition main (PENDING" in smoke.error and smoke.error.endswith("cancelled")


@pytest.mark.slow
def test_a_smoke_job_that_fails_reports_its_error_from_the_node(slurm_home: Path) -> None:
    import shutil

    from trainers.tiny_data import TinyCache

    doomed = TinyCache.create(slurm_home / "doomed")
    resolved = load_spec(str(doomed.spec_path))
    code = _code(resolved)
    shutil.rmtree(slurm_home / "doomed" / "data")  # the data the spec names is gone before the node reads it
    smoke = run_smoke_on_cluster(resolved, SmokeJob(gpus=0, cpus=1, mem="1000M"), 240, code_dir=code)
    assert not smoke.ok and smoke.error.startswith("smoke job ") and " ended FAILED: " in smoke.error, smoke.error
    assert "does not exist" in smoke.error or "No such file" in smoke.error, smoke.error


@pytest.mark.slow
def test_preflight_smoke_on_cluster_records_the_nodes_figures(cli, tiny_cache, slurm_home: Path) -> None:
    import json

    spec = tiny_cache.spec_file(slurm_home / "specs", "tiny_smoke_on_cluster")
    result = cli("preflight", str(spec), "--smoke-on", "cluster", "--json")
    report = json.loads(result.stdout)
    (smoke,) = [check for check in report["checks"] if check["name"] == "smoke"]
    assert smoke["status"] == "PASS", smoke
    assert smoke["numbers"]["where"].startswith("Slurm job ") and " on n" in smoke["numbers"]["where"]
    assert " on cpu of Slurm job " in smoke["summary"]
    refused = cli("preflight", str(spec), "--smoke-on", "gpu-box")
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines()[-1] == (
        "error: --smoke-on: --smoke-on 'gpu-box' is not a place the smoke runs (here (this host) or cluster "
        "(a job on the profile's smoke_job))")

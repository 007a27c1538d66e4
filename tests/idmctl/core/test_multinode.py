"""More than one node: per-node io/qos/disk arithmetic, and a real 2-node Fabric job."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.spec import load_spec
from ground.spec.loader import ResolvedSpec
from idmctl.gate import disk, io, qos
from idmctl.core.checks import PreflightContext, Status
from idmctl.core.profile import load_profile
from ground.contract import ENV_RANK_DIGESTS

SAMPLE_BYTES = 4 * 5 * 27 * 48 * 5120 * 2  # latent_c_n4: N=4 layers × 5 frames × 27×48 tokens × 5120 ch × bf16
CACHE_BYTES = 7_151_073_361_920  # 1,871 files × 3,822,059,520 B (data.cache_files)


def _n4_on(nodes: int, qos_name: str = "core-extra") -> ResolvedSpec:
    base = load_spec("latent_c_n4")
    resources = base.spec.resources.model_copy(update={"nodes": nodes, "qos": qos_name})
    return ResolvedSpec(base.name, base.path, base.spec.model_copy(update={"resources": resources}))


@pytest.fixture(scope="module")
def card():
    return load_profile("card")[0]


def test_each_node_reads_its_share_from_its_own_staged_copy(card) -> None:
    one, two = (io.check(PreflightContext(_n4_on(n), card)) for n in (1, 2))
    assert one.numbers["step_bytes"] == SAMPLE_BYTES * 1024
    # 2 nodes × 8 ranks: each node reads 512 of the 1,024 samples of a step, from its own NVMe.
    assert two.numbers["step_bytes"] == SAMPLE_BYTES * 512
    # Each node's page cache holds the same share of the same working set (every node reads every file), so
    # the node's half-size step keeps the 1-node hit rate: half the data time.
    cache = two.numbers["page_cache"]
    assert cache["hit_rate"] == pytest.approx(one.numbers["page_cache"]["hit_rate"])
    assert two.numbers["data_s_per_step"] == pytest.approx(
        SAMPLE_BYTES * 512 * ((1 - cache["hit_rate"]) / 8e9 + cache["hit_rate"] / 20e9))
    assert two.numbers["data_s_per_step"] == pytest.approx(one.numbers["data_s_per_step"] / 2)
    assert "× eff. batch 1,024 ÷ 2 nodes = 512 samples/node = 135.9 GB/step/node = 10.1 s/step data in steady state" \
        in two.summary, two.summary
    assert "(cold cache: 17.0 s/step)" in two.summary
    # Both nodes stage the whole cache at once over the shared NAS: twice the 1-node copy time.
    assert two.numbers["stage_s"] == pytest.approx(2 * CACHE_BYTES / 0.9e9)
    assert one.numbers["stage_s"] == pytest.approx(CACHE_BYTES / 0.9e9)


def test_unstaged_nodes_share_the_nas(card) -> None:
    base = _n4_on(2)
    spec = base.spec.model_copy(update={"stage": base.spec.stage.model_copy(update={"enabled": False})})
    result = io.check(PreflightContext(ResolvedSpec(base.name, base.path, spec), card))
    assert result.numbers["step_bytes"] == SAMPLE_BYTES * 1024 and not result.numbers["per_node"]
    assert "(all 2 nodes share the NAS)" in result.summary


def test_disk_holds_one_copy_per_node_and_qos_counts_every_node(card) -> None:
    result = disk.check(PreflightContext(_n4_on(2), card))
    assert result.status is Status.PASS and result.numbers["stage_bytes"] == CACHE_BYTES
    assert "scratch of a card node (per node); checkpoints" in result.summary
    # 2 nodes × 8 GPUs = 16: over core-own's 8, within core-extra's 16.
    assert qos.check(PreflightContext(_n4_on(2, "core-extra"), card)).numbers["gpus"] == 16
    own = qos.check(PreflightContext(_n4_on(2, "core-own"), card))
    assert own.status is Status.FAIL and "16 GPUs > core-own max 8" in own.summary
    # On the preemptible tier the stage-in is charged for both nodes' copies.
    sub = qos.check(PreflightContext(_n4_on(2, "sub"), card))
    assert "stage-in 2 nodes × 7.2 TB ÷ NAS 900.0 MB/s = 4.4 h ≥ preempt cycle 60.0 min" in sub.summary, sub.summary


# -- a real 2-node job on the local Slurm (n1 + n2, one task each, Fabric DDP over gloo) ------------------

@pytest.mark.slow
@pytest.mark.slurm
def test_two_node_fabric_job_completes_with_identical_parameters(cli, tiny_cache, slurm_home: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import re
    import subprocess

    from idmctl.core.job_state import is_terminal
    from idmctl.record.db import session
    from idmctl.record.models import Job
    from slurm_support import text_so_far, wait_until

    home = slurm_home
    monkeypatch.setenv(ENV_RANK_DIGESTS, "1")
    spec = tiny_cache.spec_file(home / "specs", "two_node", stage={"enabled": True, "dest": str(home / "scratch")},
                                resources={"nodes": 2, "cpu_ranks": 1, "cpus": 1, "mem": "1500MB"},
                                train={"steps": 4, "checkpoint_every": 2, "log_every": 2, "effective_batch": 4})
    dry = cli("submit", str(spec), "--cluster", "local-slurm", "--dry-run")
    assert dry.exit_code == 0 and "submit-time checks pass" in dry.stderr, dry.stderr
    script = dry.stdout
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=1\n" in script
    assert 'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in script
    assert 'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1' in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0

    result = cli("submit", str(spec), "--cluster", "local-slurm", "--force", "--reason", "2-node test", "--json")
    assert result.exit_code == 0, result.output
    submitted = json.loads(result.stdout)
    log = Path(submitted["log"])

    def ended() -> Job | None:
        assert cli("sync", "--no-retry").exit_code == 0
        with session() as db:
            job = db.get(Job, submitted["job"])
        return job if job is not None and is_terminal(job.state) else None

    job = wait_until(ended, 300, f"2-node job {submitted['scheduler_id']} to end (log {log})", poll_s=1.0)
    text = text_so_far(log)
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), text
    assert job.node_list == "n[1-2]", job.node_list
    assert re.search(r"idmctl: 2 nodes \(n\[1-2\]\), rendezvous n1:\d+", text), text
    # Stage-in ran on each node: one copied, the other found the copy (n1 and n2 share this host's /tmp).
    staged = sorted(re.findall(r"idmctl: stage-in (?:done|skipped) on (n\d)", text))
    assert staged == ["n1", "n2"], text
    # The node guard ran on each node, before stage-in and before training (trainers/node_guard.py).
    for phase in ("stage", "train"):
        guarded = sorted(set(re.findall(rf"idmctl: node guard \({phase}\) on (n\d): ok shm", text)))
        assert guarded == ["n1", "n2"], text
    assert "world 2" in text and "done: step 4" in text, text
    digests = {p.name: p.read_text() for p in (log.parent / "rank_digests").glob("rank-*.sha256")}
    assert sorted(digests) == ["rank-0.sha256", "rank-1.sha256"]
    assert len(set(digests.values())) == 1, digests  # DDP kept both ranks' parameters identical

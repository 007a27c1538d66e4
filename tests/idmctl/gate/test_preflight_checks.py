"""Each check on card A's shipped mistake specs, with the card cluster profile.

Checks are pure functions of (spec, profile, measurements); measurements here are the ones the
runner gathers on this machine, except where a test states the measurement it feeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from idmctl.gate import cache, disk, introspection, io, loader, qos, shm, spec
from idmctl.core.checks import Measurements, PreflightContext, QueueWait, SmokeMeasurement, Status
from idmctl.gate.runner import gather, run_preflight
from idmctl.core.profile import load_profile
from ground.spec import load_spec

REPO = Path(__file__).resolve().parents[3]
MISTAKES = REPO / "experiments" / "mistakes"


@pytest.fixture(scope="module")
def card():
    return load_profile("card")


def ctx_for(name: str, profile, measurements: Measurements | None = None) -> PreflightContext:
    resolved = load_spec(str(MISTAKES / f"{name}.yaml") if (MISTAKES / f"{name}.yaml").exists() else name)
    return PreflightContext(resolved, profile, measurements or gather(resolved, profile))


def statuses(report) -> dict[str, str]:
    return {r.name: r.status.value for r in report.results}


def test_corrected_n4_passes_every_check_that_can_run_here(card):
    profile, profile_hash = card
    report = run_preflight(load_spec("latent_c_n4"), profile, profile_hash, with_smoke=False, record=False)
    got = statuses(report)
    assert {k: got[k] for k in ("spec", "introspection", "loader", "shm", "io", "qos")} == dict.fromkeys(
        ("spec", "introspection", "loader", "shm", "io", "qos"), "PASS")
    by_name = {r.name: r for r in report.results}
    # The 6.6 TB cache is not on this machine: cache says so (WARN on a cluster profile), disk sizes the
    # stage-in from data.cache_files and says the same.
    assert got["cache"] == "WARN"
    assert "/nas/cache/cosmos_hidden_multi does not exist on this machine" in by_name["cache"].summary
    assert "1,871 files × 3,822,059,520 B = 7,151,073,361,920 B" in by_name["disk"].summary
    assert "the cache is not on this machine" in by_name["disk"].summary
    assert got["smoke"] == "SKIP" and not report.unlocks_submit
    # resources.mem 1600GB is 1600 GiB, as Slurm reads it: cache 1.6 TB of a 2.4 TB working set → 67 % hits.
    assert ("271.8 GB × 33% misses ÷ NVMe (staged) 8.0 GB/s + × 67% hits ÷ page cache 20.0 GB/s = 20.3 s/step "
            "(cold cache: 34.0 s/step)") in by_name["io"].summary
    assert "14.1 d" in by_name["io"].summary


def test_wrong_class_kwarg_fails_introspection_naming_class_and_line(card):
    result = introspection.check(ctx_for("wrong_class_kwarg", card[0]))
    assert result.status is Status.FAIL
    from cache.dataset import HiddenMultiLayerDataset, HiddenSingleLayerDataset

    wrong_at = introspection.where(HiddenSingleLayerDataset)
    assert wrong_at.startswith("cache/dataset.py:")
    assert f"HiddenSingleLayerDataset ({wrong_at})" in result.summary
    assert "unexpected keyword argument 'selected_layer_indices'" in result.summary
    assert f"HiddenMultiLayerDataset ({introspection.where(HiddenMultiLayerDataset)})" in result.fix


def test_bind_error_agrees_with_python_on_a_real_call():
    class Raw:
        def __init__(self, root: str, *, mmap: bool = True):
            self.root = root

    kwargs = {"root": "/x", "selected_layer_indices": [1, 4]}
    with pytest.raises(TypeError, match="unexpected keyword argument 'selected_layer_indices'"):
        Raw(**kwargs)
    assert "unexpected keyword argument 'selected_layer_indices'" in introspection.bind_error(Raw, kwargs)
    assert "missing required argument 'root'" in introspection.bind_error(Raw, {"mmap": False})
    assert introspection.bind_error(Raw, {"root": "/x", "mmap": False}) is None


def test_persistent_workers_conflict_fails_loader_quoting_torch(card):
    result = loader.check(ctx_for("persistent_workers_conflict", card[0]))
    assert result.status is Status.FAIL
    # The same message torch raises for this DataLoader (checked against torch itself).
    import torch

    with pytest.raises(ValueError) as raised:
        torch.utils.data.DataLoader([1, 2], num_workers=0, persistent_workers=True)
    assert f"ValueError: {raised.value}" in result.summary
    assert "delete loader.persistent_workers" in result.fix


def test_explicit_persistent_workers_that_agrees_only_warns(card):
    base = load_spec("latent_c_n4")
    fixed = base.spec.model_copy(update={"loader": base.spec.loader.model_copy(update={"persistent_workers": False})})
    result = loader.check(PreflightContext(type(base)(base.name, base.path, fixed), card[0]))
    assert result.status is Status.WARN and "remove it; derived" in result.fix


def test_shm_overflow_fails_with_the_multiplication(card):
    result = shm.check(ctx_for("shm_overflow", card[0]))
    assert result.status is Status.FAIL
    assert ("8 ranks × 4 workers × 2 prefetch × batch 8 × 796,262,400 B/sample = 407,686,348,800 B (407.7 GB) "
            "vs 256.0 GB /dev/shm of a card node") in result.summary
    assert result.numbers["need_bytes"] == 8 * 4 * 2 * 8 * 12 * 5 * 27 * 48 * 5120 * 2
    assert "num_workers ≤ 2 fits" in result.fix


def test_shm_on_the_local_profile_uses_this_machines_dev_shm():
    profile, _ = load_profile("local")
    resolved = load_spec(str(MISTAKES / "shm_overflow.yaml"))
    measured = gather(resolved, profile)
    import os

    stats = os.statvfs("/dev/shm")
    assert abs(measured.shm_free_bytes - stats.f_bavail * stats.f_frsize) < 256 * 1024**2
    result = shm.check(PreflightContext(resolved, profile, Measurements(shm_free_bytes=10**9)))
    assert result.status is Status.FAIL and "vs 1.0 GB free on this machine's /dev/shm (statvfs)" in result.summary


def test_preemptible_sub_with_2h_stage_fails_qos(card):
    result = qos.check(ctx_for("preemptible_sub_stage", card[0]))
    assert result.status is Status.FAIL
    assert "stage-in 7.2 TB ÷ NAS 900.0 MB/s = 2.2 h ≥ preempt cycle 60.0 min" in result.summary
    assert result.numbers["stage_s"] == pytest.approx(7_151_073_361_920 / 0.9e9)
    assert "non-preemptible" in result.fix


def test_checkpoint_interval_longer_than_preempt_cycle_fails_qos(card):
    # No stage-in, but 500 steps × 34 s/step = 4.7 h between checkpoints on a 1 h cycle.
    base = load_spec(str(MISTAKES / "preemptible_sub_stage.yaml"))
    no_stage = base.spec.model_copy(update={"stage": base.spec.stage.model_copy(update={"enabled": False})})
    result = qos.check(PreflightContext(type(base)(base.name, base.path, no_stage), card[0]))
    assert result.status is Status.FAIL and "no checkpoint survives a preemption" in result.summary


def test_n12_dense_fails_io_with_the_cards_numbers(card):
    result = io.check(ctx_for("n12_dense_60k", card[0]))
    assert result.status is Status.FAIL
    # 1600GB = 1600 GiB (Slurm's G) − 216.9 GB resident = 1.5 TB of cache over a 7.2 TB working set: 21 % hits.
    assert "815.4 GB × 79% misses ÷ NVMe (staged) 8.0 GB/s + × 21% hits ÷ page cache 20.0 GB/s = 89.1 s/step" in result.summary
    assert "(cold cache: 101.9 s/step)" in result.summary
    assert "× 60,000 steps + cold first pass 112.6 s = 61.9 d" in result.summary
    assert result.numbers["step_bytes"] == 12 * 5 * 27 * 48 * 5120 * 2 * 1024


def test_long_queue_wait_warns_and_suggests_the_faster_tier(card):
    waits = [QueueWait("5961", "core-extra", 8, 6 * 86400, "CANCELLED", True),
             QueueWait("6262", "core-own", 8, 2 * 3600, "FAILED")]
    result = qos.check(ctx_for("core_extra_queue", card[0], Measurements(queue_waits=waits)))
    assert result.status is Status.WARN
    assert "expected queue wait 6.0 d = median of 1 recorded 8-GPU core-extra job(s): 5961 6.0 d (cancelled while pending)" in result.summary
    assert "core-own: median 2.0 h over 1 job(s)" in result.fix


def test_smoke_compute_time_joins_io_only_on_the_jobs_device(card):
    gpu_smoke = SmokeMeasurement(ok=True, losses=[1.6, 1.1], device="cuda:0", batch_size=2, step_s=0.5)
    cpu_smoke = SmokeMeasurement(ok=True, losses=[1.6, 1.1], device="cpu", batch_size=2, step_s=0.5)
    with_gpu = io.check(ctx_for("latent_c_n4", card[0], Measurements(smoke=gpu_smoke)))
    with_cpu = io.check(ctx_for("latent_c_n4", card[0], Measurements(smoke=cpu_smoke)))
    # batch 8 × grad accum 16 = 128 samples per rank per step; 0.5 s per 2 samples → 32 s of compute.
    assert with_gpu.numbers["compute_s_per_step"] == pytest.approx(32.0)
    assert with_cpu.numbers["compute_s_per_step"] is None
    # The batch loader reads ahead while the step computes: the step is the slowest term, not their sum.
    assert with_gpu.numbers["step_s"] == pytest.approx(32.0) and with_gpu.numbers["bound"] == "compute"
    assert with_cpu.numbers["step_s"] == with_cpu.numbers["data_s_per_step"]
    assert with_cpu.numbers["bound"] == "storage"


def test_spec_fails_when_the_node_is_too_small():
    profile, _ = load_profile("local")
    result = spec.check(PreflightContext(load_spec("latent_c_n4"), profile))
    assert result.status is Status.FAIL and "resources.gpus_per_node 8 > 0 GPUs on a local node" in result.summary


def test_missing_cache_fails_on_the_local_profile(tmp_path):
    profile, _ = load_profile("local")
    result = cache.check(ctx_for("quickstart", profile))
    assert result.status is Status.FAIL and "does not exist on this machine" in result.summary


def test_disk_fails_when_scratch_is_smaller_than_the_stage(card):
    measured = Measurements(scratch_free_bytes=10**12)
    profile = load_profile("local")[0]
    result = disk.check(PreflightContext(load_spec("latent_c_n4"), profile, measured))
    assert result.status is Status.FAIL and "vs 1.0 TB free under /tmp/idm_cache on this machine" in result.summary

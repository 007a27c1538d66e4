"""A step's three terms on card A's N=4 plan: storage, the loader's CPU (measured by the smoke, ÷ the
rank's CPUs) and compute, overlapped by the batch loader's read-ahead; each with its arithmetic, the
io check naming the one that bounds the step, and the limits / what-ifs reading the same step time.
The figures for compute and loader CPU are the test's inputs (a smoke on a GPU cannot run here)."""

from __future__ import annotations

import pytest

from ground.spec.loader import load_spec
from idmctl.core.checks import Measurements, PreflightContext, SmokeMeasurement, Status
from idmctl.core.profile import load_profile
from idmctl.gate import io, loader, shm
from idmctl.plan.budget import overlap, step_estimate
from idmctl.plan.limits import derive

GPU_SMOKE = SmokeMeasurement(ok=True, losses=[1.6, 1.1], device="cuda:0", batch_size=2, step_s=0.5,
                             loader_cpu_s_per_gb=20.0)
"""0.5 s per 2 samples → 32 s of compute per step at 128 samples per rank; 20 CPU s per GB read."""
RANK_BYTES = 1024 // 8 * 265_420_800
"""Card A: 1,024 samples per step over 8 ranks of one node × 265,420,800 B per sample."""


def _ctx(smoke: SmokeMeasurement | None = None, **updates: dict) -> PreflightContext:
    resolved = load_spec("latent_c_n4")
    spec = resolved.spec
    for section, values in updates.items():
        spec = spec.model_copy(update={section: getattr(spec, section).model_copy(update=values)})
    return PreflightContext(type(resolved)(resolved.name, resolved.path, spec), load_profile("card")[0],
                            Measurements(smoke=smoke))


def test_the_loader_term_is_bytes_per_rank_times_cpu_per_gb_over_the_ranks_cpus() -> None:
    estimate = step_estimate(_ctx(GPU_SMOKE))
    # 112 CPUs ÷ 8 ranks = 14 CPUs per rank.
    assert estimate.loader_s == pytest.approx(RANK_BYTES / 1e9 * 20.0 / 14)
    assert estimate.compute_s == pytest.approx(32.0)
    assert estimate.overlapped
    assert estimate.step_s == pytest.approx(max(estimate.data_s, estimate.loader_s, 32.0))
    assert estimate.bound == "loader CPU"  # 34.0 GB × 20 s/GB ÷ 14 = 48.5 s > 32 s compute > storage
    assert ("loader CPU 34.0 GB/rank × 20 s/GB (page cache, cold; measured: smoke on cuda:0) ÷ 14 CPUs/rank "
            "(resources.cpus 112 ÷ 8 ranks) = 48.5 s") in estimate.arithmetic()
    assert (f"step = max(storage {estimate.data_s:.1f} s, loader CPU 48.5 s, compute 32.0 s) + 0 s not overlapped "
            "(num_workers 0: the rank's batch loader reads 2 batches ahead on threads) = 48.5 s/step, "
            "bound by loader CPU") in estimate.arithmetic()


def test_the_io_check_says_which_term_bounds_the_step_and_limits_read_the_same_time() -> None:
    ctx = _ctx(GPU_SMOKE)
    result = io.check(ctx)
    assert result.numbers["bound"] == "loader CPU"
    assert result.numbers["loader_s_per_step"] == pytest.approx(RANK_BYTES / 1e9 * 20.0 / 14)
    assert "bound by loader CPU" in result.summary
    assert derive(ctx).step_s == result.numbers["step_s"]
    # Twice the CPUs halve the loader's term: compute (32 s) bounds the step again.
    more = io.check(_ctx(GPU_SMOKE, resources={"cpus": 224}))
    assert more.numbers["loader_s_per_step"] == pytest.approx(result.numbers["loader_s_per_step"] / 2)
    assert more.numbers["bound"] == "compute" and more.numbers["step_s"] == pytest.approx(32.0)


def test_without_a_loader_measurement_the_term_says_so_and_counts_nothing() -> None:
    estimate = step_estimate(_ctx())
    assert estimate.loader_s is None and estimate.compute_s is None
    assert estimate.step_s == estimate.data_s and estimate.bound == "storage"
    assert "loader CPU not measured (no smoke measured this data path's CPU s/GB, page cache, cold)" in \
        estimate.arithmetic()
    assert "max(storage " in estimate.arithmetic() and "loader CPU unmeasured, compute unmeasured)" in \
        estimate.arithmetic()


def test_a_loader_on_the_steps_own_thread_adds_its_terms() -> None:
    ctx = _ctx(GPU_SMOKE, loader={"mmap": False})
    overlapped, why = overlap(ctx.spec)
    assert not overlapped and why.startswith("not overlapped: num_workers 0 with loader.mmap false")
    estimate = step_estimate(ctx)
    assert estimate.step_s == pytest.approx(estimate.data_s + estimate.loader_s + estimate.compute_s)
    assert " + loader CPU " in estimate.step_formula() and "max(" not in estimate.step_formula()
    workers = step_estimate(_ctx(GPU_SMOKE, loader={"num_workers": 2}))
    assert workers.overlapped and "2 workers × prefetch 2 read ahead" in workers.step_formula()


def test_the_batch_loaders_buffers_are_judged_against_the_nodes_memory() -> None:
    result = loader.check(_ctx())
    assert result.status is Status.PASS
    assert result.numbers["buffer_bytes"] == 8 * 3 * 8 * 265_420_800
    assert ("8 ranks × 3 batch buffers (2 read ahead + 1 in use) × 8 samples × 265,420,800 B/sample (bfloat16) = "
            "51.0 GB pinned vs resources.mem") in result.summary
    small = loader.check(_ctx(resources={"mem": "40GB"}))
    assert small.status is Status.FAIL
    assert "the loader's buffers do not fit the node's memory: 8 ranks × 3 batch buffers" in small.summary
    assert "= 51.0 GB pinned vs resources.mem 42.9 GB" in small.summary
    assert "lower loader.batch_size" in small.fix
    tight = loader.check(_ctx(resources={"mem": "80GB"}))
    assert tight.status is Status.WARN and "the loader's buffers take 59% of the node's memory" in tight.summary
    # With num_workers 0 nothing is in /dev/shm, and the shm line says where the buffers are instead.
    assert "the rank's batch loader holds its 3 buffers (2 read ahead + 1 in use) in its own memory" in \
        shm.check(_ctx()).summary


def test_where_the_plan_reads_around_the_page_cache_the_loader_term_is_the_o_direct_cpu() -> None:
    """N=12 dense on card A with a measured O_DIRECT rate that beats the cached step: the plan reads
    O_DIRECT, so the loader's term is the smoke's O_DIRECT CPU per GB, not the page-cache one."""
    profile = load_profile("card")[0]
    fast = profile.model_copy(update={"storage": profile.storage.model_copy(update={"direct_read": "20GB/s"})})
    smoke = SmokeMeasurement(ok=True, losses=[1.0], device="cuda:0", batch_size=2, step_s=0.5,
                             loader_cpu_s_per_gb=20.0, loader_direct_cpu_s_per_gb=5.0)
    estimate = step_estimate(PreflightContext(load_spec("latent_c_n12_dense"), fast, Measurements(smoke=smoke)))
    assert estimate.cache is not None and estimate.cache.reads_direct
    assert "× 5 s/GB (O_DIRECT; measured: smoke on cuda:0)" in estimate.arithmetic()
    unmeasured = SmokeMeasurement(ok=True, losses=[1.0], device="cuda:0", batch_size=2, step_s=0.5,
                                  loader_cpu_s_per_gb=20.0)
    kept = step_estimate(PreflightContext(load_spec("latent_c_n12_dense"), fast, Measurements(smoke=unmeasured)))
    assert kept.loader_s is None and "CPU s/GB, O_DIRECT)" in kept.arithmetic()

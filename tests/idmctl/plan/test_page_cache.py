"""The page-cache model's arithmetic on card A's plans (no Slurm: tests/idmctl/plan/test_page_cache_slurm.py checks it
against a real cgroup-limited job)."""

from __future__ import annotations

import pytest

from ground.spec.loader import load_spec
from idmctl.core.checks import Measurements, PreflightContext, SmokeMeasurement
from idmctl.core.profile import ClusterProfile, load_profile
from idmctl.plan.budget import cache_arithmetic, step_estimate
from idmctl.plan.limits import derive
from idmctl.plan.page_cache import ASSUMED_RESIDENT_PER_RANK


def _ctx(name: str = "latent_c_n4", profile: ClusterProfile | None = None, **updates: dict) -> PreflightContext:
    resolved = load_spec(name)
    spec = resolved.spec
    for section, values in updates.items():
        spec = spec.model_copy(update={section: getattr(spec, section).model_copy(update=values)})
    return PreflightContext(type(resolved)(resolved.name, resolved.path, spec), profile or load_profile("card")[0],
                            Measurements())


def test_card_n4_hit_rate_is_the_cache_over_the_routed_working_set() -> None:
    cache = step_estimate(_ctx()).cache
    assert cache is not None
    assert cache.working_set == 1871 * 4 * 318_504_960
    loader_bytes = 8 * 3 * 8 * 265_420_800  # 8 ranks × 3 batch buffers × 8 samples × bf16 bytes as cached
    assert cache.resident.bytes == 8 * ASSUMED_RESIDENT_PER_RANK + loader_bytes
    assert cache.cache == 1600 * 1024**3 - cache.resident.bytes  # --mem 1600GB is 1600 GiB, as Slurm reads it
    assert cache.hit == pytest.approx(cache.cache / cache.working_set)
    assert cache.data_s == pytest.approx(cache.step_bytes * (1 - cache.hit) / 8e9 + cache.step_bytes * cache.hit / 20e9)
    assert cache.cold_data_s == pytest.approx(271_790_899_200 / 8e9)
    text = cache_arithmetic(cache)
    assert "hit = min(1, 1.6 TB ÷ 2.4 TB) = 67%" in text and "(assumed, no CPU smoke measured host memory)" in text
    assert "uniform random windows over the working set, no other job's pages on the node" in text


def test_more_memory_raises_the_hit_rate_and_repeats_do_not() -> None:
    base = step_estimate(_ctx()).cache
    less = step_estimate(_ctx(resources={"mem": "1000GB"})).cache
    repeated = step_estimate(_ctx(loader={"repeats": 4})).cache
    assert base and less and repeated
    assert less.hit < base.hit and less.data_s > base.data_s
    assert repeated.step_bytes == base.step_bytes // 4
    # The working set does not move with K; the cache grows by the loader's 3/4 smaller batches
    # (8 ranks × 3 buffers × 6 fewer bf16 samples = 38.2 GB), so the hit rate moves by that alone.
    assert repeated.working_set == base.working_set
    assert repeated.cache - base.cache == 8 * 3 * 6 * 265_420_800
    assert repeated.hit == pytest.approx(repeated.cache / repeated.working_set)


def test_a_cpu_smokes_peak_is_the_measured_resident_memory() -> None:
    ctx = _ctx()
    smoke = SmokeMeasurement(ok=True, device="cpu", batch_size=2, peak_mem_bytes=3_000_000_000)
    measured = step_estimate(PreflightContext(ctx.resolved, ctx.profile, Measurements(smoke=smoke))).cache
    assert measured and measured.resident.measured and "smoke peak on cpu at batch 2" in measured.resident.formula
    # + the batch loader's buffers: 8 ranks × (2 read ahead + 1 in use) × 8 samples × 265,420,800 B (bf16, as cached).
    assert measured.resident.bytes == 8 * 3_000_000_000 + 8 * 3 * 8 * 265_420_800
    assert "8 ranks × 3 batch buffers (2 read ahead + 1 in use) × 8 samples × 265.4 MB bfloat16 = 51.0 GB" in \
        measured.resident.formula


def test_reading_around_the_cache_is_judged_from_a_measured_rate_only() -> None:
    profile = load_profile("card")[0]
    n12 = step_estimate(_ctx("latent_c_n12_dense")).cache
    assert n12 and "not measured here (storage.direct_read" in cache_arithmetic(n12)
    measured = profile.model_copy(update={"storage": profile.storage.model_copy(update={"direct_read": "8GB/s"})})
    n12 = step_estimate(_ctx("latent_c_n12_dense", measured)).cache
    assert n12 and "(measured) = 101.9 s/step vs 89.1 s cached: keep the page cache" in cache_arithmetic(n12)
    n4 = step_estimate(_ctx("latent_c_n4", measured)).cache
    assert n4 and "O_DIRECT" not in cache_arithmetic(n4)  # 2.4 TB is under 2× the 1.6 TB cache


def test_the_read_path_is_chosen_once_and_the_step_counts_the_path_chosen() -> None:
    """Where O_DIRECT's measured step beats the cached steady state on a working set far larger than the
    cache, the plan chooses it: the step's data time is the O_DIRECT time and no cold first pass is added
    (no cache to fill); where it is slower, or the working set fits, the page cache stays."""
    profile = load_profile("card")[0]
    fast = profile.model_copy(update={"storage": profile.storage.model_copy(update={"direct_read": "20GB/s"})})
    estimate = step_estimate(_ctx("latent_c_n12_dense", fast))
    cache = estimate.cache
    assert cache is not None and cache.reads_direct
    assert cache.direct_data_s == cache.step_bytes / 20e9 < cache.data_s
    assert estimate.data_s == cache.served_data_s == cache.direct_data_s and cache.served_warmup_s == 0.0
    assert cache.warmup_s > 0  # what the page-cache path would have paid, not counted
    assert f"(measured) = {cache.direct_data_s:.1f} s/step vs 89.1 s cached: the job reads around the page cache" \
        in cache_arithmetic(cache)
    assert estimate.train_s == estimate.step_s * estimate.steps
    slow = profile.model_copy(update={"storage": profile.storage.model_copy(update={"direct_read": "8GB/s"})})
    kept = step_estimate(_ctx("latent_c_n12_dense", slow))
    assert kept.cache is not None and not kept.cache.reads_direct and kept.data_s == kept.cache.data_s
    n4 = step_estimate(_ctx("latent_c_n4", fast)).cache
    assert n4 is not None and not n4.reads_direct  # 2.4 TB is under 2× the 1.6 TB cache
    # What submit hands the job (as ENV_LOADER_DIRECT) is this same choice.
    assert derive(_ctx("latent_c_n12_dense", fast), "v").loader_direct
    assert not derive(_ctx("latent_c_n12_dense", slow), "v").loader_direct


def test_a_profile_without_a_page_cache_rate_charges_every_byte_to_the_storage() -> None:
    profile = load_profile("card")[0]
    bare = profile.model_copy(update={"storage": profile.storage.model_copy(update={"page_cache_read": None})})
    estimate = step_estimate(_ctx(profile=bare))
    assert estimate.cache is None and f"{estimate.data_s:.1f}" == "34.0"

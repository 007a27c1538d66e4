"""Plans say what they did not measure: a GPU job planned from this CPU host has no GPU compute to go
on, so its step time is the data read time alone, shown as a lower bound in io, in the derived
limits, in ``exp show`` and their ``--json``; once a smoke or a recorded run on the job's device
kind exists, its compute joins the plan.

No GPU exists on this machine: the CUDA smoke below is a recorded row the test inserts (its numbers
are card A's one-GPU smoke), the only way to have one here.
"""

from __future__ import annotations

import json

import pytest

from ground.progress import timing_key
from ground.provenance import Basis, DeviceKind, Provenance
from ground.spec import load_spec
from idmctl.plan.budget import step_estimate
from idmctl.plan.limits import derive
from idmctl.core.checks import (CheckResult, Measurements, PreflightContext, RecordedRun, SmokeMeasurement,
                                     Status)
from idmctl.core.profile import load_profile

UNMEASURED = "data-bound lower bound; compute unmeasured (no GPU smoke)"
CARD_SMOKE = SmokeMeasurement(ok=True, losses=[1.62, 1.3, 1.14], dataset_s=23.0, sample_s=0.7, model_s=39.0,
                              step_s=0.5, peak_mem_bytes=5_460_000_000, params=243_503_488, device="cuda:0",
                              batch_size=2, checkpoint_s=4.0)


def card_context(name: str = "latent_c_n4", **measured: object) -> PreflightContext:
    profile, _ = load_profile("card")
    return PreflightContext(load_spec(name), profile, Measurements(**measured))  # type: ignore[arg-type]


def test_card_n4_io_check_says_its_step_time_is_a_data_bound_lower_bound(cli) -> None:
    result = cli("preflight", "latent_c_n4", "--cluster", "card", "--no-smoke", "--json")
    io = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "io")
    assert io["status"] == "PASS"
    # The page cache serves 67% of the 271.8 GB from memory: 20.3 s/step in steady state, not 34.0 s.
    assert "= 20.3 s/step data in steady state (page cache per node" in io["summary"]
    assert "(cold cache: 34.0 s/step)" in io["summary"]
    data = io["numbers"]["data_s_per_step"]
    assert (f"; {UNMEASURED}; step = max(storage {data:.1f} s, loader CPU unmeasured, compute unmeasured) + 0 s not "
            "overlapped (num_workers 0: the rank's batch loader reads 2 batches ahead on threads) = "
            f"{data:.1f} s/step, bound by storage; × 60,000 steps + cold first pass 2.0 min = 14.1 d + stage-in 2.2 h "
            "= 14.2 d; ≥ 14.2 d vs resources.time_limit 30-00:00:00 (30.0 d)") in io["summary"]
    assert io["numbers"]["compute_s_per_step"] is None
    assert io["numbers"]["step_provenance"] == {"basis": "lower_bound", "source": "no GPU smoke", "device": None,
                                                "label": UNMEASURED}


def test_card_n12_what_if_at_k8_shows_its_days_as_lower_bounds(cli) -> None:
    result = cli("preflight", "latent_c_n12_dense", "--cluster", "card", "--no-smoke", "--what-if", "loader.repeats=8")
    assert "train_s: ≥ 61.9 d → ≥ 7.6 d" in result.output
    assert "11.0 s/step data in steady state" in result.output


def test_exp_show_marks_the_step_time_and_the_time_limit_it_derives(cli) -> None:
    shown = cli("exp", "show", "latent_c_n4", "--cluster", "card")
    assert shown.exit_code == 0, shown.output
    assert (f"  step time 20.3 s/step ({UNMEASURED}; estimate: max(storage 20.3 s, loader CPU unmeasured, compute "
            "unmeasured) + 0 s not overlapped (num_workers 0: the rank's batch loader reads 2 batches ahead on threads) "
            "= 20.3 s/step, bound by storage); checkpoint write unknown "
            "(no smoke or earlier run measured one)") in shown.output.replace("\n", "")
    assert "(a lower bound: the step time holds no compute)" in shown.output.replace("\n", "")
    document = json.loads(cli("exp", "show", "latent_c_n4", "--cluster", "card", "--json").stdout)
    assert document["limits"]["step_provenance"]["label"] == UNMEASURED
    assert document["limits"]["step_provenance"]["basis"] == Basis.LOWER_BOUND.value


def test_a_cpu_smoke_does_not_count_as_the_gpu_jobs_compute() -> None:
    cpu = SmokeMeasurement(ok=True, losses=[1.0], step_s=0.2, device="cpu", batch_size=2)
    estimate = step_estimate(card_context(smoke=cpu))
    assert estimate.compute_s is None and estimate.step_s == estimate.data_s
    assert estimate.provenance == Provenance(Basis.LOWER_BOUND, "no GPU smoke")
    assert estimate.compute_note == "smoke ran on cpu, the job on GPU"


def test_a_recorded_cuda_smoke_joins_the_plan_in_exp_show(cli) -> None:
    from idmctl.record.preflights import record_run

    resolved = load_spec("latent_c_n4")
    run = record_run(resolved, "card", "card-profile", "code-x",
                     [CheckResult("smoke", Status.PASS, "inserted by the test", CARD_SMOKE.as_dict())], True, 1.0)
    spec = resolved.spec
    data_s = step_estimate(card_context()).data_s
    compute_s = CARD_SMOKE.step_s * spec.loader.batch_size * spec.grad_accum / CARD_SMOKE.batch_size
    document = json.loads(cli("exp", "show", "latent_c_n4", "--cluster", "card", "--json").stdout)
    limits = document["limits"]
    # The batch loader reads ahead while the step computes: the step is the slower of data and compute.
    assert limits["step_s"] == pytest.approx(max(data_s, compute_s))
    source = f"smoke on cuda:0 at batch 2, preflight run {run.id}"
    assert limits["step_provenance"] == {"basis": "measured", "source": source, "device": "cuda",
                                         "label": f"measured: {source}"}
    shown = cli("exp", "show", "latent_c_n4", "--cluster", "card").output
    assert f"(measured: {source}; estimate: max(storage {data_s:.1f} s, loader CPU unmeasured, compute 32.0 s)" in shown
    assert "lower bound" not in shown


def test_the_io_check_adds_the_cuda_smokes_compute_and_drops_the_bound() -> None:
    from idmctl.gate import io

    result = io.check(card_context(smoke=CARD_SMOKE))
    assert result.numbers["compute_s_per_step"] == pytest.approx(0.5 * 8 * 16 / 2)
    assert result.numbers["step_provenance"]["basis"] == "measured"
    assert "compute unmeasured" not in result.summary and "≥" not in result.summary
    assert "; compute 32.0 s (smoke 0.500 s at batch 2 × 128/2 samples per rank); step = max(storage " in result.summary
    assert "compute 32.0 s) + 0 s not overlapped" in result.summary and "= 32.0 s/step, bound by compute" in result.summary


def test_a_recorded_run_of_this_geometry_is_the_measured_step_time() -> None:
    ctx = card_context()
    run = RecordedRun("latent_c_n4/1", "code-x", timing_key(ctx.spec), 27.5, 6.0)
    limits = derive(card_context(recorded_runs=[run]))
    assert limits.step_s == 27.5
    assert limits.step_provenance == Provenance(Basis.MEASURED, "1 earlier run(s) on GPU: latent_c_n4/1",
                                                DeviceKind.CUDA)
    assert "(a lower bound" not in limits.time_limit.arithmetic
    assert limits.lines()[0].startswith("step time 27.5 s/step (measured: 1 earlier run(s) on GPU: latent_c_n4/1; ")


def test_a_cpu_job_with_a_cpu_smoke_is_measured() -> None:
    profile, _ = load_profile("local")
    smoke = SmokeMeasurement(ok=True, losses=[1.0], step_s=0.01, device="cpu", batch_size=2)
    estimate = step_estimate(PreflightContext(load_spec("quickstart"), profile, Measurements(smoke=smoke)))
    assert estimate.provenance == Provenance(Basis.MEASURED, "smoke on cpu at batch 2", DeviceKind.CPU)
    assert estimate.compute_s is not None and estimate.step_s > estimate.data_s


@pytest.mark.parametrize(("device", "status", "words"), [
    ("cpu", Status.PASS, "build time unmeasured on GPU (no GPU smoke): the 1-file encode ran on cpu (load 1.0 s + "
                         "⌈9 files ÷ 2 process(es)⌉ × 100.00 s/file = 8.3 min there), which does not stand for the "
                         "job's 2 GPU(s) per node; time limit 5.0 min not judged"),
    ("cuda:0", Status.FAIL, "the build outlasts its time limit: load 1.0 s + ⌈9 files ÷ 2 process(es)⌉ × 100.00 s/file "
                            "= 8.3 min vs time limit 5.0 min"),
])
def test_the_build_estimate_stands_only_on_a_smoke_of_the_jobs_device_kind(idmctl_home, device: str, status: Status,
                                                                           words: str) -> None:
    from cache.build_plan import plan
    from cache.latent.scenes import write_scene_episodes
    from idmctl.core.job_options import JobRequest
    from idmctl.job.effective import build
    from idmctl.gate.build import BuildSmoke, judge_smoke

    episodes = idmctl_home / "demos.hdf5"
    write_scene_episodes(episodes, demos=3, steps=9)
    spec = idmctl_home / "gpu_build.yaml"
    spec.write_text(f"extends: latent_rgbpt_smoke\ndata:\n  episodes: {episodes}\nlatent:\n  cache_root: {idmctl_home}\n")
    job = build(str(spec), JobRequest(build="rgb", gpus_per_node=2, time_limit="0:05:00"), "local")
    smoke = BuildSmoke(ok=True, load_s=1.0, encode_s=100.0, bytes_per_file=1_000, peak_rss_bytes=1_000_000,
                       device=device)
    result = judge_smoke(job, plan(job.resolved, "rgb"), smoke)
    assert result.status is status, result.summary
    assert words in result.summary
    expected = "measured" if device.startswith("cuda") else "unmeasured"
    assert result.numbers["estimate_provenance"]["basis"] == expected


def test_qos_checkpoint_work_on_a_preemptible_tier_is_a_lower_bound_too(cli) -> None:
    result = cli("preflight", "latent_c_n4", "--cluster", "card", "--no-smoke", "--json", "--what-if", "resources.qos=sub")
    qos = next(row for row in json.loads(result.stdout)["checks"] if row["name"] == "qos")
    assert qos["after"]["numbers"]["step_provenance"]["basis"] == "lower_bound"
    assert {"number": "first_checkpoint_s", "before": "—", "after": "≥ 5.0 h"} in qos["changed"]

"""Limits derived from measurement: time limit, checkpoint interval and signal lead, with their arithmetic;
the spec wins and WARNs when it disagrees badly; earlier runs' progress files beat the smoke and the estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ground.contract import ENV_CHECKPOINT_EVERY, ENV_LOADER_DIRECT
from ground.progress import Progress, timing_key, write_progress
from ground.spec.loader import load_spec
from idmctl.plan.limits import derive
from idmctl.core.checks import Measurements, PreflightContext, RecordedRun, SmokeMeasurement
from idmctl.core.profile import load_profile, profile_path


def _spec(tmp_path: Path, name: str = "planned", **sections: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"extends": "latent_c_n4", **sections}))
    return path


UNSET = {"resources": {"time_limit": None}, "train": {"checkpoint_every": None}}


def _ctx(path: Path, cluster: str = "card", **measured: object) -> PreflightContext:
    return PreflightContext(load_spec(str(path)), load_profile(cluster)[0], Measurements(**measured))


def test_unset_limits_are_derived_from_the_estimate_with_arithmetic(tmp_path: Path) -> None:
    limits = derive(_ctx(_spec(tmp_path, **UNSET)))
    # 271.8 GB/step, 67% of it from the page cache (resources.mem 1600GB = 1600 GiB, as Slurm reads it): 33% ÷ 8 GB/s
    # + 67% ÷ 20 GB/s = 20.3 s/step; (2.2 h stage + 60,000 × 20.3 s + the cold cache's 2.0 min) × 1.25 = 17.7 d,
    # under core-own's 30 d.
    assert limits.time_limit.arithmetic == ("(stage-in 2.2 h + 60,000 steps × 20.3 s/step + cold page cache 2.0 min) "
                                            "× 1.25 margin = 17.7 d → 17-17:00:00 (a lower bound: the step time holds "
                                            "no compute)")
    assert limits.time_limit_slurm == "17-17:00:00" and limits.time_limit.source == "derived"
    assert limits.checkpoint_every.arithmetic == ("non-preemptible core-own: lose at most 4.0 h to a failure → "
                                                  "interval ≤ 4.0 h; 4.0 h ÷ 20.3 s/step = 710 steps")
    assert limits.signal_lead.arithmetic == "(20.3 s step + unmeasured write) × 3 = 60.8 s → 61 s"


def test_preemptible_tier_and_measured_write_bound_the_interval(tmp_path: Path) -> None:
    smoke = SmokeMeasurement(ok=True, device="cuda:0", batch_size=2, step_s=0.5, checkpoint_s=20.0)
    limits = derive(_ctx(_spec(tmp_path, resources={"qos": "sub", "gpus_per_node": 4, "time_limit": None},
                               loader={"batch_size": 8}, train={"checkpoint_every": None}, stage={"enabled": False}),
                         smoke=smoke))
    # The smoke's 0.5 s at batch 2 → × (8 × 32 accum = 256 samples per rank) / 2 = 64 s compute per step, under
    # the 101.1 s the storage takes (the step is their max, b5969bb).
    assert limits.step_source == ("estimate: max(storage 101.1 s, loader CPU unmeasured, compute 64.0 s) + 0 s not "
                                  "overlapped (num_workers 0: the rank's batch loader reads 2 batches ahead on threads) "
                                  "= 101.1 s/step, bound by storage")
    assert limits.write_source == "measured by the smoke"
    assert limits.checkpoint_every.arithmetic == (
        "preemptible sub: expected loss interval/2 ≤ 10% of the 60.0 min cycle → interval ≤ 12.0 min; "
        "write 20.0 s ≤ 2% of interval → interval ≥ 16.7 min; 16.7 min ÷ 101.1 s/step = 9 steps")
    assert limits.signal_lead.arithmetic == "(101.1 s step + 20.0 s write) × 3 = 363.3 s → 364 s"


def test_earlier_runs_of_the_same_code_and_geometry_win(tmp_path: Path) -> None:
    path = _spec(tmp_path, **UNSET)
    key = timing_key(load_spec(str(path)).spec)
    runs = [RecordedRun("latent_c_n4/3", "abc1234", key, 27.5, 9.0), RecordedRun("latent_c_n4/4", "abc1234", key, 28.5, 11.0),
            RecordedRun("other/1", "abc1234", "0" * 16, 1.0, 1.0)]
    limits = derive(_ctx(path, recorded_runs=runs), "abc1234")
    assert limits.step_s == 28.0
    assert limits.step_source == ("median of 2 earlier run(s) with code abc1234 and this geometry: "
                                  "latent_c_n4/3, latent_c_n4/4")
    assert limits.write_s == 10.0
    assert limits.time_limit.arithmetic == ("(stage-in 2.2 h + 60,000 steps × 28.0 s/step + cold page cache 2.0 min) × "
                                            "1.25 margin = 24.4 d → 24-10:09:00")
    assert derive(_ctx(path, recorded_runs=runs), "fff0000").step_source.startswith("estimate"), \
        "another code version's step time does not count"


def test_a_spec_value_wins_and_warns_when_it_disagrees_badly(tmp_path: Path, cli) -> None:
    path = _spec(tmp_path, data={"selected_layer_indices": [7]}, model={"depth": 1})
    limits = derive(_ctx(path))
    assert limits.time_limit.effective == 30 * 86400 and limits.time_limit.source == "resources.time_limit 30-00:00:00"
    assert limits.time_warning == ("resources.time_limit 30-00:00:00 asks for 30.0 d, 9.8× the derived 3.1 d: "
                                   "a longer queue wait and a hung job found late")
    result = cli("preflight", str(path), "--cluster", "card", "--no-smoke", "--json")
    io = next(c for c in json.loads(result.stdout[: result.stdout.rindex("}") + 1])["checks"] if c["name"] == "io")
    assert io["status"] == "WARN"
    assert io["fix"].startswith("set resources.time_limit: 3-01:34:00 or leave it unset to derive it")


def test_exp_show_prints_each_derived_value_with_its_arithmetic(tmp_path: Path, cli) -> None:
    result = cli("exp", "show", str(_spec(tmp_path, **UNSET)), "--cluster", "card")
    assert result.exit_code == 0, result.output
    section = result.stdout.split("# limits on card (derived from measurement; a value in the spec wins):\n")[1]
    # The console wraps long lines: compared word by word, each expected line starting on its own.
    expected = [
        "  step time 20.3 s/step (data-bound lower bound; compute unmeasured (no GPU smoke); estimate: max(storage "
        "20.3 s, loader CPU unmeasured, compute unmeasured) + 0 s not overlapped (num_workers 0: the rank's batch "
        "loader reads 2 batches ahead on threads) = 20.3 s/step, bound by storage); checkpoint write unknown (no smoke "
        "or earlier run measured one)",
        "  time limit = 17-17:00:00 (derived): (stage-in 2.2 h + 60,000 steps × 20.3 s/step + cold page cache 2.0 min) "
        "× 1.25 margin = 17.7 d → 17-17:00:00 (a lower bound: the step time holds no compute)",
        "  checkpoint interval = 710 steps (derived): non-preemptible core-own: lose at most 4.0 h to a failure → "
        "interval ≤ 4.0 h; 4.0 h ÷ 20.3 s/step = 710 steps",
        "  signal lead = 61 s (derived): (20.3 s step + unmeasured write) × 3 = 60.8 s → 61 s",
    ]
    assert " ".join(section.split()) == " ".join(" ".join(expected).split())
    starts = [line for line in section.splitlines() if line.startswith("  ")]
    assert [line.split()[:2] for line in starts] == [line.split()[:2] for line in expected]


def test_submit_dry_run_uses_and_explains_the_derived_limits(tmp_path: Path, cli, idmctl_home: Path) -> None:
    # An earlier run of this very code and geometry measured 30 s/step and a 12 s checkpoint write.
    path = _spec(tmp_path, **UNSET)
    resolved = load_spec(str(path))
    from idmctl.record.preflights import code_version

    write_progress(idmctl_home / "runs" / "planned" / "7", Progress(
        step=400, total=60000, window_s_per_step=30.0, window_steps=20, attempt_start_step=0, attempt_started_at=0.0,
        updated_at=0.0, spec_hash=resolved.hash, code_version=code_version(), timing_key=timing_key(resolved.spec),
        checkpoint_write_s=12.0))
    result = cli("submit", str(path), "--cluster", "card", "--dry-run")
    assert result.exit_code == 0, result.output
    script = result.stdout
    # (7,946 s stage + 60,000 × 30 s + 2.0 min of cold page cache) × 1.25 = 2,260,082 s → whole minutes
    assert "#SBATCH --time=26-03:49:00\n" in script
    assert "#SBATCH --signal=B:USR1@126\n" in script  # (30 s + 12 s) × 3
    assert f"export {ENV_CHECKPOINT_EVERY}=480\n" in script  # 4 h ÷ 30 s
    assert ("# idmctl: step time 30.0 s/step (measured: 1 earlier run(s) on GPU: planned/7; median of 1 earlier "
            "run(s) with code " in script
            and "this geometry: planned/7); checkpoint write 12.0 s (median of 1 earlier run(s))" in script)
    assert "# idmctl: signal lead = 126 s (derived): (30.0 s step + 12.0 s write) × 3 = 126.0 s → 126 s" in script


@pytest.mark.parametrize(("spec_value", "env", "expected"), [(7, "", 7), (None, "13", 13), (None, "", 20), (7, "13", 7)])
def test_trainer_interval_spec_then_derived_then_a_tenth(tiny_cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         spec_value: int | None, env: str, expected: int) -> None:
    from trainers.train import checkpoint_interval

    monkeypatch.setenv(ENV_CHECKPOINT_EVERY, env)
    spec = load_spec(str(tiny_cache.spec_file(tmp_path, "interval", train={"steps": 200, "checkpoint_every": spec_value}))).spec
    assert checkpoint_interval(spec) == expected


@pytest.mark.parametrize(("direct_read", "told"), [("20GB/s", True), ("8GB/s", False)])
def test_the_read_path_the_plan_chose_reaches_the_job_script(tmp_path: Path, cli, idmctl_home: Path,
                                                             direct_read: str, told: bool) -> None:
    """N=12 dense's working set is far larger than card A's page cache: a measured O_DIRECT rate that beats
    the cached step makes the plan read around the cache, and the job is told so (the trainer's loader reads
    O_DIRECT only when it is); a slower one keeps the page cache and the script says nothing."""
    data = yaml.safe_load(profile_path("card").read_text())
    data["storage"]["direct_read"] = direct_read
    profile = tmp_path / "card_direct.yaml"
    profile.write_text(yaml.safe_dump(data))
    result = cli("submit", "latent_c_n12_dense", "--cluster", str(profile), "--dry-run")
    assert result.exit_code == 0, result.output
    assert (f"export {ENV_LOADER_DIRECT}=1\n" in result.stdout) is told

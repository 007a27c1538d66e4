"""The smoke check: the real trainer in a subprocess (``python -m trainers.smoke``) on a tiny real
cache, and how a crash is reported (last traceback frame + exception)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from idmctl.gate import smoke
from idmctl.gate.tracebacks import last_frame_and_exception
from idmctl.core.checks import CHECK_NAMES, Measurements, PreflightContext, SmokeMeasurement, Status
from idmctl.core.profile import load_profile
from ground.spec import load_spec

REPO = Path(__file__).resolve().parents[3]


def test_last_frame_and_exception_from_a_real_traceback(tmp_path: Path):
    script = tmp_path / "boom.py"
    script.write_text("def build(**kw):\n    raise TypeError('got an unexpected keyword argument x')\n\nbuild(x=1)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 1
    assert last_frame_and_exception(done.stderr) == (
        f"{script}:2 in build → TypeError: got an unexpected keyword argument x")


def test_non_finite_loss_fails_and_finite_passes():
    resolved = load_spec("quickstart")
    profile, _ = load_profile("local")
    nan = SmokeMeasurement(ok=True, losses=[1.2, float("nan"), 0.9], step_s=0.01)
    good = SmokeMeasurement(ok=True, losses=[1.62, 1.3, 1.14], dataset_s=23.0, sample_s=0.7, model_s=39.0,
                            step_s=0.5, peak_mem_bytes=5_460_000_000, params=242_600_000, device="cuda:0")
    bad = smoke.check(PreflightContext(resolved, profile, Measurements(smoke=nan)))
    assert bad.status is Status.FAIL and "losses not finite on cpu: 1.2, nan, 0.9" in bad.summary
    ok = smoke.check(PreflightContext(resolved, profile, Measurements(smoke=good)))
    assert ok.status is Status.PASS
    assert ("3 steps at batch 2 on cuda:0, finite losses 1.62 → 1.3 → 1.14; dataset 23.0 s, sample 0.700 s, "
            "model 39.0 s, 0.500 s/step, peak 5.5 GB, 242.6M params") in ok.summary


def test_a_cpu_smoke_of_a_gpu_job_says_its_step_time_does_not_stand_for_the_gpus():
    resolved = load_spec("latent_c_n4")  # 8 GPUs per node
    profile, _ = load_profile("card")
    on_cpu = SmokeMeasurement(ok=True, losses=[1.0, 0.9, 0.8], step_s=0.5, device="cpu")
    result = smoke.check(PreflightContext(resolved, profile, Measurements(smoke=on_cpu)))
    assert "measured on this host's CPU, which has no GPU: the step time does not stand for the job's 8 GPU(s)" \
        in result.summary
    on_gpu = smoke.check(PreflightContext(resolved, profile, Measurements(smoke=SmokeMeasurement(
        ok=True, losses=[1.0, 0.9, 0.8], step_s=0.5, device="cuda:0"))))
    assert "does not stand for" not in on_gpu.summary


def test_the_innermost_frame_of_the_teams_own_code_is_the_one_named(tmp_path: Path):
    """Job 6262: torch raises inside DataLoader.__init__; the line to fix is the team's call."""
    team, library = tmp_path / "team", tmp_path / "site"
    for folder in (team, library):
        folder.mkdir()
    (library / "lib.py").write_text("def loader(workers, persistent):\n    if persistent and not workers:\n"
                                    "        raise ValueError('persistent_workers option needs num_workers > 0')\n")
    (team / "train.py").write_text("import lib\n\n\ndef main():\n    lib.loader(0, True)\n\n\nmain()\n")
    done = subprocess.run([sys.executable, str(team / "train.py")], capture_output=True, text=True,
                          env={"PYTHONPATH": str(library), "PATH": "/usr/bin:/bin"})
    assert last_frame_and_exception(done.stderr, [team]) == (
        "train.py:5 in main → ValueError: persistent_workers option needs num_workers > 0")
    assert last_frame_and_exception(done.stderr).startswith(f"{library / 'lib.py'}:3 in loader")


def test_cpu_smoke_peak_above_the_jobs_memory_fails():
    resolved = load_spec("quickstart")  # 1 CPU rank, resources.mem 4GB
    profile, _ = load_profile("local")
    heavy = SmokeMeasurement(ok=True, losses=[1.0, 0.9, 0.8], step_s=0.01, peak_mem_bytes=5_000_000_000)
    result = smoke.check(PreflightContext(resolved, profile, Measurements(smoke=heavy)))
    assert result.status is Status.FAIL
    assert "host memory: peak 5.0 GB × 1 ranks = 5.0 GB > resources.mem 4GB → OOM kill" in result.summary


def quickstart_with_data(root: Path) -> Path:
    """The shipped quickstart spec over real data written in its geometry (what `idmctl quickstart` makes)."""
    from trainers.tiny_data import write_tiny_routed_data

    data = write_tiny_routed_data(root / "data", demos=6, valid=2, steps=24, frames=8, frame_stride=2, layers=4,
                                  grid=(4, 4), channels=32, action_dim=7)
    spec = root / "quickstart_here.yaml"
    spec.write_text(f"extends: {REPO / 'experiments' / 'quickstart'}\n"
                    f"data:\n  episodes: {data['episodes']}\n  cache_root: {data['cache_root']}\n")
    return spec


@pytest.mark.slow
def test_quickstart_full_preflight_with_smoke_on_cpu_unlocks_submit(tmp_path: Path, cli, monkeypatch):
    from idmctl.record import preflights as record
    from idmctl.record.preflights import require_pass

    # Other commits land in a shared tree while this runs; pin the code version (tested on its own).
    monkeypatch.setattr(record, "code_version", lambda: "pinned-for-test")

    spec_path = quickstart_with_data(tmp_path)
    result = cli("preflight", str(spec_path), "--json")
    report = json.loads(result.stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    assert result.exit_code == 0, by_name
    assert {name: c["status"] for name, c in by_name.items()} == dict.fromkeys(CHECK_NAMES, "PASS")
    smoke_numbers = by_name["smoke"]["numbers"]
    assert len(smoke_numbers["losses"]) == 3 and smoke_numbers["device"] == "cpu"
    # The CPU job gets the CPU smoke's compute time, as one of the step's three terms.
    assert re.search(r"; compute [0-9.]+ m?s \(smoke ", by_name["io"]["summary"]), by_name["io"]["summary"]
    assert by_name["io"]["numbers"]["compute_s_per_step"] is not None
    # ...and the loader's CPU per GB the smoke measured on the job's own data path reaches the plan.
    assert smoke_numbers["loader_cpu_s_per_gb"] is not None and smoke_numbers["loader_cpu_s_per_gb"] > 0
    assert "loader CPU not measured" not in by_name["io"]["summary"] and "loader CPU unmeasured" not in by_name["io"]["summary"]
    assert report["unlocks_submit"] is True
    profile, profile_hash = load_profile("local")
    assert require_pass(load_spec(str(spec_path)), profile, profile_hash).id == report["run_id"]

    # Edit the spec after the pass: submit refuses, saying so.
    spec_path.write_text(spec_path.read_text().replace("data:\n", "train:\n  steps: 300\ndata:\n"))
    refused = cli("submit", str(spec_path))
    assert refused.exit_code == 1
    assert "spec changed since preflight #" in refused.stderr


def test_real_smoke_crash_shows_the_failing_frame(tmp_path: Path):
    spec_path = quickstart_with_data(tmp_path)
    # The cache files hold 32 channels; a spec saying 64 makes the real dataset refuse at construction.
    spec_path.write_text(spec_path.read_text() + "  channels: 64\n")
    measured = smoke.run_smoke(load_spec(str(spec_path)), timeout_s=120)
    assert not measured.ok
    assert measured.error.startswith("exit ") and "channels 32 but the spec says 64" in measured.error

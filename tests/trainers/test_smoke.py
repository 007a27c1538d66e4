"""trainers.smoke: the trainer's factories, real steps, one JSON line — in-process and as preflight runs it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ground.errors import UserError
from ground.paths import REPO_ROOT
from ground.spec.loader import load_spec
from trainers.smoke import run_smoke


def test_run_smoke_reports_timings_and_finite_losses(tiny_cache) -> None:
    spec = load_spec(str(tiny_cache.spec_path)).spec
    report = run_smoke(spec, steps=3, batch_size=2)
    assert report["device"] == "cpu" and report["batch_size"] == 2
    assert len(report["losses"]) == 3 and report["all_finite"] is True
    assert all(math.isfinite(x) and x > 0 for x in report["losses"])
    for key in ("dataset_s", "sample_s", "model_s", "step_s"):
        assert report[key] > 0, key
    assert report["peak_mem_bytes"] > 10_000_000  # a Python process with torch loaded is > 10 MB
    assert report["samples"] == 6 * 5  # 6 train demos × (6 frames − window 2 + 1)
    from trainers.registry import build_model

    assert report["params"] == sum(p.numel() for p in build_model(spec, device="meta").parameters())
    # One fsynced model + AdamW state write, timed for the derived checkpoint interval and signal lead:
    # fp32 weights + two moments ≈ 3 × 4 B per parameter, plus pickle framing.
    assert report["checkpoint_s"] > 0 and report["checkpoint_bytes"] >= 12 * report["params"]


def test_smoke_with_repeats_steps_on_distinct_samples_times_k(tiny_cache, tmp_path: Path) -> None:
    spec = load_spec(str(tiny_cache.spec_file(tmp_path, "k2", loader={"batch_size": 2, "repeats": 2}))).spec
    report = run_smoke(spec, steps=2, batch_size=2)
    assert report["batch_size"] == 2 and report["all_finite"] is True  # 1 distinct sample × 2 copies per step


def test_smoke_module_prints_one_json_line_for_preflight(tiny_cache, tmp_path: Path) -> None:
    spec_json = tmp_path / "canonical_spec.json"
    spec_json.write_text(load_spec(str(tiny_cache.spec_path)).canonical_json)
    done = subprocess.run([sys.executable, "-m", "trainers.smoke", "--spec-json", str(spec_json)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["all_finite"] and len(report["losses"]) == 3


def test_smoke_fails_on_the_wrong_dataset_class_like_job_6321(tiny_cache, tmp_path: Path) -> None:
    # Card A job 6321: the routed model fed by the single-layer dataset class. The smoke uses the
    # trainer's factory, so it fails the same way the job would, in seconds.
    path = tiny_cache.spec_file(tmp_path, "wrong_class", data={"dataset": "hidden_single_layer"})
    with pytest.raises(TypeError, match="selected_layer_indices"):
        run_smoke(load_spec(str(path)).spec)


def test_smoke_names_the_field_when_the_cache_is_missing(tiny_cache, tmp_path: Path) -> None:
    path = tiny_cache.spec_file(tmp_path, "no_cache", data={"cache_root": str(tmp_path / "nowhere")})
    with pytest.raises(UserError) as caught:
        run_smoke(load_spec(str(path)).spec)
    assert caught.value.field == "data.cache_root"


def test_smoke_measures_the_loaders_cpu_per_gb_on_the_jobs_own_data_path(tiny_cache) -> None:
    """The batch loader reads real batches of the job's cache; the CPU of every thread over the
    hidden-state bytes it read (exactly the ranges: batches × batch × sample bytes)."""
    from cache.registry import build_dataset
    from trainers.smoke import LOADER_MEASURE_MIN_BATCHES

    spec = load_spec(str(tiny_cache.spec_path)).spec
    report = run_smoke(spec, steps=1, batch_size=2)
    shape, dtype = build_dataset(spec, "train").hidden_shape()
    sample = math.prod(shape) * dtype.itemsize
    samples = max(LOADER_MEASURE_MIN_BATCHES, 30 // 2) * 2  # the whole split of 30 once, in batches of 2
    assert report["loader_bytes"] == samples * sample
    assert report["loader_cpu_s"] > 0 and report["loader_wall_s"] > 0
    assert report["loader_cpu_s_per_gb"] == pytest.approx(report["loader_cpu_s"] / (report["loader_bytes"] / 1e9))
    # The tiny cache's ranges are not whole 4 KiB pages: the O_DIRECT pass fell back to the page cache, and a
    # figure that is not O_DIRECT's is not reported as O_DIRECT's.
    assert sample % 4096 != 0 and report["loader_direct_cpu_s_per_gb"] is None

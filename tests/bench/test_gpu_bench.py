"""The GPU path is not dead code: bench.gpu, bench.gpu_proof (through bench/gpu.sh) and the smoke run
every line on the CPU (reduced size, bf16 autocast), and the one device call that once recursed forever
is checked on its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import gpu
from ground.paths import REPO_ROOT
from ground.spec.loader import load_spec
from trainers.smoke import run_smoke


def test_gpu_bench_runs_on_cpu_at_reduced_size_in_bf16(tmp_path: Path) -> None:
    out = tmp_path / "gpu_cpu.json"
    done = subprocess.run([sys.executable, "-m", "bench.gpu", "--device", "cpu", "--steps", "1", "--warmup", "1",
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    for kind, (n, depth) in {"routed": (4, 4), "dense": (12, 12)}.items():
        row = result[kind]
        # The card's structure (routing N, depth) at reduced widths, through the same factory.
        assert (row["routing_n"], row["depth"], row["device"], row["reduced"]) == (n, depth, "cpu", True)
        assert row["matmul_dtypes"] == ["torch.bfloat16"], row["matmul_dtypes"]  # autocast really ran in bf16
        assert row["loss_finite"] and len(row["step_seconds"]) == 1 and row["peak_mem_bytes"] > 0
        assert row["context_arithmetic"] == f"2 × {n} layers × 5 frames × 3 × 4 tokens = {2 * n * 60:,} tokens per step"
    figures = gpu.figures_from(result, recorded=False)
    assert [f.name for f in figures][1] == "latent_c_n4 seconds per optimizer step"


def test_cuda_synchronize_calls_torch_not_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    gpu.synchronize(torch.device("cuda", 0))
    gpu.synchronize(torch.device("cpu"))
    assert calls == [torch.device("cuda", 0)]


def test_cuda_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert gpu.main(["--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: no CUDA device visible (torch.cuda.is_available() is False; --device cpu runs the reduced size)"]


def test_smoke_runs_the_gpu_precision_on_cpu(tiny_cache) -> None:
    spec = load_spec(str(tiny_cache.spec_path)).spec
    report = run_smoke(spec, steps=2, batch_size=2, device="cpu", bf16=True)
    assert (report["device"], report["precision"]) == ("cpu", "bf16 autocast")
    assert report["all_finite"] and len(report["losses"]) == 2
    fp32 = run_smoke(spec, steps=2, batch_size=2, device="cpu")
    assert fp32["precision"] == "fp32"
    assert fp32["losses"] != report["losses"]  # bf16 rounding changes the numbers: the autocast was on


@pytest.mark.slow
def test_gpu_sh_runs_the_whole_proof_on_cpu_and_says_it_was_not_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "proof"
    done = subprocess.run(["bash", str(REPO_ROOT / "bench" / "gpu.sh"), "--device", "cpu", str(out)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    proof = json.loads((out / "gpu_proof.json").read_text())
    assert proof["measured_on_gpu"] is False and proof["nvml"]["gpu_util_mean"] is None
    smoke, fabric, build = proof["smoke"], proof["fabric"], proof["hidden_build"]
    # The smoke: the card's structure (12 cached layers, N=4) over a synthetic cache, bf16, finite losses.
    assert smoke["precision"] == "bf16 autocast" and smoke["all_finite"] and len(smoke["losses"]) == 3
    assert smoke["geometry"] == "12 layers × 6 frames × 3 × 4 × 64 bf16 per demo, 2 demos"
    assert all(smoke[key] > 0 for key in ("dataset_s", "sample_s", "model_s", "step_s", "peak_mem_bytes"))
    # Fabric's bf16-mixed DDP on one device: a real process group (gloo here, NCCL on a GPU).
    assert (fabric["precision"], fabric["strategy"], fabric["world_size"], fabric["backend"]) == (
        "bf16-mixed", "ddp", 1, "gloo") and fabric["loss_finite"]
    # The builder's path for one window: 5 latent frames from 17 video frames, every cached layer captured.
    assert build["latents"][2] == 5 and build["video"][2] == 17 and build["captured_layers"] == 2 and build["finite"]
    assert build["tokens"] == 5 * 3 * 4 and build["precision"] == "fp32"
    report = (out / "BENCHMARKS.md").read_text()
    assert "## GPU figures" in report and "## GPU proof: smoke, Fabric DDP, full-width build, NVML" in report
    proof_rows = [line for line in report.split("## GPU proof")[1].splitlines() if line.startswith("| ") and "|---" not in line][1:]
    assert len(proof_rows) == 7 and all("not measured on a GPU" in row for row in proof_rows), proof_rows
    # The loader's old and new paths side by side (reduced size on the CPU: nothing crosses to a device).
    loader = json.loads((out / "gpu_loader.json").read_text())
    assert loader["measured_on_gpu"] is False and loader["bf16_hidden_bytes_per_step"] == 2 * 4 * 5 * 3 * 4 * 64 * 2
    for path in ("new", "old"):
        row = loader[path]
        assert row["loss_finite"] and row["steps"] == 4 and row["h2d_bytes_per_step"] == 0 and row["nvml_samples"] == 0
        assert 0 <= row["data_wait_frac"] < 1 and row["s_per_step"] > 0


def test_gpu_sh_refuses_an_unknown_device(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(REPO_ROOT / "bench" / "gpu.sh"), "--device", "tpu", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == "gpu.sh: error: --device tpu: use cuda or cpu"

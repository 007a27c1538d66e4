"""The GPU path is not dead code: bench.gpu and the smoke run every line on the CPU (reduced size,
bf16 autocast), and the one device call that once recursed forever is checked on its own."""

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

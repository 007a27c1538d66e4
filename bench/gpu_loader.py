"""The loader on a GPU, old path against new, side by side in one run: ``latent_c_n4`` at B=2 over a
synthetic cache of card A's geometry (``bench.gpu_proof._smoke_spec``), bf16 autocast, 100 steps each.

- **old**: torch's DataLoader in the rank's process (``num_workers 0``, ``pin_memory``), each sample's
  hidden states converted to float32 on the host (``hidden.float()``, what ``cache.dataset`` did),
  default collate, a blocking copy to the device: twice the cache's bytes cross PCIe.
- **new**: the trainer's batch loader (``cache.batches.trainer_batches``): exact ranges into pinned bf16
  buffers two batches ahead, ``non_blocking`` copies, the model converting on the device.

Per path, at steady state (after ``warmup`` steps): ``data_wait_frac`` (time in ``next()`` and the
host → device copy ÷ step time; the trainer's own metric times ``next()`` alone), NVML's GPU utilisation sampled every 0.2 s (as the efficiency report reads
it), seconds per step, and the bytes copied host → device per step (counted from the tensors moved:
the new path's hidden bytes are the cache's bf16 bytes). The cache holds two demos, so after the first
pass the windows come from the page cache: the figures judge the loader's CPU path and the copy, not
the disk (``bench.loader_steady`` judges the disk).

``python -m bench.gpu_loader --device cuda --out FILE [--steps 100 --warmup 10]``; ``--device cpu``
runs it at reduced size (no NVML, no pinning) so the code path stays alive without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


class _OldSamples:
    """The dataset as it was: each sample's hidden states as float32, made on the host."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: int) -> dict[str, Any]:
        sample = self.dataset[item]
        return {**sample, "hidden": sample["hidden"].float()}


def _batches(path: str, dataset: Any, batch_size: int, device: Any) -> Any:
    import itertools

    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from cache.batches import BatchLoader, sampler_batches

    if path == "new":
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
        return BatchLoader(dataset, sampler_batches(sampler, batch_size), batch_size, device)
    loader = DataLoader(_OldSamples(dataset), batch_size=batch_size, shuffle=True, num_workers=0,
                        pin_memory=device.type == "cuda", generator=torch.Generator().manual_seed(0))
    return itertools.chain.from_iterable(itertools.repeat(loader))


def measure_path(path: str, spec: Any, steps: int, warmup: int, device_name: str) -> dict[str, Any]:
    import torch

    from bench.gpu import synchronize
    from bench.gpu_proof import NvmlSampler
    from cache.registry import build_dataset
    from trainers.registry import build_model
    from trainers.train import noise_generator

    device = torch.device(device_name)
    torch.manual_seed(0)
    model = build_model(spec, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr)
    dataset = build_dataset(spec, "train")
    batches = _batches(path, dataset, 2, device)
    waits, seconds, h2d = [], [], []
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    sampler = NvmlSampler(device if device.type == "cuda" else None)
    for step in range(steps):
        if step == warmup:
            sampler.__enter__()
        started = time.perf_counter()
        batch = next(batches)
        moved = 0
        tensors = {}
        for key in ("hidden", "actions", "action_mask"):
            value = batch[key]
            if value.device != device:
                moved += value.numel() * value.element_size()
                value = value.to(device)
            elif device.type == "cuda":  # the batch loader moved it already: count what it sent
                moved += value.numel() * value.element_size()
            tensors[key] = value
        waited = time.perf_counter() - started
        with autocast:
            loss = model(tensors["hidden"], tensors["actions"], tensors["action_mask"],
                         generator=noise_generator(0, step, 0, 0))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if step >= warmup:
            waits.append(waited)
            seconds.append(time.perf_counter() - started)
            h2d.append(moved)
    sampler.__exit__()
    if hasattr(batches, "close"):
        batches.close()
    return {"path": path, "device": str(device), "steps": steps, "warmup": warmup,
            "data_wait_frac": sum(waits) / sum(seconds), "s_per_step": statistics.median(seconds),
            "h2d_bytes_per_step": statistics.median(h2d), "nvml_utilisation_mean":
            statistics.mean(sampler.samples) if sampler.samples else None,
            "nvml_samples": len(sampler.samples), "loss_finite": bool(torch.isfinite(loss.detach()).item())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    import torch

    from bench.gpu_proof import _smoke_spec

    if args.device == "cpu":
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench_gpu_loader_") as tmp:
        spec = _smoke_spec(args.device, Path(tmp))
        sample = spec.data.routing_n * spec.data.frame_window * spec.data.token_grid[0] * spec.data.token_grid[1] \
            * spec.data.channels * 2
        result: dict[str, Any] = {"measured_on_gpu": args.device == "cuda", "batch_size": 2,
                                  "bf16_hidden_bytes_per_step": 2 * sample}
        # New first, each path written as soon as it ends: a timeout on the slow old path keeps the new one.
        for path in ("new", "old"):
            result[path] = measure_path(path, spec, args.steps, args.warmup, args.device)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

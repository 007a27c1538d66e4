"""The training loader in steady state against fio on the very ranges it drew.

Card A's DataLoader — ``cache.registry.build_dataloader`` over ``HiddenMultiLayerDataset``, the
spec's workers and repeats (``latent_c_n4``: 0 workers, repeats 1), N=4 routed layers, 5-frame
windows — draws random windows across many card-geometry safetensors files written for the bench
(27 × 48 × 5120 bf16 frames; the sampler's own shuffled order). Every batch starts from a cold page
cache (the files are evicted between ``next()`` calls, outside the timing), as on card A, where the
2.38 TB working set is far larger than any page cache. The ranges the loader read are recorded from
the sampler's indices and the same list, in the same order, one wave of N ranges per sample, is read
by ``fio`` (``bench/fio.py``); loader and fio passes are interleaved.

The loader does more than read: each sample's bf16 slice becomes float32 (``hidden.float()``), the
HDF5 targets are read, and ``default_collate`` stacks the batch. Those costs are measured on their
own, once, so the note says what bounds the loader when it misses.

``python -m bench.loader_steady [--fast]`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import fio
from bench.common import Figure, print_figures
from bench.hidden_reads import _cold, _read_bytes, scheduler_seconds, slice_ranges

SPEC = "latent_c_n4"
LAYERS = 12
GEOMETRY = {False: dict(files=6, frames=12, grid=(27, 48), channels=5120, batches=8),
            True: dict(files=3, frames=8, grid=(8, 8), channels=512, batches=2)}
"""By ``fast``. Full: six files of 12 layers × 12 frames (1.9 GB each, 48 windows), card A's frame size
(13,271,040 B) so each routed range is card A's 66,355,200 B; 8 batches a pass."""
BATCH_SIZE = 2
"""Distinct samples per batch here (card A: 8). A card-A sample is 531 MB once float32, so 8 per batch
plus the collated copy is ~8.5 GB: too much beside seven other helpers on a 24 GiB machine. The
per-sample work is the same; only the batch is smaller."""


def _write_cache(root: Path, files: int, frames: int, grid: tuple[int, int], channels: int) -> dict[str, Any]:
    """Episodes HDF5 and one safetensors hidden cache per demo (random bytes: the content is never decoded)."""
    from cache.episodes import Demo, write_episodes
    from cache.hidden import cache_file, write_layers

    rng = np.random.default_rng(0)
    layer_bytes = frames * grid[0] * grid[1] * channels * 2
    names = [f"demo_{i}" for i in range(files)]
    for name in names:
        write_layers(cache_file(root / "hidden", name, "safetensors"), list(range(LAYERS)),
                     (frames, *grid, channels), "bfloat16",
                     (rng.integers(0, 256, layer_bytes, dtype=np.uint8) for _ in range(LAYERS)),
                     {"demo": name, "frame_stride": 1, "encoder": "bench"})
    steps = frames
    demos = [Demo(name, rng.normal(size=(steps, 12)).astype(np.float32), np.zeros((steps, 2)),
                  obs={"robot0_eef_pos": rng.normal(size=(steps, 3)).astype(np.float32)}) for name in names]
    write_episodes(root / "episodes.hdf5", demos, env_args={"env_name": "bench"},
                   splits={"train": names, "valid": names[-1:]})
    return {"data.episodes": str(root / "episodes.hdf5"), "data.cache_root": str(root / "hidden"),
            "data.cache_format": "safetensors", "data.cached_layers": list(range(LAYERS)),
            "data.frames": frames, "data.token_grid": list(grid), "data.channels": channels,
            "data.cache_files": files, "loader.batch_size": BATCH_SIZE}


def _loader_pass(loader: Any, batches: int, files: list[Path]) -> tuple[float, float, float, float]:
    """(seconds inside ``next()``, bytes from disk, CPU seconds, seconds waiting for a CPU) for
    ``batches`` batches, each from a cold cache."""
    seconds = disk = cpu = queued = 0.0
    iterator = iter(loader)
    for _ in range(batches):
        fio.evict(files)
        (cpu_before, queued_before), before, start = scheduler_seconds(), _read_bytes(), time.perf_counter()
        next(iterator)
        seconds += time.perf_counter() - start
        disk += _read_bytes() - before
        cpu_after, queued_after = scheduler_seconds()
        cpu, queued = cpu + cpu_after - cpu_before, queued + queued_after - queued_before
    del iterator
    return seconds, disk, cpu, queued


def _bounds(dataset: Any, drawn: list[int], files: list[Path]) -> dict[str, float]:
    """Seconds per sample of each part of ``__getitem__``, over the drawn samples: the exact read (cold),
    bf16 → float32, the HDF5 targets; and the collate of one batch."""
    import torch
    from torch.utils.data import default_collate

    from cache.hidden import read_hidden

    read, convert, targets = [], [], []
    samples = []
    for item in drawn[:BATCH_SIZE * 2]:
        entry, start = dataset.index.windows[item]
        seconds, _ = _cold(entry.info.path, lambda: samples.append(
            read_hidden(entry.info.path, list(entry.positions), start, dataset.frame_window, info=entry.info)), 1)
        fio.evict(files)
        read += seconds
        began = time.perf_counter()
        as_float = samples.pop().float()
        convert.append(time.perf_counter() - began)
        began = time.perf_counter()
        dataset.index.targets(entry, start, dataset.action_horizon)
        targets.append(time.perf_counter() - began)
        samples.append(as_float)
        if len(samples) > BATCH_SIZE:
            samples.pop(0)
    began = time.perf_counter()
    default_collate([{"hidden": s} for s in samples])
    collate = time.perf_counter() - began
    dataset.index.episodes.close()
    del samples
    return {"read": statistics.median(read), "float": statistics.median(convert),
            "targets": statistics.median(targets), "collate_per_sample": collate / BATCH_SIZE}


def run(fast: bool) -> list[Figure] | str:
    import torch

    from cache.registry import build_dataloader
    from ground.spec.loader import load_spec
    from ground.spec.overrides import apply_overrides

    if (why := fio.unavailable()) is not None:
        return f"not measured: {why}"
    torch.set_num_threads(1)
    geometry = GEOMETRY[fast]
    repeats = 1 if fast else 3
    with tempfile.TemporaryDirectory(prefix="bench_loader_", dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        overrides = _write_cache(root, geometry["files"], geometry["frames"], geometry["grid"], geometry["channels"])
        spec = apply_overrides(load_spec(SPEC), overrides, source="bench.loader_steady").spec
        loader = build_dataloader(spec, "train", shuffle=True, seed=spec.train.seed)
        dataset = loader.dataset
        samples = geometry["batches"] * loader.batch_size
        drawn = list(loader.sampler)[:samples]  # the order the loader reads: the sampler is seeded by epoch
        waves = []
        for item in drawn:
            entry, start = dataset.index.windows[item]
            waves.append(slice_ranges(entry.info, list(entry.positions), start, dataset.frame_window))
        useful = sum(length for wave in waves for _, _, length in wave)
        files = sorted({path for wave in waves for path, _, _ in wave})
        all_files = sorted((root / "hidden").glob("*.safetensors"))
        depth, rates = fio.best_depth(waves[:4], depths=(16,) if fast else fio.DEPTHS)
        loader_rates, fio_rates, disk, spent = [], [], [], []
        for _ in range(repeats):
            seconds, read, cpu, queued = _loader_pass(loader, geometry["batches"], all_files)
            spent.append((seconds, cpu, queued))
            loader_rates.append(useful / seconds / 1e6)
            disk.append(read)
            fio_rates.append(fio.read_ranges(waves, depth).mb_per_s)
        parts = _bounds(dataset, drawn, all_files)
    per_sample = sum(parts.values())
    wall, cpu, queued = (statistics.median(values) for values in zip(*spent))
    range_bytes = waves[0][0][2]
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, shared with other helpers' work"
    workers = spec.loader.num_workers
    return [
        Figure(f"{SPEC} DataLoader, steady state: useful throughput", "MB/s", loader_rates,
               f"fio io_uring O_DIRECT depth {depth}, the same ranges in the same order", fio_rates,
               higher_is_better=True, target="≥ 0.85× fio on the same ranges",
               note=(f"{samples} random windows from {len(files)} of {len(all_files)} files "
                     f"({len(waves[0])} ranges of {range_bytes:,} B each; {useful:,} B a pass), {workers} workers, "
                     f"repeats {spec.loader.repeats}, {BATCH_SIZE} samples a batch, cold cache per batch; "
                     f"per sample: exact read {parts['read'] * 1e3:.0f} ms + bf16→float32 {parts['float'] * 1e3:.0f} ms "
                     f"+ HDF5 targets {parts['targets'] * 1e3:.1f} ms + collate {parts['collate_per_sample'] * 1e3:.0f} ms "
                     f"= {per_sample * 1e3:.0f} ms; the read alone is {parts['read'] / per_sample:.0%} of it "
                     f"({len(waves[0]) * range_bytes / parts['read'] / 1e6:,.0f} MB/s), the rest is CPU in the one "
                     f"loading process; a pass (medians): {wall:.1f} s wall, CPU {cpu:.1f} s and {queued:.1f} s waiting "
                     f"for a CPU over the loader's threads; {load}")),
        Figure(f"{SPEC} DataLoader, steady state: bytes from disk per pass", "B", disk, "the ranges' bytes",
               [float(useful)], target="≤ 1.1× the ranges",
               note=f"read_bytes of this process (0 workers: the loader reads here); fio depths tried (MB/s): "
                    + ", ".join(f"{d}: {r:,.0f}" for d, r in rates.items())),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="three tiny files instead of six of 1.9 GB")
    print_figures(run(parser.parse_args().fast))


if __name__ == "__main__":
    main()

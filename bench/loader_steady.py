"""The trainer's loader in steady state against fio on the very ranges it drew, and its CPU per byte
against a plain memcpy of the same bytes.

Card A's loader — ``latent_c_n4`` (0 workers, repeats 1) through the trainer's own door
(``cache.batches.trainer_batches`` over ``cache.registry.build_dataloader``): each batch's exact byte
ranges are read by ``preadv`` into a preallocated buffer in bf16, two batches ahead — over
card-geometry safetensors files written for the bench (27 × 48 × 5120 bf16 frames, N=4 routed layers,
5-frame windows). The windows do not overlap (each range is read from disk once: no page-cache hit
flatters the loader), in a shuffled order; the page cache is emptied before each pass, as on card A,
where the 2.38 TB working set is far larger than any page cache. ``fio`` (``bench/fio.py``) reads the
same list of ranges, in the same order, one wave of N ranges per sample; loader and fio passes are
interleaved.

Both through the page cache (the trainer's default: card A's page cache serves 67 % of a step) and
with O_DIRECT (``direct=True``), pass by pass.

CPU: every thread's CPU time of this process (``time.process_time``: the reader thread, the ``preadv``
pool, the HDF5 targets, the kernel's copies) over a pass ÷ the bytes it delivered, against
``numpy.copyto`` of the same number of bytes between two buffers of a batch's size, in the same run.
Through the page cache from an empty cache most of it is the kernel's (block path, page-cache fill, copy
to user), so fio reads the same ranges buffered too (``direct=0``, no readahead, as the loader's fds):
that CPU per GB is the floor of the buffered path, and the CPU row's note splits the loader's figure into
it and the rest (and the user CPU, the loader's own Python, from ``os.times``).

``python -m bench.loader_steady [--fast]`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import fio
from bench.common import Figure, print_figures
from bench.hidden_reads import _read_bytes, slice_ranges

SPEC = "latent_c_n4"
LAYERS = 12
GEOMETRY = {False: dict(files=6, frames=10, grid=(27, 48), channels=5120),
            True: dict(files=3, frames=10, grid=(8, 8), channels=512)}
"""By ``fast``. Full: six files of 12 layers × 10 frames (1.6 GB each), card A's frame size
(13,271,040 B) so each routed range is card A's 66,355,200 B; two non-overlapping 5-frame windows a
file: 12 samples (3.2 GB) a pass."""
BATCH_SIZE = 2
"""Distinct samples per batch here (card A: 8); 3 buffers of 2 × 265 MB fit beside seven other helpers
on a 24 GiB machine. The per-byte work is the same."""


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


def _loader_pass(dataset: Any, order: list[list[int]], files: list[Path],
                 direct: bool = False, cold: bool = True) -> tuple[float, float, float, int, float]:
    """(wall seconds, bytes from disk, CPU seconds of every thread, bytes delivered, of that CPU the user
    part) for one pass over ``order`` through the trainer's batch loader, from an empty page cache
    (``direct``: O_DIRECT; ``cold=False``: as the last pass left it, every range a page-cache hit). User
    CPU is the loader's own (Python, targets); system CPU is the kernel's."""
    from cache.batches import BatchLoader

    loader = BatchLoader(dataset, order, BATCH_SIZE, direct=direct, start=False)  # buffers allocated, faulted in
    if cold:
        fio.evict(files)
    before, cpu, user, start = _read_bytes(), time.process_time(), os.times().user, time.perf_counter()
    loader.start()
    for _ in loader:
        pass
    seconds, cpu, user = time.perf_counter() - start, time.process_time() - cpu, os.times().user - user
    if direct and loader.direct_bytes != loader.bytes_read:
        raise RuntimeError(f"only {loader.direct_bytes:,} of {loader.bytes_read:,} B went through O_DIRECT")
    return seconds, float(_read_bytes() - before), cpu, loader.bytes_read, user


def _memcpy_cpu(total: int, chunk: int) -> float:
    """CPU seconds of copying ``total`` bytes between two ``chunk``-byte buffers (numpy.copyto)."""
    source = np.ones(chunk, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # both buffers faulted in before the clock starts
    cpu = time.process_time()
    done = 0
    while done < total:
        np.copyto(target, source)
        done += chunk
    return (time.process_time() - cpu) * total / done


FIO_BUFFERED_HINT = "random"
"""fio's ``fadvise_hint`` for the buffered reference: ``POSIX_FADV_RANDOM``, as ``cache.hidden.open_for_ranges``
advises the loader's fds (the kernel reads the asked ranges, no readahead beyond them)."""


def _fio_pass(waves: list, depth: int, useful: int, buffered: str | None = None) -> tuple[float, float]:
    """(MB/s, CPU seconds per GB) of one fio run over the ranges from an empty page cache: fio's user + system
    CPU (getrusage of the child, its start-up included) ÷ the ranges' bytes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    rate = fio.read_ranges(waves, depth, buffered=buffered).mb_per_s
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return rate, (after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime) / (useful / 1e9)


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
        window = dataset.frame_window
        # Non-overlapping windows (start a multiple of the window), in the sampler's shuffled order.
        drawn = [item for item in loader.sampler if dataset.index.windows[item][1] % window == 0]
        order = [drawn[i:i + BATCH_SIZE] for i in range(0, len(drawn) - BATCH_SIZE + 1, BATCH_SIZE)]
        waves = []
        for batch in order:
            for item in batch:
                entry, start = dataset.index.windows[item]
                waves.append(slice_ranges(entry.info, list(entry.positions), start, window))
        useful = sum(length for wave in waves for _, _, length in wave)
        all_files = sorted((root / "hidden").glob("*.safetensors"))
        depth, rates = fio.best_depth(waves[:4], depths=(16,) if fast else fio.DEPTHS)
        loader_rates, fio_rates, disk, cpu_per_gb, copy_per_gb, walls = [], [], [], [], [], []
        direct_rates, direct_cpu, fio_cpu, buffered_cpu, buffered_rates, user_per_gb = [], [], [], [], [], []
        hit_cpu, hit_disk = [], []
        for _ in range(repeats):
            seconds, _, cpu, _, _ = _loader_pass(dataset, order, all_files, direct=True)
            direct_rates.append(useful / seconds / 1e6)
            direct_cpu.append(cpu / (useful / 1e9))
            seconds, read, cpu, delivered, user = _loader_pass(dataset, order, all_files)
            if delivered != useful:
                raise RuntimeError(f"the loader delivered {delivered:,} B, the ranges hold {useful:,} B")
            walls.append(seconds)
            loader_rates.append(useful / seconds / 1e6)
            disk.append(read)
            cpu_per_gb.append(cpu / (useful / 1e9))
            user_per_gb.append(user / (useful / 1e9))
            # Again with every range now in the page cache: the CPU of a hit, against the miss above (the
            # smoke drops the cache before it measures, so its figure is the miss's: an upper bound).
            _, read, cpu, _, _ = _loader_pass(dataset, order, all_files, cold=False)
            hit_cpu.append(cpu / (useful / 1e9))
            hit_disk.append(read)
            copy_per_gb.append(_memcpy_cpu(useful, BATCH_SIZE * len(waves[0]) * waves[0][0][2]) / (useful / 1e9))
            rate, cpu = _fio_pass(waves, depth, useful)
            fio_rates.append(rate)
            fio_cpu.append(cpu)
            # The kernel's own cost of the buffered path on these ranges: fio through the page cache with the
            # loader's advice (no readahead), from an empty cache, so a figure the loader cannot beat.
            rate, cpu = _fio_pass(waves, depth, useful, buffered=FIO_BUFFERED_HINT)
            buffered_rates.append(rate)
            buffered_cpu.append(cpu)
        dataset.index.episodes.close()
    range_bytes = waves[0][0][2]
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, shared with other helpers' work"
    where = (f"{len(waves)} non-overlapping windows from {len(all_files)} files ({len(waves[0])} ranges of "
             f"{range_bytes:,} B each; {useful:,} B a pass) in {len(order)} batches of {BATCH_SIZE}, "
             f"{spec.loader.num_workers} workers, prefetch 2, page cache emptied before each pass")
    return [
        Figure(f"{SPEC} batch loader, steady state: useful throughput", "MB/s", loader_rates,
               f"fio io_uring O_DIRECT depth {depth}, the same ranges in the same order", fio_rates,
               higher_is_better=True, target="≥ 0.85× fio on the same ranges",
               note=f"{where}; a pass: {statistics.median(walls):.1f} s wall (median); {load}"),
        Figure(f"{SPEC} batch loader: CPU seconds per GB delivered", "s", cpu_per_gb,
               "numpy.copyto of the same bytes, same run", copy_per_gb, target="≤ 1.5×",
               note=("process CPU (every thread: reader, preadv pool, HDF5 targets, kernel copies) over a pass "
                     f"÷ its bytes; the copy moves {BATCH_SIZE * len(waves[0]) * range_bytes:,} B (a batch) at a time, "
                     f"warm; {_kernel_share(cpu_per_gb, buffered_cpu, copy_per_gb)}; user CPU (the loader's Python, "
                     f"the targets) {statistics.median(user_per_gb):.3f} s/GB, the rest is system CPU; {load}")),
        Figure(f"{SPEC} batch loader, every range a page-cache hit: CPU seconds per GB delivered (context)", "s",
               hit_cpu, "numpy.copyto of the same bytes, same run", copy_per_gb,
               note=(f"the pass right after a cold one, nothing evicted ({statistics.median(hit_disk):,.0f} B from "
                     "disk): the copy out of the page cache alone. A job's page-cache path costs hits × this + "
                     "misses × the cold row (card A: 67 % hits); the smoke measures the cold row's path (an upper "
                     f"bound for the hits); {load}")),
        Figure(f"{SPEC} batch loader, O_DIRECT (direct=True): useful throughput", "MB/s", direct_rates,
               f"fio io_uring O_DIRECT depth {depth}, the same ranges in the same order", fio_rates,
               higher_is_better=True, target="≥ 0.85× fio on the same ranges",
               note=f"the same passes with the ranges read around the page cache (card A's frames are whole "
                    f"pages, so every range qualifies); {load}"),
        Figure(f"{SPEC} batch loader, O_DIRECT: CPU seconds per GB delivered", "s", direct_cpu,
               "numpy.copyto of the same bytes, same run", copy_per_gb, target="≤ 1.5×",
               note=f"no kernel copy: the device writes into the buffer; {load}"),
        Figure("fio io_uring buffered (direct=0, fadvise random) on the same ranges: CPU seconds per GB (context)",
               "s", buffered_cpu, "numpy.copyto of the same bytes, same run", copy_per_gb,
               note=("fio's user + system CPU ÷ the bytes, through the page cache from an empty cache as the loader "
                     "reads: the kernel's block path + page-cache fill + copy to user, with no loader at all "
                     f"({statistics.median(buffered_rates):,.0f} MB/s median); {load}")),
        Figure("fio io_uring O_DIRECT on the same ranges: CPU seconds per GB (context)", "s", fio_cpu,
               "numpy.copyto of the same bytes, same run", copy_per_gb,
               note=("fio's user + system CPU (getrusage of the child, its start-up included) ÷ the bytes: what "
                     f"the kernel's block path costs on this VM without any loader; {load}")),
        Figure(f"{SPEC} batch loader: bytes from disk per pass", "B", disk, "the ranges' bytes",
               [float(useful)], target="≤ 1.1× the ranges",
               note=f"read_bytes of this process (0 workers: the loader reads here); fio depths tried (MB/s): "
                    + ", ".join(f"{d}: {r:,.0f}" for d, r in rates.items())),
    ]


def _kernel_share(loader: list[float], kernel: list[float], copy: list[float]) -> str:
    """How much of the loader's buffered CPU per GB the kernel costs anyway (fio buffered, same ranges, same
    run), and what is left to the loader itself, each also in memcpys."""
    ours, theirs, base = statistics.median(loader), statistics.median(kernel), statistics.median(copy)
    return (f"of its {ours:.3f} s/GB ({ours / base:.2f}× memcpy), fio buffered on the same ranges costs "
            f"{theirs:.3f} s/GB ({theirs / base:.2f}× memcpy, the kernel's block path, page-cache fill and copy "
            f"to user), so the loader's own is {ours - theirs:+.3f} s/GB ({(ours - theirs) / base:+.2f}× memcpy)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="three tiny files instead of six of 1.6 GB")
    print_figures(run(parser.parse_args().fast))


if __name__ == "__main__":
    main()

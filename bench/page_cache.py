"""The three read rates the io check's page-cache model needs, measured on the same byte ranges in one run.

The model (``idmctl.plan.page_cache``) charges a step's missed bytes at the storage's rate and its hits
at the page cache's, and, where the working set dwarfs the cache, asks whether reading around the cache
(O_DIRECT) would be faster. All three rates come from here, not from assumptions:

- ``cold``: the cache reader (``cache.hidden.read_exact_slice``) on uniform random windows of fresh
  files whose pages were dropped first (``POSIX_FADV_DONTNEED``): every byte from the disk, buffered.
- ``hot``: the same windows read again, every byte already in the page cache: the memory copy rate a
  hit costs (``storage.page_cache_read`` in a cluster profile).
- ``direct``: the same windows, cold, read with ``O_DIRECT`` in the reader's 2 MiB pieces by its
  thread count: the disk without the page cache (``storage.direct_read``).

``python -m bench.page_cache`` prints the three medians; ``run(fast)`` gives them as figures.
"""

from __future__ import annotations

import mmap
import os
import random
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import Figure

FRAMES, WINDOW, GRID, CHANNELS, LAYERS, ROUTED = 24, 5, (16, 32), 512, 4, (0, 2)
"""A card-shaped file at small scale: 24 frames, 5-frame windows, 2 routed of 4 layers; one frame of one
layer is 16 × 32 × 512 × 2 B = 512 KiB, page-aligned, so O_DIRECT reads the very ranges buffered reads do."""


def _write_files(root: Path, count: int) -> list[Path]:
    import numpy as np

    from cache.hidden import write_layers

    frame = GRID[0] * GRID[1] * CHANNELS * 2
    rng = np.random.default_rng(0)
    paths = []
    for number in range(count):
        path = root / f"demo_{number}.safetensors"
        chunks = (rng.integers(0, 255, FRAMES * frame, dtype=np.uint8) for _ in range(LAYERS))
        write_layers(path, list(range(LAYERS)), (FRAMES, *GRID, CHANNELS), "bfloat16", chunks,
                     {"demo": f"demo_{number}", "frame_stride": 1, "encoder": "bench", "encoder_version": "0"})
        paths.append(path)
    return paths


def drop(paths: list[Path]) -> None:
    """Evict the files' clean pages from the page cache, whichever cgroup they are charged to."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _windows(infos: list, seed: int) -> list[tuple[object, int]]:
    """Every (file, start) window once, in a random order whose windows do not overlap within a file
    (starts a window apart), so a cold pass reads each byte from the disk exactly once."""
    picks = [(info, start) for info in infos for start in range(0, FRAMES - WINDOW + 1, WINDOW)]
    random.Random(seed).shuffle(picks)
    return picks


def _buffered(picks: list[tuple[object, int]]) -> tuple[int, float]:
    from cache.hidden import read_exact_slice

    began = time.perf_counter()
    total = 0
    for info, start in picks:
        total += read_exact_slice(info, list(ROUTED), start, WINDOW).numel() * 2
    return total, time.perf_counter() - began


def _direct(picks: list[tuple[object, int]]) -> tuple[int, float]:
    from cache.hidden import READ_PIECE_BYTES, READ_THREADS

    frame = GRID[0] * GRID[1] * CHANNELS * 2
    length = WINDOW * frame
    buffers = [mmap.mmap(-1, READ_PIECE_BYTES) for _ in range(READ_THREADS)]  # page-aligned, as O_DIRECT needs

    def piece(job: tuple[int, int, int]) -> int:
        fd, offset, slot = job
        view = memoryview(buffers[slot])[:min(READ_PIECE_BYTES, length)]
        return os.preadv(fd, [view], offset)

    total = 0
    began = time.perf_counter()
    with ThreadPoolExecutor(READ_THREADS) as pool:
        for info, start in picks:
            fd = os.open(info.path, os.O_RDONLY | os.O_DIRECT)
            try:
                jobs = [(fd, info.offsets[info.layers[index]] + start * frame + cut, n % READ_THREADS)
                        for n, (index, cut) in enumerate((i, c) for i in ROUTED for c in range(0, length, READ_PIECE_BYTES))]
                total += sum(pool.map(piece, jobs))
            finally:
                os.close(fd)
    return total, time.perf_counter() - began


def measure(files: int, repeats: int, root: Path | None = None) -> dict[str, list[float]]:
    """Bytes per second of each way of reading, ``repeats`` times each, on fresh files under ``root``."""
    from cache.hidden import inspect_file

    folder = Path(tempfile.mkdtemp(prefix="page-cache-bench-", dir=root))
    try:
        paths = _write_files(folder, files)
        infos = [inspect_file(path) for path in paths]
        rates: dict[str, list[float]] = {"cold": [], "hot": [], "direct": []}
        for attempt in range(repeats):
            picks = _windows(infos, attempt)
            drop(paths)
            got, seconds = _buffered(picks)
            rates["cold"].append(got / seconds)
            got, seconds = _buffered(picks)
            rates["hot"].append(got / seconds)
            drop(paths)
            got, seconds = _direct(picks)
            rates["direct"].append(got / seconds)
        return rates
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(fast: bool) -> list[Figure]:
    rates = measure(files=4 if fast else 24, repeats=2 if fast else 5)
    gb = [r / 1e9 for r in rates["cold"]]
    return [
        Figure("page cache hit (hot re-read, cache reader)", "GB/s", [r / 1e9 for r in rates["hot"]], "cold buffered read",
               gb, note="storage.page_cache_read: what a hit costs", higher_is_better=True),
        Figure("O_DIRECT read of the same ranges", "GB/s", [r / 1e9 for r in rates["direct"]], "cold buffered read",
               gb, note="storage.direct_read: the disk without the page cache", higher_is_better=True),
    ]


def main() -> None:
    rates = measure(files=24, repeats=5)
    for name, values in rates.items():
        shown = ", ".join(f"{v / 1e9:.2f}" for v in values)
        print(f"{name:>6}: median {statistics.median(values) / 1e9:.2f} GB/s ({shown})")


if __name__ == "__main__":
    main()

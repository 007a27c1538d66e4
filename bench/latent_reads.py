"""Latent-cache reads on a cold page cache against fio on the same bytes (card B's three slots).

A training sample of the three-way latent cache is three files read whole — its RGB row, its PT row
and its first frame (``cache.latent.files.read_latent``, what ``LatentCacheDataset`` calls per slot,
one after another). Here the files sit in the real slot directories (``LatentLayout``), written by
``write_latent``; samples are read in a shuffled order, each from a cold page cache, and ``fio``
(``bench/fio.py``) reads the same files, one wave of three per sample, in the same order. Reader and
fio passes are interleaved.

Geometry (the card does not state its sizes): Wan2.2's VAE (16 latent channels, 4× in time, 8× in
space) over 33 frames of two 480 × 640 cameras side by side → a (16, 9, 60, 160) bf16 row of 2.76 MB;
the first frame (16, 1, 60, 160) for RGB and for PT. ``--fast``: a 32 × 32 camera.

``python -m bench.latent_reads [--fast]`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench import fio
from bench.common import Figure, print_figures
from bench.hidden_reads import _read_bytes

LATENT_SHAPE = {False: (16, 9, 60, 160), True: (16, 2, 4, 8)}
"""(channels, latent frames, height, width) of a row, by ``fast``."""
SAMPLES = {False: 64, True: 6}


def _write(root: Path, samples: int, shape: tuple[int, int, int, int]) -> list[list[Path]]:
    """The three slot files of each sample, in real slot directories; returns them per sample."""
    import torch

    from cache.latent.files import write_latent
    from cache.latent.layout import LatentLayout

    channels, frames, height, width = shape
    layout = LatentLayout(root, root, 33, height * 8, width * 4, pt_hash="0" * 16)
    generator = torch.Generator().manual_seed(0)

    def latent(*dims: int) -> "torch.Tensor":
        return torch.randn(*dims, generator=generator).to(torch.bfloat16)

    per_sample = []
    for index in range(samples):
        key, start = f"demo_{index // 4}", (index % 4) * 8
        paths = [layout.sample_path(slot, key, start) for slot in ("rgb", "pt", "ff")]
        write_latent(paths[0], {"latent": latent(channels, frames, height, width)}, {"slot": "rgb"})
        write_latent(paths[1], {"latent": latent(channels, frames, height, width)}, {"slot": "pt"})
        write_latent(paths[2], {"rgb": latent(channels, 1, height, width), "pt": latent(channels, 1, height, width)},
                     {"slot": "ff"})
        per_sample.append(paths)
    return per_sample


def _reader_pass(order: list[list[Path]], files: list[Path]) -> tuple[float, float]:
    """(seconds reading, bytes from disk): each sample's three files by ``read_latent``, cold per sample."""
    from cache.latent.files import read_latent

    seconds = disk = 0.0
    for paths in order:
        fio.evict(files)
        before, start = _read_bytes(), time.perf_counter()
        for path in paths:
            read_latent(path)
        seconds += time.perf_counter() - start
        disk += _read_bytes() - before
    return seconds, disk


def run(fast: bool) -> list[Figure] | str:
    import torch

    if (why := fio.unavailable()) is not None:
        return f"not measured: {why}"
    torch.set_num_threads(1)
    repeats = 1 if fast else 5
    with tempfile.TemporaryDirectory(prefix="bench_latent_reads_", dir=os.environ.get("BENCH_DIR")) as tmp:
        per_sample = _write(Path(tmp), SAMPLES[fast], LATENT_SHAPE[fast])
        order = random.Random(0).sample(per_sample, len(per_sample))  # a shuffled epoch, as the sampler draws
        files = [path for paths in per_sample for path in paths]
        total = sum(path.stat().st_size for path in files)
        waves = [[(path, 0, path.stat().st_size) for path in paths] for paths in order]
        depth, rates = fio.best_depth(waves, depths=(16,) if fast else fio.DEPTHS)
        reader_rates, fio_rates, disk = [], [], []
        for _ in range(repeats):
            seconds, read = _reader_pass(order, files)
            reader_rates.append(total / seconds / 1e6)
            disk.append(read)
            fio_rates.append(fio.read_ranges(waves, depth).mb_per_s)
        sizes = [path.stat().st_size for path in per_sample[0]]
    # What bounds the reader: it has one request in flight (a file at a time, the kernel's readahead
    # within it), so fio at depth 1 on the same files is its like-for-like limit.
    depth_one = (f"; at depth 1 fio got {rates[1]:,.0f} MB/s, the reader {statistics.median(reader_rates) / rates[1]:.2f}× "
                 f"that: the gap to depth {depth} is requests in flight, not bytes" if 1 in rates else "")
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, shared with other helpers' work"
    return [
        Figure("read_latent of a sample's RGB, PT and FF files: useful throughput", "MB/s", reader_rates,
               f"fio io_uring O_DIRECT depth {depth}, the same files in the same order", fio_rates,
               higher_is_better=True, target="≥ 0.9× fio on the same ranges",
               note=(f"{len(order)} samples in a shuffled order, files of {', '.join(f'{s:,}' for s in sizes)} B "
                     f"(rgb, pt, ff), {total:,} B a pass, cold cache per sample; the reader reads the three files "
                     f"one after another, fio all three at once (one wave a sample); fio depths tried (MB/s): "
                     + ", ".join(f"{d}: {r:,.0f}" for d, r in rates.items()) + depth_one
                     + f"; {load}")),
        Figure("read_latent: bytes from disk per pass", "B", disk, "the files' bytes", [float(total)],
               target="≤ 1.1× the files", note="read_bytes of this process"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a 32 × 32 camera instead of two 480 × 640")
    print_figures(run(parser.parse_args().fast))


if __name__ == "__main__":
    main()

"""Hidden-cache slice reads on a cold page cache: bytes from disk and throughput, per method.

One N=4 × 5-frame sample (card A's selection, indices 1,4,7,10) from a 12-layer × 24-frame bf16
file, read five ways — our format (exact ``preadv``), the legacy ``.pt`` by exact ``preadv`` into its
zip storage (``cache.legacy_pt``), the legacy ``.pt`` through ``torch.load(mmap=True)`` (the old way),
the safetensors library's ``get_slice``, and the whole file (no mmap) —
each after evicting the file with ``POSIX_FADV_DONTNEED``. Bytes come from ``read_bytes`` in
``/proc/self/io`` (counts mmap faults too); the reference for bytes is the slice itself, the
reference for throughput ``fio`` (io_uring, O_DIRECT, the best of queue depths 1/4/16/32 on these
ranges) over exactly the slice's byte ranges of the same file, run between the reader's samples
(``bench/fio.py``). A whole-file sequential read is kept as context only: on this VM it swung
between 0.86 and 2.9 GB/s from run to run, so it is no limit for four 66 MB ranges.

``python -m bench.hidden_reads [--fast]`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import fio
from bench.common import Figure, print_figures

if TYPE_CHECKING:
    from cache.hidden import CacheFileInfo

SELECTION = [1, 4, 7, 10]
FRAME_START, WINDOW = 3, 5
GEOMETRY = {False: ((27, 48), 5120), True: ((8, 8), 512)}
"""(token grid, channels) by ``fast``. The full run uses card A's geometry: a 12 × 24 × 27 × 48 × 5120 bf16
file of 3.8 GB and a 265 MB sample. The sample's size matters: on this disk a cold contiguous read of
25 MB reaches about half the rate of a whole-file sequential read (first-request latency is not
amortised), so a scaled-down sample would measure latency, not the reader."""


def _random_bf16(*shape: int) -> "torch.Tensor":
    """Random bf16 bits without a float32 copy of the whole tensor (7.6 GB at card geometry)."""
    import torch

    return torch.randint(-(2**15), 2**15, shape, dtype=torch.int16).view(torch.bfloat16)


def _read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("no read_bytes in /proc/self/io")


def _cold(path: Path, read: Callable[[], Any], repeats: int) -> tuple[list[float], list[float]]:
    """(seconds, bytes from disk) per cold read."""
    seconds, disk = [], []
    for _ in range(repeats):
        fio.evict([path])
        before, start = _read_bytes(), time.perf_counter()
        read()
        seconds.append(time.perf_counter() - start)
        disk.append(float(_read_bytes() - before))
    return seconds, disk


def _sequential(path: Path) -> None:
    with open(path, "rb", buffering=0) as handle:
        while handle.read(8 << 20):
            pass


def slice_ranges(info: "CacheFileInfo", positions: list[int], frame_start: int, window: int) -> list[tuple[Path, int, int]]:
    """(file, offset, length) of the exact ranges a slice read covers: one per layer, as
    ``cache.hidden.read_exact_slice`` reads them (fio reads these same bytes)."""
    frame_bytes = info.geometry.frame_bytes
    return [(info.path, info.offsets[info.layers[p]] + frame_start * frame_bytes, window * frame_bytes)
            for p in positions]


def scheduler_seconds() -> tuple[float, float]:
    """(CPU seconds, seconds runnable but waiting for a CPU) summed over this process's threads
    (``/proc/self/task/*/schedstat``): how much of a read's wall time went to the machine's other load."""
    cpu = queued = 0
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            ran, waited, _ = stat.read_text().split()
        except (FileNotFoundError, ValueError):  # a thread that ended meanwhile
            continue
        cpu, queued = cpu + int(ran), queued + int(waited)
    return cpu / 1e9, queued / 1e9


def _against_fio(path: Path, read: Callable[[], Any], ranges: list[tuple[Path, int, int]], depth: int,
                 repeats: int) -> tuple[list[float], list[float], list[float], str]:
    """(reader seconds, reader bytes from disk, fio MB/s, where the reader's time went) with reader and
    fio interleaved, each cold."""
    seconds, disk, fio_rates, cpu, queued = [], [], [], [], []
    for _ in range(repeats):
        cpu_before, queued_before = scheduler_seconds()
        reader_seconds, reader_disk = _cold(path, read, 1)
        cpu_after, queued_after = scheduler_seconds()
        cpu.append(cpu_after - cpu_before)
        queued.append(queued_after - queued_before)
        seconds += reader_seconds
        disk += reader_disk
        fio_rates.append(fio.read_ranges([ranges], depth).mb_per_s)
    spent = (f"reader's threads per read (medians): CPU {statistics.median(cpu) * 1e3:,.0f} ms, waiting for a CPU "
             f"{statistics.median(queued) * 1e3:,.0f} ms")
    return seconds, disk, fio_rates, spent


def _load_note() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (shared machine)"


def run(fast: bool) -> list[Figure] | str:
    import torch
    from safetensors import safe_open

    from cache.hidden import inspect_file, read_hidden, read_legacy_torch_load, write_hidden, write_legacy

    if (why := fio.unavailable()) is not None:
        return f"not measured: {why}"
    torch.set_num_threads(1)
    repeats = 3 if fast else 5
    grid, channels = GEOMETRY[fast]
    hidden = _random_bf16(12, 24, *grid, channels)
    slice_bytes = len(SELECTION) * WINDOW * grid[0] * grid[1] * channels * 2
    with tempfile.TemporaryDirectory(prefix="bench_hidden_", dir=os.environ.get("BENCH_DIR")) as tmp:
        ours, legacy = Path(tmp) / "demo_0.safetensors", Path(tmp) / "demo_0.pt"
        write_hidden(ours, hidden, list(range(12)), {})
        write_legacy(legacy, hidden, list(range(12)))
        del hidden
        info = inspect_file(ours)
        file_bytes = ours.stat().st_size
        ranges = {ours: slice_ranges(info, SELECTION, FRAME_START, WINDOW),
                  legacy: slice_ranges(inspect_file(legacy), SELECTION, FRAME_START, WINDOW)}

        def library_slice() -> None:
            with safe_open(str(ours), framework="pt") as handle:
                for block in SELECTION:
                    # The slice can be a view of safetensors' mmap: clone() makes it read the bytes, as
                    # a sample that reaches the model must (otherwise pages are never touched).
                    handle.get_slice(f"layer_{block}")[FRAME_START:FRAME_START + WINDOW].clone()

        methods = {
            "ours: header + exact preadv (FADV_RANDOM, 8 × 2 MiB in flight)": (ours, lambda: read_hidden(ours, SELECTION, FRAME_START, WINDOW)),
            "legacy .pt: zip directory + exact preadv (FADV_RANDOM, 8 × 2 MiB in flight)": (
                legacy, lambda: read_hidden(legacy, SELECTION, FRAME_START, WINDOW)),
            "legacy .pt: torch.load(mmap) + slice": (
                legacy, lambda: read_legacy_torch_load(legacy, SELECTION, FRAME_START, WINDOW, mmap=True)),
            "safetensors get_slice": (ours, library_slice),
            "whole file (mmap: false)": (ours, lambda: read_hidden(ours, SELECTION, FRAME_START, WINDOW, mmap=False,
                                                                   info=info)),
        }
        depth, depth_rates = fio.best_depth([ranges[ours]])
        tried = ", ".join(f"{d}: {rate:,.0f}" for d, rate in depth_rates.items())
        fio_name = f"fio io_uring O_DIRECT depth {depth}, same ranges"
        seq_seconds, _ = _cold(ours, lambda: _sequential(ours), repeats)
        seq_throughput = [file_bytes / s / 1e6 for s in seq_seconds]
        figures: list[Figure] = [Figure(
            "fio on the slice's 4 ranges: queue depth chosen", "MB/s", [depth_rates[depth]], higher_is_better=True,
            note=f"depth → MB/s, one cold run each: {tried}; depth {depth} is every reader's reference below "
                 f"(1 MiB requests, the 4 ranges at once)")]
        for name, (path, read) in methods.items():
            seconds, disk, fio_rates, spent = _against_fio(path, read, ranges[path], depth, repeats)
            exact = "preadv" in name
            figures.append(Figure(f"{name}: bytes from disk", "B", disk, "slice bytes", [float(slice_bytes)],
                                  target="≤ 1.1× slice" if exact else "",
                                  note=f"file {path.stat().st_size:,} B"))
            figures.append(Figure(
                f"{name}: useful throughput", "MB/s", [slice_bytes / s / 1e6 for s in seconds], fio_name, fio_rates,
                higher_is_better=True, target="≥ 0.9× fio on the same ranges" if exact else "",
                note=f"slice {slice_bytes:,} B in median {sorted(seconds)[len(seconds) // 2] * 1e3:.1f} ms; reader and "
                     f"fio interleaved, each from a cold page cache; {spent}; {_load_note()}"))
        figures.append(Figure(
            "whole-file sequential read (context only, not the reference)", "MB/s", seq_throughput, fio_name,
            figures[2].reference_samples, higher_is_better=True,
            note=f"{file_bytes:,} B, 8 MiB reads; swings run to run on this VM, so readers are judged against fio"))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a 19 MB file instead of card A's 3.8 GB")
    args = parser.parse_args()
    print_figures(run(args.fast))


if __name__ == "__main__":
    main()


# -- bench.run adapter: the figures above, plus a full ``torch.load`` of the
# legacy .pt (no mmap: what the card's N=12 runs did per sample) against fio on the same cold-cache terms. ------

_slice_figures = run


def _full_torch_load_figures(fast: bool) -> list[Figure]:
    import torch

    from cache.hidden import inspect_file, read_hidden, write_legacy

    repeats = 1 if fast else 3
    grid, channels = GEOMETRY[fast]
    slice_bytes = len(SELECTION) * WINDOW * grid[0] * grid[1] * channels * 2
    with tempfile.TemporaryDirectory(prefix="bench_hidden_pt_", dir=os.environ.get("BENCH_DIR")) as tmp:
        legacy = Path(tmp) / "demo_0.pt"
        write_legacy(legacy, _random_bf16(12, 24, *grid, channels), list(range(12)))
        ranges = slice_ranges(inspect_file(legacy), SELECTION, FRAME_START, WINDOW)
        depth, _ = fio.best_depth([ranges], depths=(16,) if fast else fio.DEPTHS)
        seconds, disk, fio_rates, spent = _against_fio(
            legacy, lambda: read_hidden(legacy, SELECTION, FRAME_START, WINDOW, mmap=False), ranges, depth, repeats)
        file_bytes = legacy.stat().st_size
    return [
        Figure("legacy .pt: full torch.load + slice: bytes from disk", "B", disk, "slice bytes", [float(slice_bytes)],
               note=f"file {file_bytes:,} B"),
        Figure("legacy .pt: full torch.load + slice: useful throughput", "MB/s", [slice_bytes / s / 1e6 for s in seconds],
               f"fio io_uring O_DIRECT depth {depth}, same ranges", fio_rates, higher_is_better=True,
               note=f"the whole file is read for the slice; reader and fio interleaved, cold; {spent}; {_load_note()}"),
    ]


def run(fast: bool) -> list[Figure] | str:  # type: ignore[no-redef]
    figures = _slice_figures(fast)
    return figures if isinstance(figures, str) else figures + _full_torch_load_figures(fast)

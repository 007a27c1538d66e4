"""``fio`` over exactly the byte ranges a reader read: the disk's best for those bytes, in the same run.

A reader figure means little against a whole-file stream (on this VM a sequential read of a 3.8 GB file
swung between 0.86 and 2.9 GB/s from one run to the next, while the four ranges of an N=4 slice read at
1.25–1.36 GB/s whatever the method). The reference is what ``fio`` (io_uring, O_DIRECT, a queue depth
that saturates the disk) gets on the same ranges from a cold page cache.

The ranges go into a job file: one job section per range (``filename``/``offset``/``size``; fio rounds
a job's last request up to a whole ``bs``, so a remainder that is not a whole request is its own
section, and the bytes fio reports are checked against the ranges'), and the
ranges of one "wave" (e.g. one sample's N layers) run at once; ``stonewall`` starts the next wave
after the last, as a reader reads one sample after another. Seconds are the sum over waves of the
slowest job's runtime from ``--output-format=json`` (milliseconds: fio's own resolution, so a wave of
under ~50 ms is coarse, one under 1 ms counts as 1 ms). O_DIRECT needs 4 KiB-aligned offsets and lengths: each range is widened to the
4 KiB blocks that hold it (at most 8 KiB more per range; ``FioResult.bytes`` counts what fio read), and the
last partial block of a range that ends at an unaligned end of file (a whole small file) is read
buffered from the evicted file by a job of its own, beside the O_DIRECT one.

fio's iolog replay would take the ranges as one list, but fio 3.33 reports 0 bytes and no runtime for
a replayed job (tried: io_uring, libaio, psync), so the job-file form is the one used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ground.paths import drop_from_page_cache

FIO = "fio"
BLOCK = 4096
"""O_DIRECT alignment for offsets and lengths (the logical block size of /dev/vda and of NVMe drives)."""
DEPTHS = (1, 4, 16, 32)
"""Queue depths tried; the best on the run's own ranges is the reference (the disk saturated)."""
BLOCK_SIZE = 1 << 20
"""Bytes per fio request (1 MiB: past the size where this disk's rate stops rising)."""

Range = tuple[Path, int, int]
"""(file, offset, length) in bytes."""


@dataclass(frozen=True)
class FioResult:
    bytes: int
    """Bytes fio read (the ranges widened to whole 4 KiB blocks)."""
    seconds: float
    iodepth: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6


def unavailable() -> str | None:
    """Why fio cannot run here (a figure's "not measured" line), or None."""
    if shutil.which(FIO) is None:
        return "fio is not installed (`scripts/system_deps.sh test` installs it; Debian package fio)"
    return None


def evict(paths: Sequence[Path]) -> None:
    """Drop the files from the page cache: a cold read (the loader's smoke measures the same way)."""
    drop_from_page_cache(paths)


def _aligned(path: Path, offset: int, length: int, sizes: dict[Path, int]) -> tuple[int, int, int]:
    """(start, direct end, end) of the 4 KiB blocks that hold the range, clipped to the file: bytes up to
    ``direct end`` are whole blocks (O_DIRECT), the rest (an unaligned end of file) is read buffered."""
    size = sizes.setdefault(path, path.stat().st_size)
    if length <= 0 or offset < 0 or offset + length > size:
        raise ValueError(f"range {offset:,}+{length:,} B is outside {path} ({size:,} B)")
    start = offset - offset % BLOCK
    end = min(-(-(offset + length) // BLOCK) * BLOCK, size)
    return start, end - end % BLOCK, end


def _jobs(start: int, span: int, block_size: int) -> list[tuple[int, int, int]]:
    """(offset, size, bs) of the jobs that read exactly ``span`` bytes: fio rounds a job's last request
    up to a whole ``bs`` (3 MiB + 8 KiB at bs=1M read 4 MiB), so a remainder gets its own job."""
    whole = span - span % block_size
    jobs = [(start, whole, block_size)] if whole else []
    if span > whole:
        jobs.append((start + whole, span - whole, span - whole))
    return jobs


def job_file(waves: Sequence[Sequence[Range]], iodepth: int, block_size: int = BLOCK_SIZE,
             buffered: str | None = None) -> tuple[str, int]:
    """The fio job file and the bytes it reads: a section per range (two when a remainder of the range is
    not a whole request), ``stonewall`` at the start of every wave but the first. ``buffered``: through the
    page cache (``direct=0``) with this ``fadvise_hint`` (``random``: no readahead, as the loader's fds),
    on the exact ranges (no block widening)."""
    lines = ["[global]", "ioengine=io_uring", f"iodepth={iodepth}", "rw=read", "thread", "invalidate=1",
             *([f"fadvise_hint={buffered}"] if buffered is not None else []), ""]
    sizes: dict[Path, int] = {}
    expected = 0
    for number, wave in enumerate(waves):
        section = 0
        for path, offset, length in wave:
            if "\n" in str(path) or ":" in str(path):  # fio splits filename= on ':'
                raise ValueError(f"fio cannot name {str(path)!r} (':' or newline in the path)")
            start, direct_end, end = _aligned(Path(path), offset, length, sizes)
            if buffered is not None:
                expected += length
                parts = [(job, 0) for job in _jobs(offset, length, block_size)]
            else:
                expected += end - start
                parts = [(job, 1) for job in _jobs(start, direct_end - start, block_size)]
                if end > direct_end:
                    parts.append(((direct_end, end - direct_end, end - direct_end), 0))
            for (job_offset, size, bs), direct in parts:
                lines += [f"[w{number}j{section}]", f"filename={path}", f"offset={job_offset}", f"size={size}",
                          f"bs={bs}", f"direct={direct}"]
                if section == 0 and number > 0:
                    lines.append("stonewall")
                lines.append("")
                section += 1
    return "\n".join(lines), expected


def parse(report: dict, iodepth: int) -> FioResult:
    """Bytes and seconds from ``--output-format=json``: per wave (group) its slowest job's runtime."""
    waves: dict[int, int] = {}
    total = 0
    for job in report["jobs"]:
        if job.get("error"):
            raise RuntimeError(f"fio job {job['jobname']} failed: error {job['error']}")
        read = job["read"]
        total += int(read["io_bytes"])
        # A wave under 1 ms reports 0: count it as fio's resolution (tiny --fast ranges only).
        waves[job["groupid"]] = max(waves.get(job["groupid"], 1), int(read["runtime"]))
    seconds = sum(waves.values()) / 1e3
    if not total or not seconds:
        raise RuntimeError(f"fio read {total:,} B in {seconds} s: nothing to measure")
    return FioResult(total, seconds, iodepth)


def read_ranges(waves: Sequence[Sequence[Range]], iodepth: int, block_size: int = BLOCK_SIZE,
                buffered: str | None = None) -> FioResult:
    """Run fio over the ranges from a cold page cache; raises with fio's own message if it fails.
    ``buffered``: through the page cache with that ``fadvise_hint`` (see :func:`job_file`)."""
    evict([Path(path) for wave in waves for path, _, _ in wave])
    with tempfile.NamedTemporaryFile("w", suffix=".fio", prefix="bench_") as handle:
        text, expected = job_file(waves, iodepth, block_size, buffered)
        handle.write(text)
        handle.flush()
        done = subprocess.run([FIO, "--output-format=json", handle.name], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"fio exited {done.returncode}: {(done.stderr or done.stdout).strip()[-400:]}")
    # fio may print notes ("fio: ...") before the JSON document.
    result = parse(json.loads(done.stdout[done.stdout.index("{"):]), iodepth)
    if result.bytes != expected:
        raise RuntimeError(f"fio read {result.bytes:,} B, the ranges hold {expected:,} B: not the same bytes")
    return result


def best_depth(waves: Sequence[Sequence[Range]], depths: Sequence[int] = DEPTHS) -> tuple[int, dict[int, float]]:
    """The queue depth with the highest rate on these ranges, and MB/s per depth tried (one run each)."""
    rates = {depth: read_ranges(waves, depth).mb_per_s for depth in depths}
    return max(rates, key=rates.__getitem__), rates

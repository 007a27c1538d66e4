"""Inside a Slurm job with a small ``--mem``: the page cache the job can hold, measured against the model.

Run by tests/idmctl/plan/test_page_cache_slurm.py as ``python -m tests.page_cache_entry POOL OUT``. POOL holds fresh cache
files (the real safetensors format, two layers both routed) that nobody has read since their pages were
dropped. The job reads its memory cgroup's limit and what it holds besides the page cache (after importing
torch and the reader: the "resident" a smoke measures), so the cache it can hold is limit − resident. Then for
each ratio it takes fresh files whose routed bytes are that ratio × the job's --mem limit, drops their pages
(``POSIX_FADV_DONTNEED``: cgroup v1 leaves a page charged to the cgroup that first touched it, so a page
cached before the job would count outside its limit), reads every frame once (the warm-up pass), then
measures steps of uniform random windows with the cache reader: bytes from the disk per step from
``/proc/self/io`` ``read_bytes``, seconds per step. The disk's and the page cache's rates are calibrated
in the same job and at the same moments as the steps they predict: the disk from the steps' reads that
missed completely (the warm-up pass's only where the steps have fewer than MIN_MISSES of them), the page
cache from re-reads of a window read two reads earlier that hit completely (interleaved with the steps, not
counted in them). CI's first run calibrated the disk on the warm-up pass alone: 0.19 GB/s measured in one
moment, a faster disk during the steps that followed, and 35.0 ms/step predicted against 24.8 measured.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

WINDOW, STEPS, READS_PER_STEP = 5, 20, 8
MIN_MISSES = 8
"""Full misses among the steps' reads below which the disk's rate comes from the warm-up pass instead."""
RATIOS = (0.5, 1.0, 2.0)


def read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes")


def memory_cgroup() -> Path:
    """The cgroup v1 memory directory that holds the job's limit (the lowest one of this process's path)."""
    relative = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if line.split(":", 2)[1] == "memory")
    root = Path("/sys/fs/cgroup/memory")
    path, best = root / relative.lstrip("/"), None
    while path != root.parent:
        limit_file = path / "memory.limit_in_bytes"
        if limit_file.exists():
            limit = int(limit_file.read_text())
            if best is None or limit < best[1]:
                best = (path, limit)
        path = path.parent
    assert best is not None, f"no memory.limit_in_bytes above {relative}"
    return best[0]


def cgroup_stat(group: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (group / "memory.stat").read_text().splitlines())}


def drop(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> int:
    pool_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    from cache.hidden import inspect_file, read_exact_slice

    pool = sorted(pool_dir.glob("*.safetensors"))
    infos = [inspect_file(path) for path in pool]
    group = memory_cgroup()
    limit = int((group / "memory.limit_in_bytes").read_text())
    stat = cgroup_stat(group)
    usage = int((group / "memory.usage_in_bytes").read_text())
    # Page cache the job could give back: its unmapped file pages (mapped ones are its own libraries, in use).
    resident = usage - (stat["total_cache"] - stat["total_mapped_file"])
    cache = limit - resident
    info0 = infos[0]
    routed = len(info0.layers) * info0.geometry.layer_bytes
    window_bytes = len(info0.layers) * WINDOW * info0.geometry.frame_bytes
    layers = list(range(len(info0.layers)))
    rng = random.Random(0)
    report = {"limit": limit, "resident": resident, "cache": cache, "usage_at_start": usage, "memcg": str(group),
              "routed_bytes_per_file": routed, "step_bytes": READS_PER_STEP * window_bytes, "phases": []}
    taken = 0

    def timed(info, start):
        before, began = read_bytes(), time.perf_counter()
        read_exact_slice(info, layers, start, WINDOW)
        return read_bytes() - before, time.perf_counter() - began

    for ratio in RATIOS:  # of the job's --mem: the cache it can hold is a model output, not the yardstick
        count = max(1, round(ratio * limit / routed))
        if taken + count > len(infos):
            report["error"] = f"pool of {len(infos)} files too small for ratio {ratio} ({count} more files)"
            break
        files = infos[taken:taken + count]
        taken += count
        drop([f.path for f in files])
        starts = sorted({*range(0, info0.frames - WINDOW + 1, WINDOW), info0.frames - WINDOW})
        warm = [(f, s) for f in files for s in starts]
        rng.shuffle(warm)
        warm_bytes = warm_s = 0.0
        for info, start in warm:
            got, seconds = timed(info, start)
            if got >= window_bytes:
                warm_bytes, warm_s = warm_bytes + got, warm_s + seconds
        windows = [(f, s) for f in files for s in range(info0.frames - WINDOW + 1)]
        step_disk, step_s, hot_bytes, hot_s, history = [], [], 0.0, 0.0, []
        misses, miss_bytes, miss_s = 0, 0.0, 0.0
        for _ in range(STEPS):
            disk = spent = 0.0
            for _ in range(READS_PER_STEP):
                info, start = rng.choice(windows)
                got, seconds = timed(info, start)
                disk, spent = disk + got, spent + seconds
                if got >= window_bytes:
                    misses, miss_bytes, miss_s = misses + 1, miss_bytes + got, miss_s + seconds
                history.append((info, start))
            step_disk.append(disk)
            step_s.append(spent)
            got, seconds = timed(*history[-3])  # a page-cache calibration read, outside the step's time
            if got == 0:
                hot_bytes, hot_s = hot_bytes + window_bytes, hot_s + seconds
        if misses < MIN_MISSES:
            miss_bytes, miss_s = miss_bytes + warm_bytes, miss_s + warm_s
        stat = cgroup_stat(group)
        report["phases"].append({
            "ratio": ratio, "files": count, "working_set": count * routed,
            "disk_bytes_per_step": sum(step_disk) / STEPS, "data_s_per_step": sum(step_s) / STEPS,
            "storage_bps": miss_bytes / miss_s if miss_s else None, "memory_bps": hot_bytes / hot_s if hot_s else None,
            "disk_rate_from": "steps" if misses >= MIN_MISSES else "steps and warm-up",
            "cache_held_at_end": stat["total_cache"], "rss_at_end": stat["total_rss"]})
        drop([f.path for f in files])
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

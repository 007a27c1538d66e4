"""The page cache in the data time: what share of a step's bytes a node serves from memory in steady state.

Under Slurm's cgroup memory limit (``ConstrainRAMSpace``) the pages a job's processes read are charged to
the job's memory cgroup, so the page cache the job can hold is its ``--mem`` minus what it holds resident
(its ranks' own memory and the loader's batches). Card A: ``--mem 1600GB`` against a routed working set of
1,871 files × 4 layers × 318,504,960 B = 2.38 TB, read again and again for 60,000 steps.

The hit rate. The sampler draws windows uniformly at random over every file of the split (each rank's
sampler reshuffles the whole split every epoch, so over a run every node reads every file), and a window
reads the routed layers of its frames. Take the references as independent and uniform over the working
set's W bytes, and a cache holding C of them. Whatever the kernel's replacement policy, which bytes it
holds does not depend on which byte is read next, so a read finds its byte cached with probability
``C ÷ W``: hit = min(1, C ÷ W), misses = 1 − hit. (Windows do not touch frames quite uniformly: a
frame near a file's ends lies in fewer windows, which LRU rewards a little, e.g. 0.54 instead of 0.50
at C = W ÷ 2 for 24 frames and 5-frame windows; the uniform figure is the conservative one.)

The step's data time: misses × bytes ÷ the storage's rate + hits × bytes ÷ the page cache's rate (the
memory copy a hit costs, measured by ``bench/page_cache.py`` and stated in the cluster profile).

The cold first pass: the cache starts empty (the job's cgroup is new), so early steps read from the
storage. Every byte the cache ends up holding was read from the storage once, so the warm-up costs
``min(C, W)`` bytes at the storage's rate instead of the page cache's, on top of the steady state.

``loader.repeats`` cuts the bytes a step reads (each sample read serves K rows), not the working set:
the hit rate stays, every step's hits and misses shrink by K. ``resources.mem`` moves C.
"""

from __future__ import annotations

from dataclasses import dataclass

from cache.prefetch import PREFETCH_DEPTH, buffer_slots
from ground.geometry import HiddenGeometry, sample_io
from ground.units import format_bytes
from idmctl.core.checks import PreflightContext

ASSUMED_RESIDENT_PER_RANK = 8 * 10**9
"""Host memory one rank holds when no CPU smoke measured it (a GPU smoke's peak is device memory): a
PyTorch + CUDA trainer process's CUDA context, libraries and pinned staging buffers, an estimate."""
FAR_LARGER = 2.0
"""Working set more than this many times the cache: the io check weighs reading around the page cache."""
ASSUMPTIONS = "uniform random windows over the working set, no other job's pages on the node"


@dataclass(frozen=True)
class Resident:
    """What the job's cgroup holds besides the page cache, per node."""

    bytes: int
    formula: str
    measured: bool


@dataclass(frozen=True)
class CacheFigures:
    """The steady state of one node's page cache, and the step's data time it gives."""

    working_set: int
    working_set_formula: str
    mem_limit: int
    resident: Resident
    step_bytes: int
    """Bytes one node's readers move per step."""
    storage_name: str
    storage_bps: float
    memory_bps: float
    miss_bps: float | None = None
    """Rate the storage reads a node's misses at (NAS shared by nodes: its share); None: ``storage_bps``."""
    direct_bps: float | None = None
    """O_DIRECT read rate of the same storage, measured (``storage.direct_read``); None: not measured."""

    @property
    def cache(self) -> int:
        return max(0, self.mem_limit - self.resident.bytes)

    @property
    def hit(self) -> float:
        return min(1.0, self.cache / self.working_set) if self.working_set else 1.0

    @property
    def miss_bytes(self) -> float:
        return self.step_bytes * (1.0 - self.hit)

    @property
    def hit_bytes(self) -> float:
        return self.step_bytes * self.hit

    @property
    def _miss_rate(self) -> float:
        return self.miss_bps if self.miss_bps is not None else self.storage_bps

    @property
    def data_s(self) -> float:
        """Steady state: misses at the storage's rate + hits at the page cache's."""
        return self.miss_bytes / self._miss_rate + self.hit_bytes / self.memory_bps

    @property
    def cold_data_s(self) -> float:
        """A step with an empty cache: every byte from the storage."""
        return self.step_bytes / self._miss_rate

    @property
    def warmup_bytes(self) -> int:
        return min(self.cache, self.working_set)

    @property
    def warmup_s(self) -> float:
        """The cold first pass's cost over the steady state: the bytes the cache comes to hold, read once
        from the storage instead of from memory."""
        return max(0.0, self.warmup_bytes * (1.0 / self._miss_rate - 1.0 / self.memory_bps))

    @property
    def direct_data_s(self) -> float | None:
        """Every byte around the page cache (O_DIRECT): no hits, no cache to fill."""
        if self.direct_bps is None:
            return None
        rate = self.direct_bps * (self._miss_rate / self.storage_bps)  # the same share of a shared NAS
        return self.step_bytes / rate

    @property
    def reads_direct(self) -> bool:
        """The job's read path, decided here once: around the page cache (O_DIRECT) when the working set is
        more than :data:`FAR_LARGER` × the cache and the profile's measured O_DIRECT rate gives a shorter
        step than the cached steady state; else through the page cache. The plan's data time and the job's
        loader (``contract.ENV_LOADER_DIRECT``, read by ``cache.batches.trainer_batches``) follow it."""
        direct = self.direct_data_s
        return self.working_set > FAR_LARGER * self.cache and direct is not None and direct < self.data_s

    @property
    def served_data_s(self) -> float:
        """A step's data time on the chosen path (:attr:`reads_direct`)."""
        direct = self.direct_data_s
        return direct if self.reads_direct and direct is not None else self.data_s

    @property
    def served_warmup_s(self) -> float:
        """The cold first pass on the chosen path: none around the page cache (there is no cache to fill)."""
        return 0.0 if self.reads_direct else self.warmup_s

    def as_dict(self) -> dict[str, float | int | bool | str | None]:
        return {"working_set_bytes": self.working_set, "mem_limit_bytes": self.mem_limit,
                "resident_bytes": self.resident.bytes, "resident_measured": self.resident.measured,
                "cache_bytes": self.cache, "hit_rate": self.hit, "miss_bytes_per_step": self.miss_bytes,
                "steady_data_s_per_step": self.data_s, "cold_data_s_per_step": self.cold_data_s,
                "warmup_s": self.warmup_s, "direct_data_s_per_step": self.direct_data_s,
                "reads_direct": self.reads_direct,
                "memory_bps": self.memory_bps, "assumptions": ASSUMPTIONS}


def working_set(ctx: PreflightContext) -> tuple[int, str]:
    """The routed layers of every file (whole files when the loader reads them whole)."""
    data = ctx.spec.data
    geometry = HiddenGeometry.from_spec(data)
    measured = ctx.measurements
    if measured.cache_present and measured.cache_file_count:
        files, where = measured.cache_file_count, f"counted under {data.cache_root}"
    else:
        files, where = data.cache_files or 0, "data.cache_files"
    if ctx.spec.loader.mmap:
        n = data.routing_n
        size = files * n * geometry.layer_bytes
        return size, f"{files:,} files ({where}) × {n} routed layers × {geometry.layer_bytes:,} B = {format_bytes(size)}"
    size = files * geometry.file_bytes
    return size, f"{files:,} files ({where}) × {geometry.file_bytes:,} B (whole files, no mmap) = {format_bytes(size)}"


def resident(ctx: PreflightContext) -> Resident:
    """Per node: each rank's host memory (the CPU smoke's peak, else :data:`ASSUMED_RESIDENT_PER_RANK`)
    × ranks + the loader's batches in flight (workers × prefetch + the rank's one, or the batch loader's
    buffers, × the samples of a batch × their bytes in the cache's dtype). /dev/shm pages count: tmpfs is
    charged to the cgroup too."""
    spec = ctx.spec
    ranks = spec.resources.ranks_per_node
    smoke = ctx.measurements.smoke
    if smoke is not None and smoke.ok and smoke.peak_mem_bytes and smoke.device == "cpu":
        per_rank, source, measured = smoke.peak_mem_bytes, f"smoke peak on cpu at batch {smoke.batch_size}", True
    else:
        per_rank, source, measured = ASSUMED_RESIDENT_PER_RANK, "assumed, no CPU smoke measured host memory", False
    loader = spec.loader
    # Batches stay in the cache's dtype (cache.batches / cache.dataset): no float32 copy on the host.
    # Workers: their prefetched batches (in /dev/shm, charged to the cgroup) + the rank's one; num_workers 0:
    # the rank's batch loader buffers (cache.prefetch).
    if loader.num_workers:
        batches = loader.num_workers * loader.effective_prefetch + 1
        what = f"({loader.num_workers} workers × prefetch {loader.effective_prefetch} + 1) batches"
    else:
        batches = buffer_slots(0)
        what = f"{batches} batch buffers ({PREFETCH_DEPTH} read ahead + 1 in use)"
    sample = sample_io(spec.data, mmap=True).bytes  # a batch holds the sliced samples, however they were read
    buffers = ranks * batches * loader.samples_per_batch * sample
    total = ranks * per_rank + buffers
    formula = (f"{format_bytes(per_rank)}/rank ({source}) × {ranks} ranks + loader {ranks} ranks × {what} × "
               f"{loader.samples_per_batch} samples × {format_bytes(sample)} {spec.data.dtype} = {format_bytes(buffers)}")
    return Resident(total, formula, measured)


def figures(ctx: PreflightContext, step_bytes: int, storage_name: str, storage_bps: float,
            miss_bps: float | None = None, direct_bps: float | None = None) -> CacheFigures | None:
    """The page-cache model for one node of ``ctx``'s job; None when the profile states no page-cache
    rate (then every byte is charged to the storage, as before the model)."""
    memory_bps = ctx.profile.storage.page_cache_read_bps
    if memory_bps is None:
        return None
    size, formula = working_set(ctx)
    return CacheFigures(size, formula, ctx.spec.resources.mem_bytes, resident(ctx), step_bytes, storage_name,
                        storage_bps, memory_bps, miss_bps, direct_bps)

"""How many batches the trainer's loader holds at once, and what they weigh: torch-free, so the
control plane's host-memory and /dev/shm arithmetic (``idmctl.plan.page_cache``, ``idmctl.gate.shm``)
and the loader itself (:mod:`cache.batches`) read the same numbers.

With ``loader.num_workers 0`` (card A's fix for /dev/shm) the rank reads its own batches: a reader
thread fills ``PREFETCH_DEPTH`` batches ahead while the step computes on the one the trainer holds,
so a rank holds ``PREFETCH_DEPTH + 1`` batch buffers in its own memory (pinned on a GPU node) and
none in /dev/shm. With workers, torch's DataLoader holds ``workers × prefetch`` batches in /dev/shm.
"""

from __future__ import annotations

PREFETCH_DEPTH = 2
"""Batches read ahead of the one being computed. One ahead hides the reads when every batch takes
about as long to read; the second absorbs a slow read (a page-cache miss, a busy disk) without a
stall. Deeper only adds host memory: the reads cannot go faster than the storage."""


def buffer_slots(num_workers: int, depth: int = PREFETCH_DEPTH) -> int:
    """Batch buffers one rank holds in its own memory: depth + the one in use (``num_workers 0``);
    with workers, the rank holds the one batch it computes on (the rest are in /dev/shm)."""
    return depth + 1 if num_workers == 0 else 1


def buffer_bytes(samples_per_batch: int, sample_bytes: int, num_workers: int, depth: int = PREFETCH_DEPTH) -> int:
    """Host bytes of one rank's batch buffers: slots × samples × bytes per sample (the cache's dtype)."""
    return buffer_slots(num_workers, depth) * samples_per_batch * sample_bytes

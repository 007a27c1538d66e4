"""What one node's DataLoader workers hold in ``/dev/shm`` at once: the check ``shm`` judges it against the
profile's capacity, and the job script hands it to the node guard."""

from __future__ import annotations

from ground.geometry import sample_io
from ground.spec.schema import ExperimentSpec


def need_bytes(spec: ExperimentSpec) -> int:
    """Bytes of /dev/shm one node's DataLoader workers hold at once (0 with ``num_workers 0``); the
    node guard gets this number from the rendered job script."""
    loader = spec.loader
    if loader.num_workers == 0:
        return 0
    # Workers carry distinct samples only; repeats are made on the rank's device (cache.registry.repeat_samples).
    return (spec.resources.ranks_per_node * loader.num_workers * loader.effective_prefetch * loader.samples_per_batch
            * sample_io(spec.data, mmap=True).bytes)

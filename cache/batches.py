"""The trainer's loader with ``num_workers 0``: one copy from disk to device, reads overlapped with compute.

The old path (torch's DataLoader in the rank's own process) read a sample, converted it to float32
(``hidden.float()``), stacked the samples (default collate), copied the stack into pinned memory and
sent twice the cache's bytes to the GPU, all on the thread that then computes: on card A's geometry
the read was 29 % of a sample's time (``BENCHMARKS.md``, "DataLoader steady state against fio").

Here a batch's ``hidden`` is read straight into a preallocated buffer of ``(B, N, T_w, H, W, C)`` in
the cache's dtype (pinned when the device is a GPU): each sample's exact byte ranges
(``dataset.hidden_ranges``) go into its row by ``preadv`` from the reader pool's threads, which release
the GIL. One reader thread keeps :data:`cache.prefetch.PREFETCH_DEPTH` batches ahead of the one the
step computes on, so the reads overlap compute. On a GPU the batch goes to the device with
``non_blocking=True`` and its buffer is reused only after that copy's CUDA event; the model converts
the dtype on the device (``kv_projectors``' ``.to(dtype)``). Nothing passes through /dev/shm.

``direct=True`` reads the aligned ranges with O_DIRECT (the device writes into the buffer, no kernel
copy, no page cache; buffers are then page-aligned): for working sets far larger than the page cache,
where the plan chose it (``idmctl.plan.page_cache.CacheFigures.reads_direct``; the job is told by
``ENV_LOADER_DIRECT``).

The batch order is the DataLoader's own: its sampler per epoch (``set_epoch``) cut into ``batch_size``
chunks, the last one short, so a run reads the same samples in the same order whichever path loads them.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from cache.hidden import CacheFileInfo, direct_readable, open_for_ranges, range_pieces, read_pieces
from cache.prefetch import PREFETCH_DEPTH, buffer_slots
from ground.contract import ENV_LOADER_DIRECT
from ground.errors import UserError
from ground.units import format_bytes


class RangeDataset(Protocol):
    """What the loader needs of a dataset (``cache.dataset``'s two classes have it)."""

    def __len__(self) -> int: ...
    def hidden_shape(self) -> tuple[tuple[int, ...], torch.dtype]: ...
    def hidden_ranges(self, item: int) -> tuple[CacheFileInfo, list[tuple[int, int, str]]]: ...
    def targets(self, item: int) -> dict[str, Any]: ...


def supports(dataset: Any) -> bool:
    """True for datasets that expose exact byte ranges and read them (``loader.mmap``); a team's own
    class, or ``mmap: false`` (the whole-file comparison path), stays on torch's DataLoader."""
    return (all(callable(getattr(dataset, name, None)) for name in ("hidden_shape", "hidden_ranges", "targets"))
            and getattr(dataset, "mmap", True))


def sampler_batches(sampler: Any, batch_size: int, consumed: int = 0) -> Iterator[list[int]]:
    """Endless batches of indices across epochs, after ``consumed`` of them: the order torch's
    DataLoader gives with this sampler (``set_epoch(epoch)``, then chunks of ``batch_size``, last one short)."""
    epoch = 0
    per_epoch = None
    while True:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        order = list(sampler)
        if per_epoch is None:
            per_epoch = -(-len(order) // batch_size)
            if per_epoch == 0:
                return
            epoch, consumed = divmod(consumed, per_epoch)
            if epoch:  # the first epoch to read is a later one: draw its order instead
                continue
        for first in range(consumed * batch_size, len(order), batch_size):
            yield order[first:first + batch_size]
        consumed = 0
        epoch += 1


class _Slot:
    """One preallocated batch buffer; ``copied`` is the CUDA event of its last H2D copy (the reader
    waits on it before writing the next batch into the same bytes)."""

    def __init__(self, rows: int, shape: tuple[int, ...], dtype: torch.dtype, pin: bool, page_aligned: bool):
        self._memory: mmap.mmap | None = None
        if page_aligned and not pin:  # cudaHostAlloc's pinned memory is page-aligned already
            nbytes = rows * int(torch.Size(shape).numel()) * dtype.itemsize
            self._memory = mmap.mmap(-1, max(nbytes, 1))
            self.hidden = torch.frombuffer(self._memory, dtype=torch.uint8, count=nbytes).view(dtype).view(rows, *shape)
        else:
            self.hidden = torch.empty((rows, *shape), dtype=dtype, pin_memory=pin)
        # One flat byte row per sample: the rows the sample's ranges are read into, end to end.
        self.rows = self.hidden.view(torch.uint8).numpy().reshape(rows, -1)
        # Touch every page now: the kernel's first-touch faults (and zeroing) happen once, at start-up,
        # not inside the reads of the first batches.
        self.rows.fill(0)
        self.copied: Any = None


_END = object()


class BatchLoader:
    """An iterator of batches ``{"hidden": (B, ...) cache dtype, "actions", "action_mask", "eef_pos",
    "demo": [...], "start": (B,)}`` over ``order`` (batches of indices), read :data:`PREFETCH_DEPTH`
    ahead. A batch's tensors stay valid until the next ``next()`` (its buffer is then reused)."""

    def __init__(self, dataset: RangeDataset, order: Iterable[list[int]], batch_size: int,
                 device: torch.device | str = "cpu", depth: int = PREFETCH_DEPTH, pin: bool | None = None,
                 direct: bool = False, start: bool = True):
        self.dataset, self.device, self.direct = dataset, torch.device(device), direct
        self.direct_bytes = 0
        """Bytes read with O_DIRECT (``direct`` and the sample's ranges aligned); the rest went through
        the page cache."""
        shape, dtype = dataset.hidden_shape()
        pin = self.device.type == "cuda" and torch.cuda.is_available() if pin is None else pin
        slots = buffer_slots(0, depth)
        sample_bytes = int(torch.Size(shape).numel()) * dtype.itemsize
        try:
            self._slots = [_Slot(batch_size, shape, dtype, pin, direct) for _ in range(slots)]
        except (RuntimeError, OSError, MemoryError) as exc:  # cudaHostAlloc / malloc / mmap refused: say what was asked for
            need = slots * batch_size * sample_bytes
            raise UserError(f"cannot allocate the loader's {slots} batch buffers ({depth} prefetch + 1 in use) × "
                            f"{batch_size} samples × {sample_bytes:,} B = {format_bytes(need)}"
                            f"{' pinned' if pin else ''} ({str(exc).splitlines()[0][:100]})",
                            field="loader.batch_size", hint="lower loader.batch_size or raise resources.mem") from exc
        self.batch_bytes = batch_size * sample_bytes
        self.bytes_read = 0
        """Hidden-state bytes read so far (the ranges, exactly)."""
        self._free: queue.Queue[_Slot | None] = queue.Queue()
        for slot in self._slots:
            self._free.put(slot)
        self._ready: queue.Queue[Any] = queue.Queue()
        self._held: _Slot | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(iter(order),), daemon=True,
                                        name="batch-reader")
        if start:
            self.start()

    def start(self) -> None:
        """Start reading ahead (``start=False`` at construction: a benchmark times reads, not allocation)."""
        self._thread.start()

    # -- the reader thread ----------------------------------------------------------------------

    def _produce(self, order: Iterator[list[int]]) -> None:
        try:
            for indices in order:
                slot = self._free.get()
                if slot is None or self._stop.is_set():
                    return
                if slot.copied is not None:
                    slot.copied.synchronize()  # the last H2D copy out of these bytes has finished
                    slot.copied = None
                self._ready.put((slot, self._read(indices, slot)))
            self._ready.put(_END)
        except BaseException as exc:  # noqa: BLE001 (handed to the consumer, raised there)
            self._ready.put(exc)

    def _read(self, indices: list[int], slot: _Slot) -> dict[str, Any]:
        fds: dict[tuple[Path, bool], int] = {}
        pieces = []
        try:
            for row, item in enumerate(indices):
                info, ranges = self.dataset.hidden_ranges(item)
                # O_DIRECT only where every range and the row's address are aligned; else the page cache.
                direct = self.direct and direct_readable(ranges, slot.rows[row].ctypes.data)
                if (info.path, direct) not in fds:
                    fds[(info.path, direct)] = open_for_ranges(info.path, direct)
                if direct:
                    self.direct_bytes += slot.rows.shape[1]
                pieces += range_pieces(fds[(info.path, direct)], info.path, ranges, memoryview(slot.rows[row]))
            # The small targets (HDF5) are read on this thread while the pool's preadv calls run.
            targets = read_pieces(pieces, lambda: [self.dataset.targets(item) for item in indices])
        finally:
            for fd in fds.values():
                os.close(fd)
        self.bytes_read += len(indices) * slot.rows.shape[1]
        return {"hidden": slot.hidden[:len(indices)], **_collate_small(targets)}

    # -- the consumer (the training loop) -------------------------------------------------------

    def __iter__(self) -> "BatchLoader":
        return self

    def __next__(self) -> dict[str, Any]:
        if self._held is not None:  # the step that used it is over
            self._free.put(self._held)
            self._held = None
        item = self._ready.get()
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        slot, batch = item
        if self.device.type != "cuda":
            self._held = slot
            return batch
        moved = {key: value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                 for key, value in batch.items()}
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        slot.copied = event
        self._free.put(slot)  # the reader waits on the event before it writes here again
        return moved

    def close(self, wait_s: float = 0.0) -> None:
        """Stop the reader (it exits before its next batch); idempotent. ``wait_s``: wait that long for a
        read in flight to end (a measurement that follows must not count its CPU)."""
        self._stop.set()
        self._free.put(None)
        if wait_s and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def __del__(self) -> None:
        if hasattr(self, "_thread"):  # not when construction refused the buffers (nothing started)
            self.close()


def _collate_small(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack the small per-sample tensors; ints become a tensor, strings a list (as default collate)."""
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [sample[key] for sample in samples]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        elif isinstance(values[0], int):
            out[key] = torch.tensor(values)
        else:
            out[key] = values
    return out


def trainer_batches(loader: Any, consumed: int, device: torch.device) -> Iterator[dict[str, Any]] | None:
    """The trainer's batches through :class:`BatchLoader` when the loader runs in the rank's own
    process (``num_workers 0``) over a dataset with exact ranges; None: use torch's DataLoader.
    O_DIRECT when the job was told so (``ENV_LOADER_DIRECT``: the plan's choice, made in one place)."""
    if loader.num_workers != 0 or not supports(loader.dataset):
        return None
    return BatchLoader(loader.dataset, sampler_batches(loader.sampler, loader.batch_size, consumed),
                       loader.batch_size, device, direct=os.environ.get(ENV_LOADER_DIRECT) == "1")

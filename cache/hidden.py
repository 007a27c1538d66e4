"""The multi-layer hidden-state cache: two formats behind one reader.

``safetensors`` (ours): one contiguous tensor per cached Cosmos block, named ``layer_<blockid>``, of
shape (T, H, W, C), stored in cache order, with the data section starting on a 4 KiB boundary.
Metadata (strings, as safetensors requires; JSON-encoded): ``format``, ``layers`` (block ids),
``frames``, ``token_grid``, ``channels``, ``dtype``, ``encoder``, ``encoder_version``, ``demo``,
``frame_stride``. A selection of N layers × a window of frames is N exact byte ranges, read with
``POSIX_FADV_RANDOM`` so the kernel reads no more than asked (this disk's readahead is 8 MB). Without
readahead each ``preadv`` is one synchronous read, so the ranges are cut into 2 MiB pieces read by a
few threads at once (``preadv`` releases the GIL): several reads in flight, as readahead keeps for a
sequential read, with no byte beyond the selection.

Cache frame ``f`` of a file shows episode timestep ``f × frame_stride`` (clamped to the episode's
last step when the episode is shorter than ``frames × frame_stride``).

``legacy_pt`` (card A): a ``torch.save`` dict ``{"hidden_multi": (L, T, H, W, C) bf16, "layers": [...]}``.
Its zip directory and a restricted read of its pickle locate the storage (``cache.legacy_pt``; nothing
is unpickled), and a selection is the same N exact ``preadv`` ranges as ours.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch

from ground.geometry import HiddenGeometry
from ground.errors import UserError

CacheFormat = Literal["safetensors", "legacy_pt"]
FORMAT_TAG = "idmctl.hidden/1"
DATA_ALIGNMENT = 4096
"""Data section starts page-aligned, so whole-frame ranges start on page boundaries."""
_MAX_HEADER = 100 * 1024 * 1024

_ST_DTYPES: dict[str, torch.dtype] = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_SPEC_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_SPEC_NAME = {dtype: name for name, dtype in _SPEC_DTYPES.items()}
_ST_NAME = {dtype: name for name, dtype in _ST_DTYPES.items()}


@dataclass(frozen=True)
class CacheFileInfo:
    """What one cache file holds, validated against its own bytes."""

    path: Path
    format: CacheFormat
    layers: list[int]
    """Cached Cosmos block ids, in file order."""
    frames: int
    height: int
    width: int
    channels: int
    dtype: str
    """``bfloat16`` | ``float16`` | ``float32`` (spec spelling)."""
    file_bytes: int
    meta: dict[str, Any] = field(default_factory=dict)
    data_start: int = 0
    """Byte offset of the first tensor byte (safetensors data section / the legacy zip's storage)."""
    offsets: dict[int, int] = field(default_factory=dict)
    """Block id → absolute byte offset of its contiguous (T, H, W, C) tensor (both formats)."""

    @property
    def geometry(self) -> HiddenGeometry:
        return HiddenGeometry(len(self.layers), self.frames, self.height, self.width, self.channels,
                              _SPEC_DTYPES[self.dtype].itemsize)

    @property
    def frame_stride(self) -> int:
        return int(self.meta.get("frame_stride", 1))

    @property
    def torch_dtype(self) -> torch.dtype:
        return _SPEC_DTYPES[self.dtype]


def cache_file(cache_root: str | Path, demo: str, fmt: CacheFormat) -> Path:
    """Where a demo's cache file lives: ``<cache_root>/<demo>.safetensors`` or ``<demo>.pt``."""
    suffix = {"safetensors": ".safetensors", "legacy_pt": ".pt"}[fmt]
    return Path(cache_root) / f"{demo}{suffix}"


def _bad(path: Path, what: str, hint: str = "rebuild it with `idmctl cache build-hidden`") -> UserError:
    return UserError(what, file=str(path), field="cache", hint=hint)


# --- writing ---------------------------------------------------------------------------------------

def _header_bytes(tensors: dict[str, dict[str, Any]], meta: dict[str, str]) -> bytes:
    body = json.dumps({"__metadata__": meta, **tensors}, separators=(",", ":")).encode()
    # safetensors allows trailing spaces in the header; pad so the data starts page-aligned.
    padded = -(-(8 + len(body)) // DATA_ALIGNMENT) * DATA_ALIGNMENT - 8
    return struct.pack("<Q", padded) + body + b" " * (padded - len(body))


def write_hidden(path: str | Path, hidden: torch.Tensor, layers: list[int], meta: dict[str, Any]) -> None:
    """Write ``hidden`` (L, T, H, W, C) as one tensor per layer, atomically (see :func:`write_layers`)."""
    path = Path(path)
    if hidden.ndim != 5:
        raise _bad(path, f"hidden must be (L, T, H, W, C), got shape {tuple(hidden.shape)}", "fix the builder")
    if hidden.shape[0] != len(layers):
        raise _bad(path, f"{hidden.shape[0]} layers of hidden states but {len(layers)} block ids", "fix the builder")
    if hidden.dtype not in _ST_NAME:
        raise _bad(path, f"dtype {hidden.dtype} is not bf16/fp16/fp32", "cast before writing")
    _, frames, height, width, channels = hidden.shape
    write_layers(path, layers, (frames, height, width, channels), _SPEC_NAME[hidden.dtype],
                 (hidden[i].contiguous().view(torch.uint8).numpy() for i in range(len(layers))), meta)


def write_layers(path: str | Path, layers: list[int], shape: tuple[int, int, int, int], dtype: str,
                 chunks: Iterable[Any], meta: dict[str, Any],
                 verify: Callable[[Path], None] | None = None) -> None:
    """Write one (T, H, W, C) tensor per block from ``chunks`` (one bytes-like per layer), atomically.

    Layers stream one at a time (a converter never holds a 3.8 GB file in memory). The file is
    written beside its target under a temp name, fsynced and renamed over it: a crash leaves no file
    at ``path``, and readers that opened an older file keep their (unlinked) inode. ``verify`` runs
    on the complete temp file before the rename: if it raises, nothing appears at ``path``.
    """
    path = Path(path)
    frames, height, width, channels = shape
    layer_bytes = frames * height * width * channels * _SPEC_DTYPES[dtype].itemsize
    tensors = {f"layer_{block}": {"dtype": _ST_NAME[_SPEC_DTYPES[dtype]], "shape": [frames, height, width, channels],
                                  "data_offsets": [i * layer_bytes, (i + 1) * layer_bytes]}
               for i, block in enumerate(layers)}
    full_meta = {"format": FORMAT_TAG, "layers": list(layers), "frames": frames, "token_grid": [height, width],
                 "channels": channels, "dtype": dtype, **meta}
    header = _header_bytes(tensors, {key: json.dumps(value) for key, value in full_meta.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(header)
            written = 0
            for chunk in chunks:
                if memoryview(chunk).nbytes != layer_bytes:
                    raise _bad(path, f"layer {written} has {memoryview(chunk).nbytes:,} B, its shape needs "
                                     f"{layer_bytes:,} B", "fix the writer")
                handle.write(chunk)
                written += 1
            if written != len(layers):
                raise _bad(path, f"{written} layers written for {len(layers)} block ids", "fix the writer")
            handle.flush()
            os.fsync(handle.fileno())
        if verify is not None:
            verify(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --- inspecting ------------------------------------------------------------------------------------

def _pread_exact(fd: int, length: int, offset: int, path: Path) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise _bad(path, f"truncated: wanted {length:,} B at offset {offset:,}, file ends first")
    return data


def _inspect_safetensors(path: Path, fd: int) -> CacheFileInfo:
    size = os.fstat(fd).st_size
    (header_len,) = struct.unpack("<Q", _pread_exact(fd, 8, 0, path))
    if header_len > min(_MAX_HEADER, size - 8):
        raise _bad(path, f"corrupt safetensors header: length {header_len:,} B in a {size:,} B file")
    try:
        header = json.loads(_pread_exact(fd, header_len, 8, path))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"corrupt safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise _bad(path, f"corrupt safetensors header: a JSON {type(header).__name__}, not an object")
    try:
        meta = {key: json.loads(value) for key, value in header.pop("__metadata__", {}).items()}
    except (TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"corrupt safetensors metadata: {exc}") from exc
    if meta.get("format") != FORMAT_TAG:
        raise _bad(path, f"not an idmctl hidden cache (format {meta.get('format')!r}, want {FORMAT_TAG!r})")
    try:
        return _geometry_from_header(path, size, header_len, header, meta)
    except (KeyError, TypeError, ValueError) as exc:
        # A header without `layers`, or with a field of the wrong type: a bad file, which the builder
        # rebuilds (is_cached treats a UserError as "not cached") and preflight reports per check.
        missing = f"no {exc.args[0]!r} in its metadata" if isinstance(exc, KeyError) else str(exc)
        raise _bad(path, f"corrupt idmctl header: {missing}") from exc


def _geometry_from_header(path: Path, size: int, header_len: int, header: dict[str, Any],
                          meta: dict[str, Any]) -> CacheFileInfo:
    layers = [int(block) for block in meta["layers"]]
    data_start = 8 + header_len
    frames, (height, width), channels = int(meta["frames"]), meta["token_grid"], int(meta["channels"])
    dtype = str(meta["dtype"])
    if dtype not in _SPEC_DTYPES:
        raise _bad(path, f"dtype {dtype!r} is not bfloat16/float16/float32")
    itemsize = _SPEC_DTYPES[dtype].itemsize
    want_shape = [frames, height, width, channels]
    offsets: dict[int, int] = {}
    for block in layers:
        entry = header.get(f"layer_{block}")
        if entry is None:
            raise _bad(path, f"metadata lists block {block} but there is no tensor layer_{block}")
        if entry["shape"] != want_shape or _ST_DTYPES.get(entry["dtype"]) != _SPEC_DTYPES[dtype]:
            raise _bad(path, f"layer_{block} is {entry['dtype']} {entry['shape']}, metadata says {dtype} {want_shape}")
        begin, end = entry["data_offsets"]
        if end - begin != frames * height * width * channels * itemsize:
            raise _bad(path, f"layer_{block} spans {end - begin:,} B, its shape needs "
                             f"{frames * height * width * channels * itemsize:,} B")
        if data_start + end > size:
            raise _bad(path, f"truncated: layer_{block} ends at byte {data_start + end:,} but the file has {size:,} B")
        offsets[block] = data_start + begin
    return CacheFileInfo(path, "safetensors", layers, frames, int(height), int(width), channels, dtype, size,
                         meta, data_start, offsets)


def _load_legacy(path: Path, mmap: bool) -> dict[str, Any]:
    try:
        payload = torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError/UnpicklingError/EOFError for bad files
        raise _bad(path, f"unreadable legacy .pt ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") from exc
    if not isinstance(payload, dict) or "hidden_multi" not in payload or "layers" not in payload:
        raise _bad(path, "legacy .pt is not a dict with 'hidden_multi' and 'layers'")
    return payload


def _inspect_legacy(path: Path) -> CacheFileInfo:
    """From the zip directory and a restricted read of data.pkl (cache.legacy_pt), never torch.load."""
    from cache.legacy_pt import read_layout

    layout = read_layout(path)
    _, frames, height, width, channels = layout.shape
    offsets = {block: layout.layer_offset(i) for i, block in enumerate(layout.layers)}
    meta = {**layout.meta, **({"storage_crc32": layout.storage_crc32} if layout.storage_crc32 is not None else {})}
    return CacheFileInfo(path, "legacy_pt", layout.layers, frames, height, width, channels, layout.dtype,
                         layout.file_bytes, meta, layout.data_offset, offsets)


def inspect_file(path: str | Path) -> CacheFileInfo:
    """Geometry of one cache file (format from its suffix), validated; bad files raise UserError."""
    path = Path(path)
    if not path.exists():
        raise _bad(path, "cache file does not exist", "build the cache: `idmctl cache build-hidden EXP`")
    if path.suffix == ".pt":
        return _inspect_legacy(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        return _inspect_safetensors(path, fd)
    finally:
        os.close(fd)


def check_matches(info: CacheFileInfo, *, layers: list[int] | None = None, frames: int | None = None,
                  token_grid: tuple[int, int] | None = None, channels: int | None = None,
                  dtype: str | None = None, routed: list[int] | None = None) -> None:
    """UserError naming the file when its geometry is not what the spec expects.

    ``routed`` (the spec's selected blocks) also accepts a routed-only copy, which holds exactly those
    blocks (``stage.layers: routed`` / ``idmctl cache convert --layers routed``).
    """
    expected = {"layers": layers, "frames": frames, "token_grid": tuple(token_grid) if token_grid else None,
                "channels": channels, "dtype": dtype}
    actual = {"layers": info.layers, "frames": info.frames, "token_grid": (info.height, info.width),
              "channels": info.channels, "dtype": info.dtype}
    if routed is not None and info.layers == list(routed):
        expected["layers"] = None
    for key, want in expected.items():
        if want is not None and actual[key] != want:
            raise UserError(f"file has {key} {actual[key]} but the spec says {want}{_bytes_differ(info, key, want)}",
                            file=str(info.path), field=f"data.{'cached_layers' if key == 'layers' else key}",
                            hint="fix the spec or rebuild the cache")


def _bytes_differ(info: CacheFileInfo, key: str, want: Any) -> str:
    """What the difference does to the bytes a reader takes from the file, as arithmetic: the exact ranges
    are computed from the spec's geometry, so a reader trusting it would cut the file at the wrong places."""
    grid, channels, itemsize = (info.height, info.width), info.channels, info.torch_dtype.itemsize
    if key == "layers":
        return ""
    if key == "frames":
        frame = info.geometry.frame_bytes
        return (f": a layer is {info.frames} × {frame:,} B = {info.frames * frame:,} B in the file, "
                f"{want} × {frame:,} B = {want * frame:,} B by the spec")
    spec_grid = tuple(want) if key == "token_grid" else grid
    spec_channels = want if key == "channels" else channels
    spec_itemsize = _SPEC_DTYPES[want].itemsize if key == "dtype" and want in _SPEC_DTYPES else itemsize
    have = grid[0] * grid[1] * channels * itemsize
    need = spec_grid[0] * spec_grid[1] * spec_channels * spec_itemsize
    return (f": a frame is {grid[0]} × {grid[1]} × {channels} × {itemsize} B = {have:,} B in the file, "
            f"{spec_grid[0]} × {spec_grid[1]} × {spec_channels} × {spec_itemsize} B = {need:,} B by the spec")


def file_positions(info: CacheFileInfo, cached_layers: list[int] | None, indices: list[int]) -> list[int]:
    """Where the spec's cache indices lie in this file: themselves in a full file, remapped by block
    id in a routed-only copy (which holds just the selected blocks, in order)."""
    if cached_layers is None or info.layers == list(cached_layers):
        return list(indices)
    try:
        return [info.layers.index(cached_layers[i]) for i in indices]
    except (ValueError, IndexError):
        raise UserError(f"file holds blocks {info.layers}, not the selected ones", file=str(info.path),
                        field="data.selected_layer_indices", hint="stage or convert the routed layers again") from None


# --- reading ---------------------------------------------------------------------------------------

def _check_selection(info: CacheFileInfo, layer_indices: list[int], frame_start: int, frame_count: int) -> None:
    for index in layer_indices:
        if not 0 <= index < len(info.layers):
            raise UserError(f"layer index {index} is outside the {len(info.layers)} cached layers {info.layers}",
                            file=str(info.path), field="data.selected_layer_indices",
                            hint=f"use indices 0..{len(info.layers) - 1}")
    if frame_start < 0 or frame_count < 1 or frame_start + frame_count > info.frames:
        raise UserError(f"frames {frame_start}..{frame_start + frame_count - 1} are outside the {info.frames} cached",
                        file=str(info.path), field="data.frame_window", hint="shrink the window")


READ_PIECE_BYTES = 2 << 20
"""Exact reads are cut into pieces of this size: small enough that READ_THREADS pieces are in flight
for a single layer's range, large enough that each is one efficient request to the disk."""
READ_THREADS = 8
"""Pieces in flight at once. On the card's sample (4 layers × 5 frames × 27 × 48 × 5120 × 2 B = 265 MB)
on this VM: one synchronous range after another ~0.97 GB/s, 8 threads of 2 MiB pieces 1.0–1.3 GB/s
(1 to 64 threads, 0.5 to 16 MiB pieces all landed there), while a whole-file sequential read ranged
1.5–3.0 GB/s from one hour to the next (bench/hidden_reads.py gives both, measured side by side)."""

INLINE_READ_BYTES = READ_PIECE_BYTES
"""Selections up to this size are read on the calling thread, one range after another (one piece's
worth: the pool's parallelism only pays once there are pieces to spread)."""

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None


def _read_pool() -> ThreadPoolExecutor:
    """One pool per process: a DataLoader worker forked from a parent that had a pool gets a new one
    (threads do not survive ``fork``)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(READ_THREADS, thread_name_prefix="hidden-read"))
        return _pool[1]


def pread_into(fd: int, view: memoryview, offset: int, path: Path, what: str = "",
               hint: str = "rebuild it with `idmctl cache build-hidden`") -> None:
    """Fill ``view`` from ``offset`` of the open file (``preadv`` may return short); a file that ends
    first is a one-line error naming what was being read."""
    done = 0
    while done < len(view):
        try:
            got = os.preadv(fd, [view[done:]], offset + done)
        except OSError as exc:
            # O_DIRECT: after a short read at an unaligned end of file the next offset is unaligned (EINVAL).
            if exc.errno != errno.EINVAL or done == 0:
                raise
            got = 0
        if got == 0:
            raise _bad(path, f"truncated while reading {what or f'{len(view):,} B'} at byte {offset + done:,}", hint)
        done += got


def selection_ranges(info: CacheFileInfo, layer_indices: list[int], frame_start: int,
                     frame_count: int) -> list[tuple[int, int, str]]:
    """``(file offset, length, what)`` per selected layer, in output order: the exact bytes of a
    (N, T_w, H, W, C) selection (each layer one contiguous (T, H, W, C) run at ``info.offsets[block]``)."""
    _check_selection(info, layer_indices, frame_start, frame_count)
    frame_bytes = info.geometry.frame_bytes
    length = frame_count * frame_bytes
    return [(info.offsets[info.layers[index]] + frame_start * frame_bytes, length,
             f"layer index {index} frames {frame_start}..{frame_start + frame_count - 1}")
            for index in layer_indices]


def range_pieces(fd: int, path: Path, ranges: list[tuple[int, int, str]],
                 dest: memoryview) -> list[tuple[int, memoryview, int, Path, str]]:
    """Cut ``ranges`` (laid end to end in ``dest``) into :data:`READ_PIECE_BYTES` pieces for
    :func:`pread_into`: ``(fd, destination slice, file offset, path, what)``."""
    pieces, at = [], 0
    for offset, length, what in ranges:
        span = f"{what} (bytes {offset:,}..{offset + length:,})"
        for start in range(0, length, READ_PIECE_BYTES):
            size = min(READ_PIECE_BYTES, length - start)
            pieces.append((fd, dest[at + start:at + start + size], offset + start, path, span))
        at += length
    if at != len(dest):
        raise ValueError(f"{at:,} B of ranges for a {len(dest):,} B destination")
    return pieces


def read_pieces(pieces: list[tuple[int, memoryview, int, Path, str]],
                while_reading: Callable[[], Any] | None = None) -> Any:
    """Every piece read by the process's pool (``preadv`` releases the GIL); all finish before the
    first error (a truncated file: one line naming it and the byte range) is raised, so no read is
    still writing into a buffer the caller reuses. ``while_reading`` runs on this thread while the
    pieces are in flight (the batch loader reads its small targets then); its result is returned."""
    if sum(len(piece[1]) for piece in pieces) <= INLINE_READ_BYTES:
        # A few small ranges: handing them to the pool costs more thread wake-ups than the reads.
        for piece in pieces:
            pread_into(*piece)
        return while_reading() if while_reading is not None else None
    pool = _read_pool()
    futures = [pool.submit(pread_into, *piece) for piece in pieces]
    try:
        result = while_reading() if while_reading is not None else None
    finally:
        wait(futures)
    for future in futures:
        future.result()
    return result


DIRECT_ALIGNMENT = 4096
"""O_DIRECT wants file offsets, lengths and memory addresses on the device's block boundaries; 4 KiB
covers every common logical block size. Our files' data sections start page-aligned, and card A's frame
(27 × 48 × 5120 × 2 B = 13,271,040 B) is a whole number of pages, so its ranges qualify."""


def open_for_ranges(path: Path, direct: bool = False) -> int:
    """An fd with readahead off: the kernel reads the asked ranges and nothing beyond them. ``direct``:
    O_DIRECT, around the page cache (the device writes into the caller's buffer: no kernel copy)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def direct_readable(ranges: list[tuple[int, int, str]], address: int) -> bool:
    """Whether ``ranges`` laid end to end from memory ``address`` meet O_DIRECT's alignment."""
    return address % DIRECT_ALIGNMENT == 0 and all(
        offset % DIRECT_ALIGNMENT == 0 and length % DIRECT_ALIGNMENT == 0 for offset, length, _ in ranges)


def read_exact_slice(info: CacheFileInfo, layer_indices: list[int], frame_start: int,
                     frame_count: int) -> torch.Tensor:
    """N exact byte ranges (one per layer) straight into the output tensor; nothing else is read.

    Works for both formats: each layer is one contiguous (T, H, W, C) run at ``info.offsets[block]``.
    """
    ranges = selection_ranges(info, layer_indices, frame_start, frame_count)
    out = torch.empty((len(layer_indices), frame_count, info.height, info.width, info.channels),
                      dtype=info.torch_dtype)
    fd = open_for_ranges(info.path)
    try:
        # Every piece ends before the fd is closed (a closed number can be reused by another open).
        read_pieces(range_pieces(fd, info.path, ranges, memoryview(out.view(torch.uint8).numpy().reshape(-1))))
    finally:
        os.close(fd)
    return out


def read_legacy_torch_load(path: Path, layer_indices: list[int], frame_start: int, frame_count: int,
                           mmap: bool = True) -> torch.Tensor:
    """The old way: ``torch.load(mmap=...)`` then slice + clone (kept to measure against; 5.06× the slice)."""
    payload = _load_legacy(path, mmap=mmap)
    hidden = payload["hidden_multi"]
    info = CacheFileInfo(path, "legacy_pt", [int(b) for b in payload["layers"]], hidden.shape[1], hidden.shape[2],
                         hidden.shape[3], hidden.shape[4], _SPEC_NAME.get(hidden.dtype, "bfloat16"), 0)
    _check_selection(info, layer_indices, frame_start, frame_count)
    return torch.stack([hidden[i, frame_start:frame_start + frame_count].clone() for i in layer_indices])


def read_hidden(path: str | Path, layer_indices: list[int], frame_start: int, frame_count: int,
                *, mmap: bool = True, info: CacheFileInfo | None = None) -> torch.Tensor:
    """(N, T_w, H, W, C) in the cache's dtype, for cache indices ``layer_indices`` and a frame window.

    Both formats read exact byte ranges. ``mmap=False`` reads the whole file first (what the card's
    N=12 runs did: a full ``torch.load`` of a legacy file), for comparison.
    ``info`` (from :func:`inspect_file`) skips re-parsing the header on hot paths.
    """
    path = Path(path)
    if path.suffix == ".pt" and not mmap:
        return read_legacy_torch_load(path, layer_indices, frame_start, frame_count, mmap=False)
    info = info or inspect_file(path)
    if mmap:
        return read_exact_slice(info, layer_indices, frame_start, frame_count)
    _check_selection(info, layer_indices, frame_start, frame_count)
    whole = path.read_bytes()
    geometry = info.geometry
    layers = [torch.frombuffer(bytearray(whole[info.offsets[b]:info.offsets[b] + geometry.layer_bytes]),
                               dtype=info.torch_dtype).view(info.frames, info.height, info.width, info.channels)
              for b in (info.layers[i] for i in layer_indices)]
    return torch.stack([layer[frame_start:frame_start + frame_count] for layer in layers])


def write_legacy(path: str | Path, hidden: torch.Tensor, layers: list[int], **extra: Any) -> None:
    """Write a card-format ``.pt`` dict (tests and converters; the lab's builder made these)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save({"hidden_multi": hidden, "layers": list(layers), **extra}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

"""Exact reads of card A's legacy ``.pt`` cache files, without unpickling anything untrusted.

A ``torch.save`` file (torch ≥ 1.6) is a zip archive: ``<prefix>/data.pkl`` (the pickled object
graph, tensors replaced by persistent ids naming a storage) and ``<prefix>/data/<key>`` (each
storage's raw bytes, stored uncompressed, padded to an alignment by the local header's extra field).

We read the zip's central directory (``zipfile``: no code runs), then ``data.pkl`` through
:class:`_SafeUnpickler`, whose ``find_class`` answers only the few names a tensor dict needs, each
mapped to a harmless stand-in that records (storage key, dtype, storage offset, shape, stride);
anything else is refused. The storage's byte offset in the file is the local file header's offset +
30 + name length + extra length (read from the 30-byte header itself, not trusted from the central
directory). A layer × frame-window selection is then N exact ``preadv`` ranges, as for our safetensors.

Layouts met in practice, all handled: archive prefix ``archive/`` (torch ≥ 2.x) or the file's stem
(torch 1.6–1.x); with or without ``byteorder`` / ``.format_version`` / ``.storage_alignment`` records;
any storage alignment. The pre-1.6 non-zip format (``_use_new_zipfile_serialization=False``) has no
directory to seek in: it is a one-line error with the fix (re-save, or convert through torch.load).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ground.errors import UserError

LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
"""Zip local file header: signature … name length, extra length (30 bytes)."""
LOCAL_SIGNATURE = 0x04034B50
MAX_PICKLE = 16 * 1024 * 1024
"""data.pkl of a tensor dict is a few hundred bytes; a huge one is not a cache file."""

# Storage class names (torch.save pickles ``torch.<Name>Storage``) → (spec dtype name, bytes per element).
_STORAGE_DTYPES = {"BFloat16Storage": ("bfloat16", 2), "HalfStorage": ("float16", 2),
                   "FloatStorage": ("float32", 4)}
_OTHER_STORAGES = ("DoubleStorage", "LongStorage", "IntStorage", "ShortStorage", "CharStorage", "ByteStorage",
                   "BoolStorage", "UntypedStorage")
"""Named so a wrong dtype is reported as such rather than as a refused global."""
_FIX = "rewrite it with `torch.save(obj, path)` from torch ≥ 1.6, or convert it: `idmctl cache convert EXP`"


def _bad(path: Path, what: str, hint: str = _FIX) -> UserError:
    return UserError(what, file=str(path), field="cache", hint=hint)


@dataclass(frozen=True)
class StorageRef:
    """A persistent id from data.pkl: which ``data/<key>`` record holds the bytes, and their dtype."""

    key: str
    dtype: str
    itemsize: int
    numel: int


@dataclass(frozen=True)
class TensorRef:
    """What ``_rebuild_tensor_v2`` would build, as numbers only."""

    storage: StorageRef
    offset: int
    """Storage offset in elements."""
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def contiguous(self) -> bool:
        expected, step = [], 1
        for size in reversed(self.shape):
            expected.append(step)
            step *= size
        return tuple(reversed(expected)) == self.stride


class _StorageType:
    def __init__(self, name: str):
        self.name = name


def _rebuild_tensor_v2(storage: Any, offset: Any, shape: Any, stride: Any, *_rest: Any) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise pickle.UnpicklingError("tensor without a storage")
    return TensorRef(storage, int(offset), tuple(int(s) for s in shape), tuple(int(s) for s in stride))


def _ordered_dict(*args: Any) -> dict[Any, Any]:
    return dict(*args)


class _SafeUnpickler(pickle.Unpickler):
    """Resolves only tensor-rebuild names, to stand-ins; nothing from the file can run code."""

    _ALLOWED: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("collections", "OrderedDict"): _ordered_dict,
        **{("torch", name): _StorageType(name) for name in (*_STORAGE_DTYPES, *_OTHER_STORAGES)},
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused global {module}.{name}") from None

    def persistent_load(self, pid: Any) -> StorageRef:
        # torch.save: ("storage", storage_type, key, location, numel)
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {str(pid)[:60]}")
        storage_type, key, numel = pid[1], pid[2], pid[4]
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError("storage without a type")
        if storage_type.name not in _STORAGE_DTYPES:
            raise pickle.UnpicklingError(f"hidden states stored as {storage_type.name}, not bf16/fp16/fp32")
        dtype, itemsize = _STORAGE_DTYPES[storage_type.name]
        return StorageRef(str(key), dtype, itemsize, int(numel))


@dataclass(frozen=True)
class LegacyLayout:
    """Where the hidden tensor of one legacy file lies, and its safe metadata."""

    path: Path
    file_bytes: int
    layers: list[int]
    shape: tuple[int, int, int, int, int]
    dtype: str
    itemsize: int
    data_offset: int
    """Absolute byte offset of element [0, 0, 0, 0, 0] of ``hidden_multi``."""
    meta: dict[str, Any]
    """The dict's other plain entries (ints, floats, strings, lists), e.g. ``frame_stride``."""
    storage_crc32: int | None = None
    """The zip's CRC-32 of the storage record, when ``hidden_multi`` is exactly that storage: a
    converter reading every layer can check the bytes it read against what torch.save wrote."""

    @property
    def layer_bytes(self) -> int:
        _, frames, height, width, channels = self.shape
        return frames * height * width * channels * self.itemsize

    @property
    def frame_bytes(self) -> int:
        return self.layer_bytes // self.shape[1]

    def layer_offset(self, index: int) -> int:
        return self.data_offset + index * self.layer_bytes


def _record_offset(path: Path, fd: int, info: zipfile.ZipInfo) -> int:
    """Byte offset of a stored record's data: its local header says how long name + extra are."""
    raw = os.pread(fd, LOCAL_HEADER.size, info.header_offset)
    if len(raw) != LOCAL_HEADER.size:
        raise _bad(path, f"truncated zip: local header of {info.filename} at byte {info.header_offset:,}")
    fields = LOCAL_HEADER.unpack(raw)
    if fields[0] != LOCAL_SIGNATURE:
        raise _bad(path, f"corrupt zip: no local header signature for {info.filename} at byte {info.header_offset:,}")
    name_len, extra_len = fields[9], fields[10]
    return info.header_offset + LOCAL_HEADER.size + name_len + extra_len


def read_layout(path: str | Path) -> LegacyLayout:
    """Parse a legacy ``.pt`` without ``torch.load``: validated layout of ``hidden_multi``, or a UserError."""
    path = Path(path)
    if not path.exists():
        raise _bad(path, "cache file does not exist", "build the cache: `idmctl cache build-hidden EXP`")
    size = path.stat().st_size
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as handle:
            head = handle.read(2)
        if head == b"PK":
            raise _bad(path, f"truncated or corrupt zip: no central directory at the end of its {size:,} B",
                       "copy it again from the source, or rebuild it")
        if head[:1] == b"\x80":  # a pickle protocol marker: torch.save's pre-1.6 format
            raise _bad(path, "legacy non-zip torch.save format (_use_new_zipfile_serialization=False): "
                             "its tensors cannot be located without unpickling",
                       "re-save it with torch ≥ 1.6 (torch.save(torch.load(p, weights_only=True), p))")
        raise _bad(path, "not a torch.save zip archive")
    fd = os.open(path, os.O_RDONLY)
    try:
        with zipfile.ZipFile(path) as archive:
            infos = {info.filename: info for info in archive.infolist()}
            pickles = [name for name in infos if name.endswith("/data.pkl") and name.count("/") == 1]
            if len(pickles) != 1:
                raise _bad(path, f"zip holds {len(pickles)} data.pkl records, a torch.save file holds one")
            prefix = pickles[0][: -len("data.pkl")]
            byteorder = infos.get(prefix + "byteorder")
            if byteorder is not None and archive.read(byteorder) != b"little":
                raise _bad(path, f"byte order {archive.read(byteorder)!r}, this reader handles little-endian",
                           "convert it on a big-endian machine with torch.load")
            if infos[pickles[0]].file_size > MAX_PICKLE:
                raise _bad(path, f"data.pkl is {infos[pickles[0]].file_size:,} B, not a cache file's dict")
            try:
                payload = _SafeUnpickler(io.BytesIO(archive.read(pickles[0]))).load()
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
                raise _bad(path, f"data.pkl is not a plain tensor dict ({exc})") from exc
            if not isinstance(payload, dict) or "hidden_multi" not in payload or "layers" not in payload:
                raise _bad(path, "legacy .pt is not a dict with 'hidden_multi' and 'layers'")
            tensor, layers = payload["hidden_multi"], payload["layers"]
            if not isinstance(tensor, TensorRef) or len(tensor.shape) != 5:
                raise _bad(path, f"hidden_multi must be a (L, T, H, W, C) tensor, got "
                                 f"{getattr(tensor, 'shape', type(tensor).__name__)}")
            if min(tensor.shape) < 1 or tensor.offset < 0 or min(tensor.stride, default=1) < 0:
                # a negative size made the byte arithmetic negative (a crash); a zero one converts to empty
                # files that verified as equal to their empty source
                raise _bad(path, f"hidden_multi has an empty or negative dimension: shape {tensor.shape}, "
                                 f"offset {tensor.offset}")
            if not isinstance(layers, list) or not all(isinstance(b, int) for b in layers):
                raise _bad(path, "'layers' must be a list of block ids")
            if len(set(layers)) != len(layers):
                raise _bad(path, f"'layers' lists a block twice: {layers}")
            if tensor.shape[0] != len(layers):
                raise _bad(path, f"hidden_multi has {tensor.shape[0]} layers but 'layers' lists {len(layers)}")
            if not tensor.contiguous:
                raise _bad(path, f"hidden_multi is saved non-contiguous (stride {tensor.stride})",
                           "convert it through torch.load: `idmctl cache convert EXP`")
            record = infos.get(f"{prefix}data/{tensor.storage.key}")
            if record is None:
                raise _bad(path, f"storage data/{tensor.storage.key} of hidden_multi is missing from the zip")
            if record.compress_type != zipfile.ZIP_STORED:
                raise _bad(path, f"storage data/{tensor.storage.key} is compressed (method {record.compress_type}); "
                                 "torch.save stores storages uncompressed")
            storage_bytes = tensor.storage.numel * tensor.storage.itemsize
            need = (tensor.offset + _numel(tensor.shape)) * tensor.storage.itemsize
            if record.file_size != storage_bytes or need > storage_bytes:
                raise _bad(path, f"storage data/{tensor.storage.key} holds {record.file_size:,} B, "
                                 f"hidden_multi needs {need:,} B")
            start = _record_offset(path, fd, record)
            if start + record.file_size > size:
                raise _bad(path, f"truncated: storage ends at byte {start + record.file_size:,}, file has {size:,} B")
    except zipfile.BadZipFile as exc:
        raise _bad(path, f"corrupt zip ({exc})") from exc
    finally:
        os.close(fd)
    meta = {key: value for key, value in payload.items()
            if key not in ("hidden_multi", "layers") and isinstance(value, (int, float, str, list))}
    whole = tensor.offset == 0 and _numel(tensor.shape) == tensor.storage.numel
    return LegacyLayout(path, size, [int(b) for b in layers], tensor.shape,  # type: ignore[arg-type]
                        tensor.storage.dtype, tensor.storage.itemsize,
                        start + tensor.offset * tensor.storage.itemsize, meta,
                        record.CRC if whole else None)


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total

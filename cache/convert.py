"""Convert cache files to our per-layer safetensors, optionally keeping only some blocks.

Two users: ``idmctl cache convert EXP [--layers routed|all]`` (card A's legacy ``.pt`` cache → ours,
once) and the job script's stage-in when ``stage.layers: routed`` (NAS → node-local disk, only the
blocks the run reads: for latent_c_n4 4 of 12 layers, 2.38 TB instead of 7.15 TB).

Every output is:
- exact: each layer is one ``pread`` of its contiguous bytes in the source (either format), never a
  ``torch.load``;
- verified against its source bytes: the CRC-32 of each layer as read is compared with the CRC-32
  of the same layer read back from the written file (evicted from the page cache first, so the
  bytes come from the disk); when every layer of a legacy file is converted, the chained CRC also
  matches the zip's own CRC of the storage record, i.e. what ``torch.save`` wrote;
- kill-safe: temp file + fsync + verify + rename (``cache.hidden.write_layers``);
- resumable: an output whose header names the same source (path, size, mtime) and blocks is kept.

``python -m cache.convert SRC_DIR DEST_DIR --blocks 5,14,23,32 --suffix .pt`` is the stage-in entry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ground.errors import UserError

SUFFIXES = {"legacy_pt": ".pt", "safetensors": ".safetensors"}


def _source_id(src: Path) -> dict[str, Any]:
    stat = src.stat()
    return {"path": str(src.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def is_converted(dest: Path, src: Path, blocks: list[int]) -> bool:
    """True when ``dest`` is a complete output of ``src`` (same path, size, mtime) with these blocks."""
    from cache.hidden import inspect_file

    if not dest.exists():
        return False
    try:
        info = inspect_file(dest)
    except UserError:
        return False  # a torn or foreign file: convert again
    return info.layers == blocks and info.meta.get("converted_from") == _source_id(src)


def convert_file(src: str | Path, dest: str | Path, blocks: list[int] | None = None) -> dict[str, Any]:
    """Write ``dest`` from ``src`` with ``blocks`` (default all), verified; skip when already done."""
    from cache.hidden import inspect_file, pread_into, write_layers

    src, dest = Path(src), Path(dest)
    info = inspect_file(src)
    blocks = list(info.layers) if blocks is None else list(blocks)
    missing = [block for block in blocks if block not in info.layers]
    if missing:
        raise UserError(f"blocks {missing} are not in the file's cached blocks {info.layers}", file=str(src),
                        field="data.selected_layer_indices", hint="select cached blocks only")
    if is_converted(dest, src, blocks):
        return {"file": dest.name, "converted": False, "bytes_read": 0, "bytes_written": 0}
    layer_bytes = info.geometry.layer_bytes
    crcs: dict[int, int] = {}
    fd = os.open(src, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # exact ranges, no readahead into skipped layers

        def layers() -> Iterator[bytearray]:
            buffer = bytearray(layer_bytes)
            for block in blocks:
                os.posix_fadvise(fd, info.offsets[block], layer_bytes, os.POSIX_FADV_WILLNEED)
                pread_into(fd, memoryview(buffer), info.offsets[block], src, f"layer_{block}",
                           "copy it again from the source")
                crcs[block] = zlib.crc32(buffer)
                yield buffer

        def verify(written: Path) -> None:
            check_against(written, crcs, blocks, info.meta.get("storage_crc32") if blocks == info.layers else None)

        meta = {key: value for key, value in info.meta.items()
                if key not in ("format", "layers", "frames", "token_grid", "channels", "dtype", "storage_crc32",
                               "converted_from", "layer_crc32")}
        meta.update(converted_from=_source_id(src), source_format=info.format)
        write_layers(dest, blocks, (info.frames, info.height, info.width, info.channels), info.dtype, layers(), meta,
                     verify=verify)
    finally:
        os.close(fd)
    return {"file": dest.name, "converted": True, "bytes_read": layer_bytes * len(blocks),
            "bytes_written": dest.stat().st_size}


def check_against(written: Path, crcs: dict[int, int], blocks: list[int], storage_crc32: int | None) -> None:
    """Read ``written`` back from the disk and compare each layer's CRC-32 with the source's."""
    from cache.hidden import inspect_file, pread_into

    info = inspect_file(written)
    layer_bytes = info.geometry.layer_bytes
    fd = os.open(written, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # fsynced already: read back from the disk
        buffer = bytearray(layer_bytes)
        for block in blocks:
            pread_into(fd, memoryview(buffer), info.offsets[block], written, f"layer_{block}", "check the disk; rerun")
            if zlib.crc32(buffer) != crcs[block]:
                raise UserError(f"layer_{block} read back with CRC-32 {zlib.crc32(buffer):08x}, the source's is "
                                f"{crcs[block]:08x}", file=str(written), field="cache", hint="check the disk; rerun")
    finally:
        os.close(fd)
    if storage_crc32 is not None:
        chained = 0
        for block in blocks:
            chained = _crc_combine(chained, crcs[block], layer_bytes)
        if chained != storage_crc32:
            raise UserError(f"source bytes have CRC-32 {chained:08x}, the zip records {storage_crc32:08x}: "
                            "the legacy file changed or was read wrongly", file=str(written), field="cache",
                            hint="copy the source again and rerun")


def _crc_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A+B from crc(A), crc(B) and len(B) (zlib's crc32_combine, GF(2) matrix method)."""
    def gf2_times(mat: list[int], vec: int) -> int:
        total, i = 0, 0
        while vec:
            if vec & 1:
                total ^= mat[i]
            vec >>= 1
            i += 1
        return total

    def gf2_square(mat: list[int]) -> list[int]:
        return [gf2_times(mat, mat[n]) for n in range(32)]

    if len2 == 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]
    even = gf2_square(odd)
    odd = gf2_square(even)
    while True:
        even = gf2_square(odd)
        if len2 & 1:
            crc1 = gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = gf2_square(even)
        if len2 & 1:
            crc1 = gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def convert_dir(src_root: str | Path, dest_root: str | Path, suffix: str, blocks: list[int] | None = None,
                progress: bool = False) -> dict[str, Any]:
    """Convert every ``*<suffix>`` of ``src_root`` into ``dest_root/<stem>.safetensors``; resumable."""
    src_root, dest_root = Path(src_root), Path(dest_root)
    sources = sorted(src_root.glob(f"*{suffix}"))
    if not sources:
        raise UserError(f"no *{suffix} files to convert", file=str(src_root), field="data.cache_root",
                        hint="check data.cache_root and data.cache_format")
    if dest_root.exists() and not dest_root.is_dir():
        from ground.paths import why_not_a_directory

        raise UserError(f"the output {why_not_a_directory(dest_root)}", file=str(dest_root), field="--out",
                        hint="name a directory (it is created if missing)")
    if src_root.resolve() == dest_root.resolve():
        raise UserError("the output directory is the source directory", file=str(dest_root), field="--out",
                        hint="write the converted cache elsewhere")
    start = time.monotonic()
    totals = {"files": len(sources), "converted": 0, "skipped": 0, "bytes_read": 0, "bytes_written": 0}
    for number, src in enumerate(sources, 1):
        done = convert_file(src, dest_root / f"{src.stem}.safetensors", blocks)
        totals["converted" if done["converted"] else "skipped"] += 1
        totals["bytes_read"] += done["bytes_read"]
        totals["bytes_written"] += done["bytes_written"]
        if progress:
            print(f"idmctl: convert {number}/{len(sources)} {src.name} "
                  f"{'converted' if done['converted'] else 'already done'}", file=sys.stderr, flush=True)
    totals["seconds"] = time.monotonic() - start
    return totals


def main(argv: list[str] | None = None) -> int:
    """Stage-in entry of the job script: copy only the routed blocks to node-local disk."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dest")
    parser.add_argument("--blocks", help="comma-separated Cosmos block ids; default all")
    parser.add_argument("--suffix", default=".pt")
    args = parser.parse_args(argv)
    blocks = [int(b) for b in args.blocks.split(",")] if args.blocks else None
    try:
        totals = convert_dir(args.src, args.dest, args.suffix, blocks, progress=True)
    except UserError as exc:
        print(exc.line(), file=sys.stderr)
        return 2
    print(json.dumps(totals), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

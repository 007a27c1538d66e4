"""The hidden-state cache: real safetensors and legacy .pt files, exact slices, measured disk reads."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from cache.hidden import (
    cache_file,
    check_matches,
    inspect_file,
    read_hidden,
    write_hidden,
    write_legacy,
)
from cache.convert import convert_file
from fork_support import run_forked, sigkill_at_fsync
from hidden_quick_spec import use_hidden_quick
from ground.errors import UserError

BLOCKS = [2, 5, 8, 11, 14, 17]


def _hidden(layers: int = 6, frames: int = 8, h: int = 3, w: int = 4, c: int = 16,
            dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(layers, frames, h, w, c, generator=generator).to(dtype)


def _read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/self/io")


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_round_trip_and_safetensors_compatibility(tmp_path: Path) -> None:
    hidden = _hidden()
    path = cache_file(tmp_path, "demo_3", "safetensors")
    assert path == tmp_path / "demo_3.safetensors"
    write_hidden(path, hidden, BLOCKS, {"encoder": "cosmos-tiny", "encoder_version": "r0", "demo": "demo_3",
                                        "frame_stride": 5})
    info = inspect_file(path)
    assert (info.layers, info.frames, info.height, info.width, info.channels, info.dtype) == (BLOCKS, 8, 3, 4, 16,
                                                                                            "bfloat16")
    assert info.frame_stride == 5 and info.meta["encoder"] == "cosmos-tiny"
    assert info.data_start % 4096 == 0
    assert info.file_bytes == info.data_start + info.geometry.file_bytes
    torch.testing.assert_close(read_hidden(path, [1, 4], 2, 3), hidden[[1, 4], 2:5], rtol=0, atol=0)
    torch.testing.assert_close(read_hidden(path, [5, 0], 0, 8, mmap=False), hidden[[5, 0]], rtol=0, atol=0)
    # The official library reads our files: same tensors, same metadata.
    with safe_open(str(path), framework="pt") as handle:
        assert json.loads(handle.metadata()["layers"]) == BLOCKS
        for index, block in enumerate(BLOCKS):
            torch.testing.assert_close(handle.get_tensor(f"layer_{block}"), hidden[index], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes(tmp_path: Path, dtype: torch.dtype) -> None:
    hidden = _hidden(dtype=dtype)
    write_hidden(tmp_path / "d.safetensors", hidden, BLOCKS, {})
    assert read_hidden(tmp_path / "d.safetensors", [3], 1, 2).dtype == dtype
    torch.testing.assert_close(read_hidden(tmp_path / "d.safetensors", [3], 1, 2), hidden[[3], 1:3])


def test_legacy_read_and_convert(tmp_path: Path) -> None:
    hidden = _hidden(seed=1)
    legacy = cache_file(tmp_path, "demo_0", "legacy_pt")
    write_legacy(legacy, hidden, BLOCKS, frame_stride=2)
    info = inspect_file(legacy)
    assert (info.format, info.layers, info.frames, info.dtype) == ("legacy_pt", BLOCKS, 8, "bfloat16")
    torch.testing.assert_close(read_hidden(legacy, [1, 4], 3, 5), hidden[[1, 4], 3:8], rtol=0, atol=0)
    torch.testing.assert_close(read_hidden(legacy, [1, 4], 3, 5, mmap=False), hidden[[1, 4], 3:8], rtol=0, atol=0)
    convert_file(legacy, tmp_path / "out" / "demo_0.safetensors")
    converted = inspect_file(tmp_path / "out" / "demo_0.safetensors")
    assert converted.layers == BLOCKS and converted.frame_stride == 2
    torch.testing.assert_close(read_hidden(converted.path, list(range(6)), 0, 8), hidden, rtol=0, atol=0)


def test_truncated_and_corrupt_files_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "demo_0.safetensors"
    write_hidden(path, _hidden(), BLOCKS, {})
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])
    with pytest.raises(UserError) as exc:
        inspect_file(path)
    assert exc.value.line().startswith(f"error: {path}:cache: truncated: layer_17 ends at byte {len(whole):,}")
    path.write_bytes(struct.pack("<Q", 10**12) + whole[8:])
    with pytest.raises(UserError, match="corrupt safetensors header: length 1,000,000,000,000 B"):
        inspect_file(path)
    path.write_bytes(whole[:8] + b"\xff" * 64 + whole[72:])
    with pytest.raises(UserError, match="corrupt safetensors header"):
        inspect_file(path)
    legacy = tmp_path / "demo_1.pt"
    write_legacy(legacy, _hidden(), BLOCKS)
    legacy.write_bytes(legacy.read_bytes()[: legacy.stat().st_size // 2])
    with pytest.raises(UserError) as exc:
        inspect_file(legacy)
    assert exc.value.line().startswith(f"error: {legacy}:cache: truncated or corrupt zip: no central directory")
    with pytest.raises(UserError, match="cache file does not exist"):
        inspect_file(tmp_path / "demo_9.safetensors")


def test_wrong_shape_dtype_and_selection(tmp_path: Path) -> None:
    path = tmp_path / "demo_0.safetensors"
    write_hidden(path, _hidden(), BLOCKS, {})
    info = inspect_file(path)
    with pytest.raises(UserError) as exc:
        check_matches(info, layers=BLOCKS, frames=8, token_grid=(27, 48), channels=16, dtype="bfloat16")
    # The line says what the difference does to the bytes: ranges cut from the spec's geometry.
    assert exc.value.line() == (f"error: {path}:data.token_grid: file has token_grid (3, 4) but the spec says "
                                f"(27, 48): a frame is 3 × 4 × 16 × 2 B = 384 B in the file, 27 × 48 × 16 × 2 B = "
                                f"41,472 B by the spec (fix the spec or rebuild the cache)")
    with pytest.raises(UserError) as exc:
        check_matches(info, dtype="float32")
    assert ("file has dtype bfloat16 but the spec says float32: a frame is 3 × 4 × 16 × 2 B = 384 B in the file, "
            "3 × 4 × 16 × 4 B = 768 B by the spec") in exc.value.line()
    with pytest.raises(UserError, match=r"file has frames 8 but the spec says 24: a layer is 8 × 384 B = 3,072 B "
                                        r"in the file, 24 × 384 B = 9,216 B by the spec"):
        check_matches(info, frames=24)
    with pytest.raises(UserError, match=r"layer index 6 is outside the 6 cached layers \[2, 5, 8, 11, 14, 17\]"):
        read_hidden(path, [1, 6], 0, 2)
    with pytest.raises(UserError, match="frames 7..8 are outside the 8 cached"):
        read_hidden(path, [1], 7, 2)
    legacy = tmp_path / "demo_1.pt"
    write_legacy(legacy, _hidden()[0], BLOCKS)  # 4-D: a single layer saved by mistake
    with pytest.raises(UserError, match=r"hidden_multi must be a \(L, T, H, W, C\) tensor"):
        inspect_file(legacy)
    write_legacy(legacy, _hidden().double(), BLOCKS)
    with pytest.raises(UserError, match="stored as DoubleStorage, not bf16/fp16/fp32"):
        inspect_file(legacy)
    with pytest.raises(UserError, match="2 layers of hidden states but 6 block ids"):
        write_hidden(tmp_path / "x.safetensors", _hidden(layers=2), BLOCKS, {})
    assert not (tmp_path / "x.safetensors").exists()


def test_crash_before_rename_leaves_nothing_that_reads_as_cached(tmp_path: Path) -> None:
    target = tmp_path / "demo_0.safetensors"
    # A real SIGKILL at the worst moment: every byte written, the rename not yet done.
    def killed_in_fsync() -> None:
        sigkill_at_fsync(1)
        write_hidden(target, torch.zeros(6, 8, 3, 4, 16), BLOCKS, {})

    assert run_forked(killed_in_fsync, "the writer killed in its fsync") == -9
    assert not target.exists()
    leftovers = list(tmp_path.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".demo_0.safetensors.tmp")
    with pytest.raises(UserError, match="cache file does not exist"):
        inspect_file(cache_file(tmp_path, "demo_0", "safetensors"))


def test_cold_reads_touch_only_the_slice(tmp_path: Path) -> None:
    """Measured from /proc/self/io on a cold page cache (this is a real ext4 disk, not tmpfs)."""
    torch.set_num_threads(1)
    hidden = _hidden(layers=12, frames=24, h=16, w=16, c=1024)  # 151 MB per file, 512 KiB per frame-layer
    ours, legacy = tmp_path / "demo_0.safetensors", tmp_path / "demo_0.pt"
    write_hidden(ours, hidden, list(range(12)), {})
    write_legacy(legacy, hidden, list(range(12)))
    selection, start, window = [1, 4, 7, 10], 3, 5
    slice_bytes = len(selection) * window * 16 * 16 * 1024 * 2

    _evict(ours)
    before = _read_bytes()
    got = read_hidden(ours, selection, start, window)
    ours_read = _read_bytes() - before
    assert torch.equal(got, hidden[selection, start:start + window])
    assert slice_bytes <= ours_read <= 1.1 * slice_bytes, (ours_read, slice_bytes)

    _evict(legacy)
    before = _read_bytes()
    got = read_hidden(legacy, selection, start, window)
    legacy_read = _read_bytes() - before
    assert torch.equal(got, hidden[selection, start:start + window])
    # Exact ranges in the zip's storage record too (cache.legacy_pt): no torch.load, no readahead.
    assert slice_bytes <= legacy_read <= 1.1 * slice_bytes, (legacy_read, slice_bytes)


def test_cli_inspect_card_geometry(cli) -> None:
    """The card's numbers, from the spec alone (the 6.6 TB cache is not on this machine)."""
    result = cli("cache", "inspect", "latent_c_n4")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "selection       indices [1, 4, 7, 10] → blocks [5, 14, 23, 32] (N=4), window 5 frames" in lines
    assert "per sample      4 layers × 5 frames × 27 × 48 × 5120 × 2 B = 265,420,800 B (265.4 MB)" in lines
    assert any(line.startswith("all layers      12 layers × 5 frames × 27 × 48 × 5120 × 2 B = 796,262,400 B")
               and line.endswith("→ 3.0× less with the selection") for line in lines)
    assert any("whole file: 12 layers × 24 frames × 27 × 48 × 5120 × 2 B = 3,822,059,520 B (3.6 GiB" in line
               and line.endswith("→ 14.4× less with mmap + selection") for line in lines)
    assert lines[-1] == ("on this machine: not present (/nas/cache/cosmos_hidden_multi does not exist); "
                         "figures come from the spec")
    dense = cli("cache", "inspect", "latent_c_n12_dense", "--json")
    report = json.loads(dense.output)
    assert (report["sample_bytes"], report["whole_file_bytes"], report["present"]) == (796_262_400, 3_822_059_520, False)
    assert report["selected_blocks"] == [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35]


def test_cli_inspect_rejects_a_cache_that_disagrees_with_the_spec(cli, tmp_path: Path, idmctl_home: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    use_hidden_quick(monkeypatch, tmp_path)
    root = idmctl_home / "quickstart" / "hidden_cache"
    write_hidden(root / "demo_0.safetensors", _hidden(layers=4, frames=8, h=4, w=4, c=32, dtype=torch.float32),
                 [0, 1, 2, 5], {})
    result = cli("cache", "inspect", "quickstart")
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: {root / 'demo_0.safetensors'}:data.cached_layers: file has layers "
                                     f"[0, 1, 2, 5] but the spec says [0, 1, 2, 3] (fix the spec or rebuild the cache)")


def test_a_file_cut_short_under_a_read_is_one_line_and_no_piece_reads_a_reused_fd(tmp_path: Path) -> None:
    """The exact read is cut into pieces read by several threads (cache.hidden.READ_THREADS). A file
    truncated after it was inspected (a copy still in progress) ends some pieces early: the read raises
    the one-line error, and only after every piece has stopped is the fd closed (then reused by the
    next open, which must read its own bytes)."""
    from cache.hidden import READ_PIECE_BYTES

    hidden = _hidden(layers=3, frames=6, h=16, w=32, c=1024)  # 1 MiB per frame-layer
    path, other = tmp_path / "demo_0.safetensors", tmp_path / "demo_1.safetensors"
    write_hidden(path, hidden, [0, 1, 2], {})
    write_hidden(other, -hidden, [0, 1, 2], {})
    info = inspect_file(path)
    window = 6
    assert window * info.geometry.frame_bytes > 2 * READ_PIECE_BYTES  # several pieces per layer
    with open(path, "r+b") as handle:
        handle.truncate(info.offsets[2] + info.geometry.frame_bytes)  # layer 2 keeps one frame
    with pytest.raises(UserError) as exc:
        read_hidden(path, [0, 2], 0, window, info=info)
    line = exc.value.line()
    start = info.offsets[2]
    end = start + window * info.geometry.frame_bytes
    # The line names the file, the layer and frames, and the exact byte range being read.
    assert line.startswith(f"error: {path}:cache: truncated while reading layer index 2 frames 0..5 "
                           f"(bytes {start:,}..{end:,}) at byte "), line
    assert "\n" not in line
    torch.testing.assert_close(read_hidden(other, [0, 2], 0, window), -hidden[[0, 2]], rtol=0, atol=0)

"""Exact reads of legacy torch.save cache files: real files from torch.save in each zip layout met in
practice, located without torch.load, and files that are not what they claim rejected in one line."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from cache.hidden import inspect_file, read_hidden
from cache.legacy_pt import read_layout
from ground.errors import UserError

BLOCKS = [2, 5, 8, 11]


def _hidden(seed: int = 0, layers: int = 4) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(layers, 6, 3, 5, 8, generator=generator).to(torch.bfloat16)


def _save(path: Path, payload: object, **kwargs: object) -> Path:
    torch.save(payload, path, **kwargs)
    return path


def _assert_exact(path: Path, hidden: torch.Tensor) -> None:
    assert inspect_file(path).layers == BLOCKS
    for selection, start, window in (([0, 3], 1, 4), ([2], 0, 6), ([3, 1, 0], 5, 1)):
        got = read_hidden(path, selection, start, window)
        assert torch.equal(got, hidden[selection, start:start + window])


def test_default_torch_save(tmp_path: Path) -> None:
    hidden = _hidden()
    path = _save(tmp_path / "demo_0.pt", {"hidden_multi": hidden, "layers": BLOCKS, "frame_stride": 3,
                                          "note": "card A"})
    layout = read_layout(path)
    assert layout.shape == (4, 6, 3, 5, 8) and layout.dtype == "bfloat16"
    assert layout.meta == {"frame_stride": 3, "note": "card A"}
    # The offset we computed from the zip headers holds exactly the tensor's bytes.
    with open(path, "rb") as handle:
        handle.seek(layout.data_offset)
        assert handle.read(hidden.numel() * 2) == hidden.view(torch.uint8).numpy().tobytes()
    _assert_exact(path, hidden)
    assert inspect_file(path).frame_stride == 3


@pytest.mark.parametrize("alignment", [64, 4096])
def test_storage_alignment_and_no_byteorder_record(tmp_path: Path, alignment: int) -> None:
    from torch.utils.serialization import config

    hidden = _hidden(seed=1)
    before = config.save.storage_alignment
    config.save.storage_alignment = alignment
    try:
        path = _save(tmp_path / "demo_1.pt", {"hidden_multi": hidden, "layers": BLOCKS},
                     _disable_byteorder_record=True)
    finally:
        config.save.storage_alignment = before
    assert read_layout(path).data_offset % alignment == 0
    _assert_exact(path, hidden)


def test_older_torch_zip_layout_stem_prefix_no_records_unaligned(tmp_path: Path) -> None:
    """torch 1.6–1.x named the archive after the file stem and wrote no .format_version /
    .storage_alignment; Python's zipfile writes no padding, so the storage starts unaligned."""
    hidden = _hidden(seed=2)
    modern = _save(tmp_path / "modern.pt", {"hidden_multi": hidden, "layers": BLOCKS})
    old = tmp_path / "demo_2.pt"
    with zipfile.ZipFile(modern) as src, zipfile.ZipFile(old, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            _, rest = info.filename.split("/", 1)
            if rest in (".format_version", ".storage_alignment", "byteorder"):
                continue
            dst.writestr(f"demo_2/{rest}", src.read(info))
    assert torch.equal(torch.load(old, weights_only=True)["hidden_multi"], hidden)  # torch accepts it too
    assert read_layout(old).data_offset % 64 != 0
    _assert_exact(old, hidden)


def test_tensor_with_a_storage_offset(tmp_path: Path) -> None:
    """A view saved as-is keeps its whole storage: element 0 is not byte 0 of the record."""
    full = _hidden(seed=3, layers=6)
    hidden = full[2:]
    path = _save(tmp_path / "demo_3.pt", {"hidden_multi": hidden, "layers": BLOCKS})
    whole = _save(tmp_path / "whole.pt", {"hidden_multi": full, "layers": BLOCKS + [14, 17]})
    assert read_layout(path).data_offset - read_layout(whole).data_offset == 2 * full[0].numel() * 2
    _assert_exact(path, hidden)


def test_not_what_it_claims(tmp_path: Path) -> None:
    path = tmp_path / "demo_4.pt"
    _save(path, {"hidden_multi": _hidden(), "layers": BLOCKS}, _use_new_zipfile_serialization=False)
    with pytest.raises(UserError) as exc:
        inspect_file(path)
    assert exc.value.line() == (
        f"error: {path}:cache: legacy non-zip torch.save format (_use_new_zipfile_serialization=False): its "
        "tensors cannot be located without unpickling (re-save it with torch ≥ 1.6 "
        "(torch.save(torch.load(p, weights_only=True), p)))")
    path.write_bytes(b"\x00" * 100)
    with pytest.raises(UserError, match="not a torch.save zip archive"):
        inspect_file(path)
    _save(path, {"hidden": _hidden(), "layers": BLOCKS})
    with pytest.raises(UserError, match="not a dict with 'hidden_multi' and 'layers'"):
        inspect_file(path)
    _save(path, {"hidden_multi": _hidden().transpose(3, 4), "layers": BLOCKS})
    with pytest.raises(UserError, match="saved non-contiguous"):
        inspect_file(path)
    _save(path, {"hidden_multi": _hidden(), "layers": [2, 5, 5, 11]})
    with pytest.raises(UserError, match=r"'layers' lists a block twice: \[2, 5, 5, 11\]"):
        inspect_file(path)
    _save(path, {"hidden_multi": _hidden(), "layers": BLOCKS[:3]})
    with pytest.raises(UserError, match="hidden_multi has 4 layers but 'layers' lists 3"):
        inspect_file(path)
    compressed = tmp_path / "demo_5.pt"
    with zipfile.ZipFile(_save(tmp_path / "m.pt", {"hidden_multi": _hidden(), "layers": BLOCKS})) as src, \
            zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    with pytest.raises(UserError, match=r"storage data/0 is compressed \(method 8\)"):
        inspect_file(compressed)


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.system, ("touch PWNED",)


def test_a_hostile_pickle_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "demo_6.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"hidden_multi": _Payload(), "layers": BLOCKS}, protocol=2))
    with pytest.raises(UserError) as exc:
        inspect_file(path)
    assert "refused global posix.system" in exc.value.line()
    assert not (tmp_path / "PWNED").exists()


def test_truncated_storage(tmp_path: Path) -> None:
    path = _save(tmp_path / "demo_7.pt", {"hidden_multi": _hidden(), "layers": BLOCKS})
    layout = read_layout(path)
    raw = bytearray(path.read_bytes())
    # Cut the storage record short but keep a valid-looking directory: the sizes no longer agree.
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info.filename, data[:-16] if info.filename.endswith("data/0") else data)
    with pytest.raises(UserError, match=f"storage data/0 holds {layout.layer_bytes * 4 - 16:,} B"):
        inspect_file(path)


class _Storage:
    """Stands for the storage torch.save pickles by persistent id."""


def _with_shape(path: Path, shape: tuple[int, ...]) -> Path:
    """A real torch.save file whose data.pkl is rewritten to claim ``shape`` for hidden_multi: the bytes
    stay, only the header lies (as a damaged or hand-made file does)."""
    import collections

    _save(path, {"hidden_multi": _hidden(), "layers": BLOCKS})

    class _Tensor:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            stride = tuple(int(torch.tensor(shape[i + 1:]).prod()) if i + 1 < len(shape) else 1 for i in range(len(shape)))
            return torch._utils._rebuild_tensor_v2, (_Storage(), 0, shape, stride, False, collections.OrderedDict())

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj):  # type: ignore[no-untyped-def]
            return ("storage", torch.BFloat16Storage, "0", "cpu", 4 * 6 * 3 * 5 * 8) if isinstance(obj, _Storage) else None

    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump({"hidden_multi": _Tensor(), "layers": BLOCKS})
    with zipfile.ZipFile(path) as src:
        entries = [(info, src.read(info)) for info in src.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for info, data in entries:
            dst.writestr(info, buffer.getvalue() if info.filename.endswith("data.pkl") else data)
    return path


@pytest.mark.parametrize("shape", [(4, -6, 3, 5, 8), (4, 0, 3, 5, 8), (4, 6, 3, 0, 8)])
def test_a_negative_or_empty_dimension_is_refused(tmp_path: Path, shape: tuple[int, ...]) -> None:
    path = _with_shape(tmp_path / "demo_8.pt", shape)
    with pytest.raises(UserError) as exc:
        inspect_file(path)
    assert "hidden_multi has an empty or negative dimension" in exc.value.line() and str(path) in exc.value.line()


def test_the_rewritten_header_is_read_when_it_is_sound(tmp_path: Path) -> None:
    """The helper above makes files the reader accepts when the shape is true: the refusals are the shape's."""
    path = _with_shape(tmp_path / "demo_9.pt", (4, 6, 3, 5, 8))
    assert read_layout(path).shape == (4, 6, 3, 5, 8)

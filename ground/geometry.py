"""Cache geometry and I/O accounting, in pure Python: what one sample reads, to the byte.

Preflight (control plane) and the dataset (data plane) both use these numbers, so the budget the
gate checks is the budget the loader spends.
"""

from __future__ import annotations

from dataclasses import dataclass

from ground.spec.schema import DataSpec
from ground.units import format_bytes


@dataclass(frozen=True)
class HiddenGeometry:
    """Shape of one multi-layer hidden-state cache file: (L, T, H, W, C) of ``dtype_bytes`` each."""

    layers: int
    frames: int
    height: int
    width: int
    channels: int
    dtype_bytes: int

    @classmethod
    def from_spec(cls, data: DataSpec) -> "HiddenGeometry":
        return cls(len(data.cached_layers), data.frames, data.token_grid[0], data.token_grid[1],
                   data.channels, data.dtype_bytes)

    @property
    def frame_bytes(self) -> int:
        """One layer, one frame: H × W × C × dtype bytes."""
        return self.height * self.width * self.channels * self.dtype_bytes

    @property
    def layer_bytes(self) -> int:
        return self.frames * self.frame_bytes

    @property
    def file_bytes(self) -> int:
        """Tensor payload of a whole file (headers excluded)."""
        return self.layers * self.layer_bytes


@dataclass(frozen=True)
class SampleIO:
    """Bytes one sample reads, with the multiplication behind it."""

    bytes: int
    formula: str
    whole_file_bytes: int
    all_layers_bytes: int

    @property
    def reduction_vs_whole_file(self) -> float:
        return self.whole_file_bytes / self.bytes

    @property
    def reduction_vs_all_layers(self) -> float:
        return self.all_layers_bytes / self.bytes


def sample_io(data: DataSpec, mmap: bool) -> SampleIO:
    """Bytes read per sample for the spec's selection and frame window.

    With ``mmap`` (or byte-range reads) only the N selected layers × the frame window are read;
    without it the whole file is (the card's "3.6 GB/sample" for N=12 without mmap).
    """
    geometry = HiddenGeometry.from_spec(data)
    n, window = data.routing_n, data.frame_window
    h, w, c, b = geometry.height, geometry.width, geometry.channels, geometry.dtype_bytes
    sliced = n * window * geometry.frame_bytes
    all_layers = geometry.layers * window * geometry.frame_bytes
    whole = geometry.file_bytes
    if mmap:
        formula = f"{n} layers × {window} frames × {h} × {w} × {c} × {b} B = {sliced:,} B ({format_bytes(sliced)})"
        return SampleIO(sliced, formula, whole, all_layers)
    formula = (f"whole file: {geometry.layers} layers × {geometry.frames} frames × {h} × {w} × {c} × {b} B "
               f"= {whole:,} B ({format_bytes(whole, binary=True)}; no mmap reads it all)")
    return SampleIO(whole, formula, whole, all_layers)

"""Point maps (PT) from metric depth and camera matrices, and their normalisation statistics.

A pixel (u, v) with depth d lies at ``X_cam = d · K⁻¹ [u + ½, v + ½, 1]ᵀ`` and in the world at
``X = R X_cam + t`` with ``[R | t]`` the camera→world extrinsics. Depth that is 0, negative, NaN,
inf or at/after the far plane (``pt_max_depth``) is *invalid*: its points are excluded from the
statistics and written as 0 after normalisation. Card B's open bug was exactly this: invalid
pixels of view 2 entered norm.json, the std blew up, and predicted points landed hundreds of
metres away. Statistics are streamed in float64 (sum, sum of squares, count) so any number of
frames fits in memory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cache.episodes import EpisodeFile
from cache.latent import pt_hash
from ground.errors import UserError
from ground.paths import atomic_write_text


def invalid_depth(depth: np.ndarray, max_depth: float) -> np.ndarray:
    """True where depth cannot place a point: non-finite, ≤ 0, or ≥ the far plane."""
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(depth) | (depth <= 0) | (depth >= max_depth)


def depth_to_points(depth: np.ndarray, intrinsics: np.ndarray, cam_to_world: np.ndarray,
                    max_depth: float) -> tuple[np.ndarray, np.ndarray]:
    """(H, W) depth in metres → (H, W, 3) world points (float64) and the (H, W) validity mask."""
    depth = np.asarray(depth, dtype=np.float64)
    if depth.ndim == 3 and depth.shape[-1] == 1:
        depth = depth[..., 0]
    height, width = depth.shape
    valid = ~invalid_depth(depth, max_depth)
    safe_depth = np.where(valid, depth, 0.0)
    v, u = np.meshgrid(np.arange(height, dtype=np.float64) + 0.5, np.arange(width, dtype=np.float64) + 0.5,
                       indexing="ij")
    pixels = np.stack([u, v, np.ones_like(u)], axis=-1)
    rays = pixels @ np.linalg.inv(np.asarray(intrinsics, dtype=np.float64)).T
    cam_points = rays * safe_depth[..., None]
    extrinsics = np.asarray(cam_to_world, dtype=np.float64)
    world = cam_points @ extrinsics[:3, :3].T + extrinsics[:3, 3]
    return np.where(valid[..., None], world, 0.0), valid


@dataclass
class NormStats:
    """Per-axis mean/std (metres) of valid points, and how many pixels were used and excluded."""

    mean: list[float]
    std: list[float]
    valid_pixels: int
    invalid_pixels: int

    def to_json(self, extractor_version: str) -> str:
        return json.dumps({"mean": self.mean, "std": self.std, "valid_pixels": self.valid_pixels,
                           "invalid_pixels": self.invalid_pixels, "extractor_version": extractor_version},
                          indent=2, sort_keys=True) + "\n"


@dataclass
class NormAccumulator:
    """Streams point maps in; excludes invalid pixels; float64 sums so the mean stays exact."""

    total: np.ndarray = field(default_factory=lambda: np.zeros(3))
    total_sq: np.ndarray = field(default_factory=lambda: np.zeros(3))
    valid: int = 0
    invalid: int = 0

    def add(self, points: np.ndarray, valid: np.ndarray) -> None:
        chosen = points[valid]
        self.total += chosen.sum(axis=0)
        self.total_sq += np.square(chosen).sum(axis=0)
        self.valid += int(valid.sum())
        self.invalid += int(valid.size - valid.sum())

    def stats(self, where: str) -> NormStats:
        if self.valid == 0:
            raise UserError("no valid depth pixel in any frame", file=where, field="latent.pt_max_depth",
                            hint="check the depth unit (metres) and the far plane")
        mean = self.total / self.valid
        variance = np.maximum(self.total_sq / self.valid - np.square(mean), 0.0)
        # A flat axis (all points on one plane) keeps a tiny floor instead of dividing by zero.
        std = np.maximum(np.sqrt(variance), 1e-6)
        return NormStats([float(x) for x in mean], [float(x) for x in std], self.valid, self.invalid)


def write_norm_file(path: Path, stats: NormStats, extractor_version: str) -> None:
    """Atomic write; the new mtime renames the PT directory through the hash."""
    atomic_write_text(path, stats.to_json(extractor_version))
    pt_hash.forget(path)


def read_norm_file(path: Path) -> NormStats:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        stats = NormStats([float(x) for x in data["mean"]], [float(x) for x in data["std"]],
                          int(data["valid_pixels"]), int(data["invalid_pixels"]))
    except FileNotFoundError as exc:
        raise UserError("PT normalisation file does not exist", file=str(path), field="latent.pt_norm_path",
                        hint="build the PT slot (`idmctl cache build EXP --mode pt`), which computes it") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"not a PT normalisation file ({exc})", file=str(path), field="latent.pt_norm_path",
                        hint="delete it and rebuild the PT slot") from exc
    values = stats.mean + stats.std
    if len(stats.mean) != 3 or len(stats.std) != 3 or not all(math.isfinite(x) for x in values) or min(stats.std) <= 0:
        raise UserError(f"mean/std must be 3 finite values with std > 0, got {stats.mean} / {stats.std}",
                        file=str(path), field="latent.pt_norm_path", hint="delete it and rebuild the PT slot")
    return stats


def normalise(points: np.ndarray, valid: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    """(H, W, 3) points → standardised float32; invalid pixels become 0 (the mean), never outliers."""
    scaled = (points - np.asarray(mean)) / np.asarray(std)
    return np.where(valid[..., None], scaled, 0.0).astype(np.float32)


def frame_points(episodes: EpisodeFile, demo: str, camera: str, timestep: int,
                 max_depth: float) -> tuple[np.ndarray, np.ndarray]:
    """World points and validity of one recorded frame (depth + that timestep's camera matrices)."""
    return window_points(episodes, demo, camera, range(timestep, timestep + 1), max_depth)[0]


def window_points(episodes: EpisodeFile, demo: str, camera: str, steps: range,
                  max_depth: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`frame_points` of every timestep in ``steps`` (start, stop, stride), each of the three arrays
    read in one HDF5 slice. Three reads per frame were most of a PT build's extra time over RGB's."""
    if len(steps) == 0:
        return []
    first, last = steps[0], steps[-1]
    depth, intrinsics, extrinsics = (episodes.obs(demo, f"{camera}_{name}", first, last + 1)[:: steps.step]
                                     for name in ("depth", "intrinsics", "extrinsics"))
    if not len(depth) == len(intrinsics) == len(extrinsics) == len(steps):
        raise UserError(f"{camera} frames {first}..{last} requested, the demo records "
                        f"{episodes.num_samples(demo)} steps", file=str(episodes.path), field=f"data/{demo}/obs",
                        hint="rebuild the episodes or shorten latent.frames / frame_stride")
    return [depth_to_points(d, k, e, max_depth) for d, k, e in zip(depth, intrinsics, extrinsics)]


NORM_CHUNK_FRAMES = 64
"""Frames per camera unprojected at once by the statistics pass: one read per array per chunk, and a
bounded working set (64 × 256 × 256 × 3 float64 = 100 MB per camera at RoboCasa's resolution)."""


def compute_norm_stats(episodes: EpisodeFile, demos: list[str], cameras: list[str], frame_stride: int,
                       max_depth: float) -> NormStats:
    """Statistics over every ``frame_stride``-th frame of every demo and camera, valid pixels only."""
    accumulator = NormAccumulator()
    for demo in demos:
        steps = range(0, episodes.num_samples(demo), frame_stride)
        for chunk_start in range(0, len(steps), NORM_CHUNK_FRAMES):
            chunk = steps[chunk_start:chunk_start + NORM_CHUNK_FRAMES]
            points = {camera: window_points(episodes, demo, camera, chunk, max_depth) for camera in cameras}
            for index in range(len(chunk)):
                for camera in cameras:  # the order of the per-frame loop, so the float sums are the same
                    accumulator.add(*points[camera][index])
    return accumulator.stats(str(episodes.path))


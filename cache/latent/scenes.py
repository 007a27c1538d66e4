"""Small synthetic episodes with exact depth, for smoke runs, tests and benchmarks of the latent cache.

Each camera looks at a table (the plane z = 0) on which a box of height 5 cm slides; depth is the
exact ray/plane intersection, so point maps must land on the table or the box top. The last camera
reproduces card B's "view 2" problem: a block of pixels with depth 0, inf, NaN and 1e4 m (missing
returns and the far plane), which must not reach the normalisation statistics. Written with
``cache.episodes.write_episodes`` in the robomimic layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cache.episodes import Demo, write_episodes

BOX_HEIGHT_M = 0.05
BOX_HALF_M = 0.08


def look_at(eye: np.ndarray, target: np.ndarray) -> np.ndarray:
    """4×4 camera→world for an OpenCV camera (x right, y down, z forward) at ``eye`` facing ``target``."""
    forward = (target - eye) / np.linalg.norm(target - eye)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    pose = np.eye(4)
    pose[:3, :3] = np.stack([right, down, forward], axis=1)
    pose[:3, 3] = eye
    return pose


def render(pose: np.ndarray, intrinsics: np.ndarray, size: int, box_center: np.ndarray,
           hue: float) -> tuple[np.ndarray, np.ndarray]:
    """(depth (H, W) in metres, image (H, W, 3) uint8) of the table and box seen from ``pose``."""
    v, u = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
    rays = np.stack([u, v, np.ones_like(u)], axis=-1) @ np.linalg.inv(intrinsics).T
    directions = rays @ pose[:3, :3].T
    eye_z = pose[2, 3]
    with np.errstate(divide="ignore"):
        depth = np.where(directions[..., 2] < 0, -eye_z / directions[..., 2], np.inf)
        ground = pose[:3, 3] + directions * depth[..., None]
        on_box = np.all(np.abs(ground[..., :2] - box_center) < BOX_HALF_M, axis=-1)
        depth = np.where(on_box, (BOX_HEIGHT_M - eye_z) / directions[..., 2], depth)
    hit = pose[:3, 3] + directions * np.where(np.isfinite(depth), depth, 0.0)[..., None]
    checker = ((np.floor(hit[..., 0] * 10) + np.floor(hit[..., 1] * 10)) % 2).astype(np.float64)
    image = np.stack([0.3 + 0.4 * checker, 0.3 + 0.2 * checker, np.full_like(checker, hue)], axis=-1)
    image[on_box] = [0.9, 0.2, 0.1]
    return depth.astype(np.float32), (np.clip(image, 0, 1) * 255).astype(np.uint8)


def scene_demo(name: str, steps: int, size: int, cameras: list[str], rng: np.random.Generator,
               corrupt_last_view: bool) -> Demo:
    intrinsics = np.array([[size, 0.0, size / 2], [0.0, size, size / 2], [0.0, 0.0, 1.0]])
    start, velocity = rng.uniform(-0.2, 0.2, 2), rng.uniform(-0.03, 0.03, 2)
    centers = np.array([start + velocity * t for t in range(steps)])
    obs: dict[str, np.ndarray] = {"robot0_eef_pos": np.concatenate([centers, np.full((steps, 1), 0.1)], 1)}
    for index, camera in enumerate(cameras):
        angle = 2 * np.pi * index / len(cameras)
        pose = look_at(np.array([0.8 * np.sin(angle), -0.8 * np.cos(angle), 0.6]), np.zeros(3))
        depths, images = zip(*(render(pose, intrinsics, size, c, 0.2 + 0.3 * index) for c in centers))
        depth = np.stack(depths)
        if corrupt_last_view and index == len(cameras) - 1:
            quarter = size // 4
            depth[:, :quarter, :quarter] = 0.0
            depth[:, :quarter, quarter:2 * quarter] = np.inf
            depth[:, quarter:2 * quarter, :quarter] = np.nan
            depth[:, quarter:2 * quarter, quarter:2 * quarter] = 1e4
        obs[f"{camera}_image"] = np.stack(images)
        obs[f"{camera}_depth"] = depth
        obs[f"{camera}_intrinsics"] = np.repeat(intrinsics[None], steps, 0)
        obs[f"{camera}_extrinsics"] = np.repeat(pose[None], steps, 0)
    actions = np.concatenate([np.repeat(velocity[None], steps, 0), rng.normal(0, 0.1, (steps, 5))], 1)
    return Demo(name=name, actions=actions.astype(np.float32), states=np.zeros((steps, 4)), obs=obs)


def write_scene_episodes(path: Path, *, demos: int = 3, steps: int = 9, size: int = 32,
                         cameras: tuple[str, ...] = ("robot0_agentview_left", "robot0_agentview_right"),
                         corrupt_last_view: bool = True, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    written = [scene_demo(f"demo_{i}", steps, size, list(cameras), rng, corrupt_last_view) for i in range(demos)]
    names = [d.name for d in written]
    write_episodes(path, written, {"env_name": "SyntheticTableBox", "type": 1, "env_kwargs": {}},
                   {"train": names[:-1] or names, "valid": names[-1:]})
    return path

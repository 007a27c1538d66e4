"""The video encoder of every slot: diffusers' ``AutoencoderKLWan``.

``vae: tiny`` builds a tiny config with weights drawn from a fixed seed (identical in every
process, so parallel and sequential builds agree byte for byte); anything else is a local
directory of real weights loaded with ``local_files_only=True``. Latents are the posterior mode
(deterministic), float32, shaped (views, z, 1 + (F-1)/4, H/8, W/8).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from ground.errors import UserError
from ground.paths import expand_path

TINY_SEED = 0
TINY_CONFIG = {
    "base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1, "attn_scales": [],
    "temperal_downsample": [False, True, True], "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4,
}


@contextlib.contextmanager
def thread_count_invariant(device: torch.device) -> Iterator[None]:
    """On the CPU, convolutions without oneDNN: its kernels split work by thread count, so one process on
    2 threads and two ranks on 1 wrote files ~3e-7 apart (the tiny VAE, 2 vs 1 threads); ATen's own
    give the same bits for any count, so a CPU build's files do not depend on its world size."""
    if device.type != "cpu":
        yield
        return
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = was


class VideoEncoder:
    """Encodes (views, 3, F, H, W) clips in [-1, 1] to latents; one instance per process, on its device.

    On CUDA the encode runs under bf16 autocast (the GPU's fast path); on the CPU in fp32, so CPU
    builds are bitwise reproducible. Latents come back float32 on the CPU either way."""

    def __init__(self, vae: torch.nn.Module, name: str, device: torch.device | None = None):
        self.device = device or torch.device("cpu")
        self.vae = vae.eval().requires_grad_(False).to(self.device)
        self.name = name

    @property
    def precision(self) -> str:
        return "bf16-autocast" if self.device.type == "cuda" else "fp32"

    @torch.no_grad()
    def encode(self, clips: torch.Tensor) -> torch.Tensor:
        if clips.ndim != 5 or clips.shape[1] != 3:
            raise ValueError(f"expected (views, 3, F, H, W), got {tuple(clips.shape)}")
        with thread_count_invariant(self.device), torch.autocast("cuda", dtype=torch.bfloat16,
                                                                   enabled=self.device.type == "cuda"):
            latents = self.vae.encode(clips.float().to(self.device)).latent_dist.mode()
        return latents.float().cpu().contiguous()


def load_encoder(vae: str, device: torch.device | None = None) -> VideoEncoder:
    """``tiny`` → seeded random tiny VAE; a path → real weights from that local directory only; on ``device``
    (the CPU when None)."""
    from diffusers import AutoencoderKLWan

    if vae == "tiny":
        state = torch.random.get_rng_state()
        torch.manual_seed(TINY_SEED)
        try:
            model = AutoencoderKLWan(**TINY_CONFIG)
        finally:
            torch.random.set_rng_state(state)
        return VideoEncoder(model, "AutoencoderKLWan-tiny-seed0", device)
    directory = expand_path(vae)
    if not directory.is_dir():
        raise UserError("VAE weights directory does not exist", file=str(directory), field="latent.vae",
                        hint="point it at a local diffusers model dir, or use 'tiny' for smoke tests")
    subfolder = "vae" if (Path(directory) / "vae" / "config.json").exists() else None
    try:
        model = AutoencoderKLWan.from_pretrained(str(directory), subfolder=subfolder, local_files_only=True,
                                                 torch_dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load AutoencoderKLWan ({exc})", file=str(directory), field="latent.vae",
                        hint="the directory needs config.json and the weights") from exc
    return VideoEncoder(model, f"AutoencoderKLWan:{directory.name}", device)

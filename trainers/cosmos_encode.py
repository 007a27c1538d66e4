"""The Cosmos-Predict2 tokenizer path, as its pipeline runs it: frames → Wan VAE latents → the
transformer's patch embedding → its blocks (``Cosmos2VideoToWorldPipeline`` in diffusers 0.42).

- frames: ``1 + 4·(T − 1)`` RGB frames (the Wan VAE compresses time 4×, keeping frame 0), resized to
  ``16·token_grid`` pixels (VAE 8× spatially, then the transformer's 2×2 patches), in [-1, 1];
- latents: ``AutoencoderKLWan.encode(video).latent_dist.mode()`` (deterministic), normalised with the
  VAE's ``latents_mean``/``latents_std`` × ``sigma_data`` (1.0), as the pipeline's ``prepare_latents``;
- the transformer sees every frame as conditioning (a clean video: ``condition_mask`` = 1 when its
  ``in_channels`` is ``z_dim + 1``, timestep 0) and the pipeline's all-zero padding mask.

Models: a tiny seeded config of each (tests, quickstart) or real weights from local directories
(``from_pretrained(local_files_only=True)``: ``<dir>/vae`` and ``<dir>/transformer``, as the
Cosmos-Predict2 repositories lay them out). Each model's identity — class, config hash, weights hash
(or ``tiny-seed0``) — goes into every cache file so a cache built by other models is caught.
"""

from __future__ import annotations

import hashlib
import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cache.latent.encoder import TINY_CONFIG as TINY_VAE_CONFIG
from cache.latent.encoder import load_encoder as load_vae
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec.schema import DataSpec

TINY_SEED = 0
"""Every process builds the same random weights from this seed, so shards agree."""
PATCH = (1, 2, 2)
VAE_TEMPORAL, VAE_SPATIAL = 4, 8
TINY_Z_DIM = int(TINY_VAE_CONFIG["z_dim"])
TINY_TEXT_DIM = 16
CACHE_TIMESTEP = 0.0
"""Diffusion time at which the clean video is encoded (no noise added)."""
FPS = 16
"""The pipeline's default frame rate, which sets the rotary embedding's time scale."""
SIGMA_DATA = 1.0
"""``scheduler.config.sigma_data`` of Cosmos-Predict2; latents are scaled by it."""
_HASH_CHUNK = 16 << 20


@dataclass(frozen=True)
class ModelIdentity:
    """Which model produced a cache: class and source name, a hash of its config, of its weights."""

    name: str
    config_sha: str
    weights: str
    """sha256 (16 hex) of the weight files, or ``tiny-seed0`` for the seeded random tiny model."""

    def __str__(self) -> str:
        return f"{self.name} config:{self.config_sha} weights:{self.weights}"


def config_sha(config: Any) -> str:
    """Hash of a diffusers config without its bookkeeping keys (``_class_name``, ``_diffusers_version``…)."""
    clean = {key: value for key, value in dict(config).items() if not key.startswith("_")}
    return hashlib.sha256(json.dumps(clean, sort_keys=True, default=list).encode()).hexdigest()[:16]


def weights_sha(folder: Path) -> str:
    """sha256 over the weight files of a ``save_pretrained`` folder, in name order."""
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    if not files:
        raise UserError("no weight files (*.safetensors / *.bin)", file=str(folder), field="data.models",
                        hint="point it at a diffusers save_pretrained folder")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def tiny_cosmos_config(data: DataSpec) -> dict[str, Any]:
    """A Cosmos-Predict2-shaped transformer (condition-mask channel, padding mask) sized from the spec."""
    heads = 2 if data.channels % 2 == 0 else 1
    height, width = data.token_grid
    return {"in_channels": TINY_Z_DIM + 1, "out_channels": TINY_Z_DIM, "num_attention_heads": heads,
            "attention_head_dim": data.channels // heads, "num_layers": max(data.cached_layers) + 1,
            "mlp_ratio": 2.0, "text_embed_dim": TINY_TEXT_DIM, "adaln_lora_dim": 8,
            "max_size": (data.frames, height * PATCH[1], width * PATCH[2]), "patch_size": PATCH,
            "rope_scale": (1.0, 1.0, 1.0), "concat_padding_mask": True}


def _subfolder(root: Path, name: str) -> tuple[Path, str | None]:
    return (root / name, name) if (root / name).is_dir() else (root, None)


def load_models(data: DataSpec, model_dir: str | None = None) -> tuple[Any, Any, ModelIdentity, ModelIdentity]:
    """(vae, transformer, vae identity, transformer identity), frozen, checked against the spec.

    ``model_dir`` (``cache build-hidden --model-dir``) wins over the spec's ``data.models``."""
    from diffusers import CosmosTransformer3DModel

    if model_dir is None and data.models != "tiny":
        model_dir = str(expand_path(data.models))
    if model_dir is None:
        vae = load_vae("tiny").vae  # card B's seeded tiny Wan VAE: one definition for both caches
        torch.manual_seed(TINY_SEED)
        transformer = CosmosTransformer3DModel(**tiny_cosmos_config(data))
        vae_id = ModelIdentity("AutoencoderKLWan:tiny", config_sha(vae.config), f"tiny-seed{TINY_SEED}")
        tr_id = ModelIdentity("CosmosTransformer3DModel:tiny", config_sha(transformer.config), f"tiny-seed{TINY_SEED}")
    else:
        root = Path(model_dir)
        if not root.is_dir():
            raise UserError("model directory does not exist", file=str(root), field="data.models",
                            hint="give a local folder holding vae/ and transformer/")
        vae_dir, _ = _subfolder(root, "vae")
        tr_dir, tr_sub = _subfolder(root, "transformer")
        vae = load_vae(str(root)).vae
        try:
            transformer = CosmosTransformer3DModel.from_pretrained(root, subfolder=tr_sub, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load CosmosTransformer3DModel ({str(exc).splitlines()[0][:160]})", file=str(root),
                            field="data.models", hint="a save_pretrained folder transformer/ with config.json") from exc
        vae_id = ModelIdentity(f"AutoencoderKLWan:{root.name}", config_sha(vae.config), weights_sha(vae_dir))
        tr_id = ModelIdentity(f"CosmosTransformer3DModel:{root.name}", config_sha(transformer.config),
                              weights_sha(tr_dir))
    z_dim = vae.config.z_dim
    if transformer.config.in_channels not in (z_dim, z_dim + 1):
        raise UserError(f"transformer in_channels {transformer.config.in_channels} fits neither the VAE's z_dim "
                        f"{z_dim} nor z_dim + 1 (condition mask)", file=str(model_dir), field="transformer/config.json",
                        hint="use the VAE the transformer was trained with")
    width = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    if width != data.channels or len(transformer.transformer_blocks) <= max(data.cached_layers):
        raise UserError(f"model has hidden size {width} and {len(transformer.transformer_blocks)} blocks; the spec "
                        f"caches {data.channels} channels of blocks {data.cached_layers}", file=str(model_dir),
                        field="data.channels", hint="fix data.channels / data.cached_layers")
    _torchvision_free_padding_mask()
    return (vae.eval().requires_grad_(False), transformer.eval().requires_grad_(False), vae_id, tr_id)


def _torchvision_free_padding_mask() -> None:
    """Cosmos with ``concat_padding_mask=True`` resizes the padding mask with torchvision, which has no
    build beside this torch (stack-notes). Nearest resizing of a mask is ``F.interpolate(mode="nearest")``
    — what torchvision does for tensors — so give the module that one function when torchvision is absent."""
    import diffusers.models.transformers.transformer_cosmos as cosmos

    if hasattr(cosmos, "transforms"):
        return

    def resize(tensor: torch.Tensor, size: list[int], interpolation: Any = None) -> torch.Tensor:
        return torch.nn.functional.interpolate(tensor, size=size, mode="nearest")

    cosmos.transforms = types.SimpleNamespace(  # type: ignore[attr-defined]
        functional=types.SimpleNamespace(resize=resize), InterpolationMode=types.SimpleNamespace(NEAREST="nearest"))


def pixel_frames(latent_frames: int) -> int:
    """Video frames the Wan VAE turns into ``latent_frames`` latents: 1 + 4k."""
    return 1 + VAE_TEMPORAL * (latent_frames - 1)


def pixel_size(data: DataSpec) -> tuple[int, int]:
    """Frame size whose latents patchify to ``data.token_grid``: 16 × the grid (multiples of 16)."""
    scale = VAE_SPATIAL * PATCH[1]
    return data.token_grid[0] * scale, data.token_grid[1] * scale


def video_tensor(frames_uint8: np.ndarray, data: DataSpec) -> torch.Tensor:
    """(F, H, W, 3) uint8 → (1, 3, F, H', W') in [-1, 1], resized (bilinear) to :func:`pixel_size`."""
    video = torch.from_numpy(np.ascontiguousarray(frames_uint8)).float().permute(0, 3, 1, 2)  # (F, 3, H, W)
    size = pixel_size(data)
    if tuple(video.shape[-2:]) != size:
        video = torch.nn.functional.interpolate(video, size=size, mode="bilinear", align_corners=False)
    return video.div(127.5).sub(1.0).clamp(-1, 1).permute(1, 0, 2, 3).unsqueeze(0)


@torch.no_grad()
def encode_latents(vae: Any, video: torch.Tensor) -> torch.Tensor:
    """The pipeline's ``prepare_latents`` for a clean video: mode of the posterior, normalised."""
    latents = vae.encode(video.float()).latent_dist.mode().float()  # fp32 normalisation, under autocast too
    z_dim = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean, dtype=latents.dtype, device=latents.device).view(1, z_dim, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=latents.dtype, device=latents.device).view(1, z_dim, 1, 1, 1)
    return (latents - mean) / std * SIGMA_DATA


@torch.no_grad()
def hidden_states(transformer: Any, latents: torch.Tensor, text: torch.Tensor, blocks: list[int]) -> list[torch.Tensor]:
    """Outputs of ``transformer_blocks[b]`` for each of ``blocks``, each (T·H·W, C), by forward hooks."""
    batch, _, frames, height, width = latents.shape
    captured: dict[int, torch.Tensor] = {}
    hooks = [transformer.transformer_blocks[block].register_forward_hook(
        lambda _module, _inputs, output, block=block: captured.__setitem__(block, output))
        for block in blocks]
    kwargs: dict[str, Any] = {}
    if transformer.config.in_channels == latents.shape[1] + 1:
        kwargs["condition_mask"] = latents.new_ones(batch, 1, frames, height, width)  # every frame is given
    if transformer.config.concat_padding_mask:
        kwargs["padding_mask"] = latents.new_zeros(1, 1, height * VAE_SPATIAL, width * VAE_SPATIAL)
    try:
        transformer(latents, timestep=torch.tensor([CACHE_TIMESTEP], device=latents.device),
                    encoder_hidden_states=text.to(latents.device), fps=FPS,
                    return_dict=False, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return [captured[block][0] for block in blocks]

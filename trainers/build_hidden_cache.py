"""Build the multi-layer hidden-state cache: a frozen Cosmos transformer over each episode's frames.

For every demo: pick ``data.frames`` frames at a stride that spans the episode (cache frame ``f`` =
timestep ``f × frame_stride``, clamped to the last step), run diffusers' ``CosmosTransformer3DModel``
once, capture the output of ``transformer_blocks[i]`` for every ``i`` in ``data.cached_layers`` with
forward hooks, and write ``(L, T, H, W, C)`` in our safetensors format (``cache.hidden``).

The model is frozen: random-weight tiny config sized from the spec by default (tests, quickstart),
or real weights from a local directory (``from_pretrained(..., local_files_only=True)``). The
Cosmos video tokenizer is NOT run here: frames are average-pooled onto the latent grid (patch 2 →
tokens ``data.token_grid``) and their RGB channels tiled to the model's ``in_channels`` — a
stand-in for the tokenizer, said so in every file's ``encoder`` metadata.

Launch: ``accelerate launch`` with one process per device; demo ``k`` goes to process ``k mod P``.
Files already cached with the spec's geometry are skipped; every write is atomic (temp + rename), so
a crash leaves nothing that reads as cached and a rerun finishes the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cache.episodes import EpisodeFile
from cache.hidden import cache_file, check_matches, inspect_file, write_hidden
from ground.errors import UserError
from ground.paths import REPO_ROOT, expand_path, sweep_dead_temp_files
from ground.spec.schema import DataSpec, ExperimentSpec

PATCH = (1, 2, 2)
TEXT_DIM = 16
CACHE_TIMESTEP = 0.0
"""Diffusion time at which the clean video is encoded (no noise added)."""
TINY_SEED = 0
"""Every process builds the same random weights from this seed, so shards agree."""
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def tiny_cosmos_config(data: DataSpec) -> dict[str, Any]:
    """A CosmosTransformer3DModel config whose hidden size and token grid match the spec's cache."""
    heads = 2 if data.channels % 2 == 0 else 1
    height, width = data.token_grid
    return {"in_channels": 3, "out_channels": 3, "num_attention_heads": heads,
            "attention_head_dim": data.channels // heads, "num_layers": max(data.cached_layers) + 1,
            "mlp_ratio": 2.0, "text_embed_dim": TEXT_DIM, "adaln_lora_dim": 8,
            "max_size": (data.frames, height * PATCH[1], width * PATCH[2]), "patch_size": PATCH,
            "rope_scale": (1.0, 1.0, 1.0), "concat_padding_mask": False}


def load_encoder(data: DataSpec, model_dir: str | None = None) -> tuple[torch.nn.Module, str, str]:
    """(frozen model, encoder name, encoder version); ``concat_padding_mask`` must be off (torchvision)."""
    from diffusers import CosmosTransformer3DModel

    if model_dir is None:
        torch.manual_seed(TINY_SEED)
        model = CosmosTransformer3DModel(**tiny_cosmos_config(data))
        name, version = "cosmos-tiny-random+pooled-rgb", f"seed{TINY_SEED}"
    else:
        root = Path(model_dir)
        subfolder = "transformer" if (root / "transformer").is_dir() else None
        model = CosmosTransformer3DModel.from_pretrained(root, subfolder=subfolder, local_files_only=True)
        name, version = f"cosmos:{root.name}+pooled-rgb", str(model.config.get("_diffusers_version", "?"))
    if model.config.concat_padding_mask:
        raise UserError("the Cosmos model has concat_padding_mask=True, which needs torchvision",
                        file=str(model_dir), field="config.json:concat_padding_mask", hint="set it to false")
    width = model.config.num_attention_heads * model.config.attention_head_dim
    if width != data.channels or len(model.transformer_blocks) <= max(data.cached_layers):
        raise UserError(f"model has hidden size {width} and {len(model.transformer_blocks)} blocks; the spec caches "
                        f"{data.channels} channels of blocks {data.cached_layers}", file=str(model_dir),
                        field="data.channels", hint="fix data.channels / data.cached_layers")
    return model.eval().requires_grad_(False), name, version


def frame_stride(steps: int, frames: int) -> int:
    """Largest stride whose ``frames`` samples stay inside the episode (at least 1)."""
    return max(1, (steps - 1) // (frames - 1)) if frames > 1 else 1


def camera_key(episodes: EpisodeFile, demo: str) -> str:
    keys = sorted(k for k in episodes.handle[f"data/{demo}/obs"] if k.endswith("_image"))
    if not keys:
        raise UserError("demo has no camera observation (*_image)", file=str(episodes.path),
                        field=f"data/{demo}/obs", hint="record a camera when collecting demos")
    return keys[0]


def video_input(frames_uint8: np.ndarray, data: DataSpec, in_channels: int) -> torch.Tensor:
    """(T, H, W, 3) uint8 → (1, in_channels, T, 2·gh, 2·gw) in [-1, 1]: the tokenizer stand-in."""
    video = torch.from_numpy(frames_uint8).float().div(127.5).sub(1.0).permute(3, 0, 1, 2)  # (3, T, H, W)
    size = (data.token_grid[0] * PATCH[1], data.token_grid[1] * PATCH[2])
    pooled = torch.nn.functional.adaptive_avg_pool2d(video, size)
    tiled = pooled.repeat(-(-in_channels // 3), 1, 1, 1)[:in_channels]
    return tiled.unsqueeze(0)


@torch.no_grad()
def encode_demo(model: torch.nn.Module, episodes: EpisodeFile, demo: str, data: DataSpec) -> tuple[torch.Tensor, int]:
    """(L, T, H, W, C) hidden states of the cached blocks, and the frame stride used."""
    steps = episodes.num_samples(demo)
    stride = frame_stride(steps, data.frames)
    times = [min(f * stride, steps - 1) for f in range(data.frames)]
    images = episodes.obs(demo, camera_key(episodes, demo))[times]
    captured: dict[int, torch.Tensor] = {}
    hooks = [model.transformer_blocks[block].register_forward_hook(
        lambda _module, _inputs, output, block=block: captured.__setitem__(block, output))
        for block in data.cached_layers]
    try:
        model(video_input(images, data, model.config.in_channels), timestep=torch.tensor([CACHE_TIMESTEP]),
              encoder_hidden_states=torch.zeros(1, 1, model.config.text_embed_dim), return_dict=False)
    finally:
        for hook in hooks:
            hook.remove()
    height, width = data.token_grid
    # Blocks emit (B, T·H·W, C) tokens flattened frame-major; unflatten to the cache's (T, H, W, C).
    hidden = torch.stack([captured[b][0].reshape(data.frames, height, width, data.channels)
                          for b in data.cached_layers])
    return hidden.to(_DTYPES[data.dtype]), stride


def is_cached(path: Path, data: DataSpec) -> bool:
    if not path.exists():
        return False
    try:
        check_matches(inspect_file(path), layers=data.cached_layers, frames=data.frames,
                      token_grid=data.token_grid, channels=data.channels, dtype=data.dtype)
    except UserError:
        return False  # corrupt or stale geometry: rebuild it
    return True


def _require_safetensors(data: DataSpec) -> None:
    if data.cache_format != "safetensors":
        raise UserError(f"the builder writes safetensors, the spec says {data.cache_format}",
                        field="data.cache_format", hint="set data.cache_format: safetensors "
                        "(convert old .pt files with cache.hidden.convert_legacy)")


def build_shard(spec: ExperimentSpec, process_index: int, num_processes: int, model_dir: str | None = None,
                show_progress: bool = True) -> dict[str, int]:
    """Encode this process's share of the demos (demo k → process k mod P); skip what is cached."""
    from tqdm.auto import tqdm

    torch.set_num_threads(1)
    data = spec.data
    _require_safetensors(data)
    episodes = EpisodeFile(expand_path(data.episodes))
    root = expand_path(data.cache_root)
    mine = episodes.demos("all")[process_index::num_processes]
    sweep_dead_temp_files(root)  # a killed earlier build's half-written files (live writers' stay)
    todo = [demo for demo in mine if not is_cached(cache_file(root, demo, "safetensors"), data)]
    if todo:
        model, name, version = load_encoder(data, model_dir)
        for demo in tqdm(todo, desc=f"hidden cache [{process_index}/{num_processes}]", disable=not show_progress):
            hidden, stride = encode_demo(model, episodes, demo, data)
            write_hidden(cache_file(root, demo, "safetensors"), hidden, list(data.cached_layers),
                         {"encoder": name, "encoder_version": version, "demo": demo, "frame_stride": stride,
                          "timestep": CACHE_TIMESTEP})
    episodes.close()
    return {"built": len(todo), "skipped": len(mine) - len(todo)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_hidden_cache(spec: ExperimentSpec, processes: int = 1, model_dir: str | None = None) -> dict[str, Any]:
    """Fill ``data.cache_root`` for every demo of ``data.episodes``; ``processes > 1`` uses accelerate."""
    data = spec.data
    _require_safetensors(data)
    root = expand_path(data.cache_root)
    demos = EpisodeFile(expand_path(data.episodes)).demos("all")
    if processes == 1:
        counts = build_shard(spec, 0, 1, model_dir)
        return {**counts, "processes": 1, "demos": len(demos), "cache_root": str(root)}
    cached_before = sum(is_cached(cache_file(root, d, "safetensors"), data) for d in demos)
    with tempfile.TemporaryDirectory(prefix="idmctl_build_") as scratch:
        spec_file = Path(scratch) / "spec.json"
        spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
        env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "OMP_NUM_THREADS": "1"}
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                  "--main_process_port", str(_free_port())]
        if not torch.cuda.is_available():
            # `--cpu --num_processes N` silently runs one process; --multi_gpu + ACCELERATE_USE_CPU runs N.
            env["ACCELERATE_USE_CPU"] = "true"
        launch += ["--multi_gpu", "-m", "trainers.build_hidden_cache", "--spec-json", str(spec_file),
                   "--expect-processes", str(processes)]
        if model_dir:
            launch += ["--model-dir", model_dir]
        result = subprocess.run(launch, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"accelerate launch exited {result.returncode}: {tail[0]}")
    cached_after = sum(is_cached(cache_file(root, d, "safetensors"), data) for d in demos)
    per_process = sorted((json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"process"')),
                         key=lambda report: report["process"])
    return {"built": cached_after - cached_before, "skipped": cached_before, "processes": processes,
            "demos": len(demos), "cache_root": str(root), "per_process": per_process}


def main(argv: list[str] | None = None) -> None:
    """Entry point of one accelerate process."""
    from accelerate import Accelerator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec-json", required=True)
    parser.add_argument("--expect-processes", type=int, required=True)
    parser.add_argument("--model-dir")
    args = parser.parse_args(argv)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # A plain launch can silently start one process, or N processes that each think they are rank 0 of 1.
    assert accelerator.num_processes == world == args.expect_processes, (
        f"accelerate runs {accelerator.num_processes} process(es), WORLD_SIZE={world}, "
        f"expected {args.expect_processes}")
    spec = ExperimentSpec.model_validate(json.loads(Path(args.spec_json).read_text()))
    counts = build_shard(spec, accelerator.process_index, accelerator.num_processes, args.model_dir,
                         show_progress=accelerator.is_local_main_process)
    print(json.dumps({"process": accelerator.process_index, **counts}), flush=True)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()

"""Build the multi-layer hidden-state cache the way Cosmos-Predict2 sees a video.

For every demo: pick ``1 + 4·(data.frames − 1)`` camera frames at a stride that spans the episode,
encode them with the Wan VAE (``AutoencoderKLWan``) into ``data.frames`` latent frames, run the
frozen ``CosmosTransformer3DModel`` over them (its patch embedding, then its blocks), capture the
output of ``transformer_blocks[i]`` for every ``i`` in ``data.cached_layers`` with forward hooks, and
write ``(L, T, H, W, C)`` in our safetensors format (``cache.hidden``). See ``trainers.cosmos_encode``
for the pipeline steps and ``trainers.text_condition`` for the prompt.

Cache frame ``f`` is latent frame ``f``, which ends at video frame ``4f``. Video frame ``p`` is episode
timestep ``round(p × stride / 4)`` with ``stride`` the largest that keeps ``data.frames`` latent frames
inside the episode, so cache frame ``f`` shows timestep ``f × stride`` (``frame_stride`` in the metadata)
and the cache spans the whole episode, as before the VAE was in the path.

Models are frozen: tiny seeded configs by default (tests, quickstart), or real weights from local
directories (``--model-dir`` with ``vae/`` and ``transformer/``). Each file records both models'
identities (``vae``, ``transformer``: name, config hash, weights hash or ``tiny-seed0``) and the text
conditioning source, so preflight can tell a cache built by other models (a stale cache).

Launch: ``accelerate launch`` with one process per device; demo ``k`` goes to process ``k mod P``.
Files already cached with the spec's geometry and models are skipped; every write is atomic (temp +
rename), so a crash leaves nothing that reads as cached and a rerun finishes the rest.
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

import torch

from cache.episodes import EpisodeFile
from cache.hidden import cache_file, check_matches, inspect_file, write_hidden
from ground.errors import UserError
from ground.paths import REPO_ROOT, expand_path, sweep_dead_temp_files
from ground.spec.schema import DataSpec, ExperimentSpec
from trainers.cosmos_encode import (CACHE_TIMESTEP, VAE_TEMPORAL, encode_latents, hidden_states, load_models,
                                    pixel_frames, video_tensor)
from trainers.text_condition import TextConditioning

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def frame_stride(steps: int, frames: int) -> int:
    """Largest stride whose ``frames`` samples stay inside the episode (at least 1)."""
    return max(1, (steps - 1) // (frames - 1)) if frames > 1 else 1


def camera_key(episodes: EpisodeFile, demo: str) -> str:
    keys = sorted(k for k in episodes.handle[f"data/{demo}/obs"] if k.endswith("_image"))
    if not keys:
        raise UserError("demo has no camera observation (*_image)", file=str(episodes.path),
                        field=f"data/{demo}/obs", hint="record a camera when collecting demos")
    return keys[0]


@torch.no_grad()
def encode_demo(vae: Any, transformer: Any, text: torch.Tensor, episodes: EpisodeFile, demo: str,
                data: DataSpec) -> tuple[torch.Tensor, int]:
    """(L, T, H, W, C) hidden states of the cached blocks, and the cache frame stride in timesteps."""
    steps = episodes.num_samples(demo)
    stride = frame_stride(steps, data.frames)
    times = [min(round(p * stride / VAE_TEMPORAL), steps - 1) for p in range(pixel_frames(data.frames))]
    latents = encode_latents(vae, video_tensor(episodes.obs(demo, camera_key(episodes, demo))[times], data))
    height, width = data.token_grid
    if latents.shape[2] != data.frames or latents.shape[3] != 2 * height or latents.shape[4] != 2 * width:
        raise UserError(f"the VAE gives latents {tuple(latents.shape[2:])}, the spec's cache needs "
                        f"({data.frames}, {2 * height}, {2 * width})", field="data.token_grid",
                        hint="use a Wan VAE (4× time, 8× space compression)")
    captured = hidden_states(transformer, latents, text, list(data.cached_layers))
    # Blocks emit (T·H·W, C) tokens flattened frame-major; unflatten to the cache's (T, H, W, C).
    hidden = torch.stack([tokens.reshape(data.frames, height, width, data.channels) for tokens in captured])
    return hidden.to(_DTYPES[data.dtype]), stride


def is_cached(path: Path, data: DataSpec, built_by: dict[str, str] | None = None) -> bool:
    """A file with the spec's geometry (and, when ``built_by`` is given, built by those models)."""
    if not path.exists():
        return False
    try:
        info = inspect_file(path)
        check_matches(info, layers=data.cached_layers, frames=data.frames,
                      token_grid=data.token_grid, channels=data.channels, dtype=data.dtype)
    except UserError:
        return False  # corrupt or stale geometry: rebuild it
    return built_by is None or all(info.meta.get(key) == value for key, value in built_by.items())


def _require_safetensors(data: DataSpec) -> None:
    if data.cache_format != "safetensors":
        raise UserError(f"the builder writes safetensors, the spec says {data.cache_format}",
                        field="data.cache_format", hint="set data.cache_format: safetensors "
                        "(convert a legacy .pt cache with `idmctl cache convert EXP`)")


def build_shard(spec: ExperimentSpec, process_index: int, num_processes: int, model_dir: str | None = None,
                show_progress: bool = True, text_encoder_dir: str | None = None) -> dict[str, int]:
    """Encode this process's share of the demos (demo k → process k mod P); skip what is cached."""
    from tqdm.auto import tqdm

    torch.set_num_threads(1)
    data = spec.data
    _require_safetensors(data)
    episodes = EpisodeFile(expand_path(data.episodes))
    root = expand_path(data.cache_root)
    mine = episodes.demos("all")[process_index::num_processes]
    sweep_dead_temp_files(root)  # a killed earlier build's half-written files (live writers' stay)
    vae, transformer, vae_id, tr_id = load_models(data, model_dir)
    _check_spec_identity(data, str(vae_id), str(tr_id))
    built_by = {"vae": str(vae_id), "transformer": str(tr_id)}
    todo = [demo for demo in mine if not is_cached(cache_file(root, demo, "safetensors"), data, built_by)]
    text = TextConditioning(spec, transformer.config.text_embed_dim, text_encoder_dir)
    for demo in tqdm(todo, desc=f"hidden cache [{process_index}/{num_processes}]", disable=not show_progress):
        hidden, stride = encode_demo(vae, transformer, text.for_demo(episodes, demo), episodes, demo, data)
        write_hidden(cache_file(root, demo, "safetensors"), hidden, list(data.cached_layers),
                     {"encoder": "wan-vae+cosmos", **built_by, "text_conditioning": text.source, "demo": demo,
                      "frame_stride": stride, "timestep": CACHE_TIMESTEP})
    episodes.close()
    return {"built": len(todo), "skipped": len(mine) - len(todo)}


def _check_spec_identity(data: DataSpec, vae: str, transformer: str) -> None:
    """Refuse to build with other models than the spec names (the cache would be stale at birth)."""
    for field, want, got in (("vae_id", data.vae_id, vae), ("transformer_id", data.transformer_id, transformer)):
        if want is not None and want != got:
            raise UserError(f"the loaded model is {got!r}, the spec names {want!r}", field=f"data.{field}",
                            hint="load the models the spec names (--model-dir) or update the spec")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_hidden_cache(spec: ExperimentSpec, processes: int = 1, model_dir: str | None = None,
                       text_encoder_dir: str | None = None) -> dict[str, Any]:
    """Fill ``data.cache_root`` for every demo of ``data.episodes``; ``processes > 1`` uses accelerate."""
    data = spec.data
    _require_safetensors(data)
    root = expand_path(data.cache_root)
    demos = EpisodeFile(expand_path(data.episodes)).demos("all")
    if processes == 1:
        counts = build_shard(spec, 0, 1, model_dir, text_encoder_dir=text_encoder_dir)
        return {**counts, "processes": 1, "demos": len(demos), "cache_root": str(root)}
    cached_before = sum(is_cached(cache_file(root, d, "safetensors"), data) for d in demos)
    with tempfile.TemporaryDirectory(prefix="idmctl_build_") as scratch:
        spec_file = Path(scratch) / "canonical_spec.json"  # a spec dict, not a run directory
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
        if text_encoder_dir:
            launch += ["--text-encoder-dir", text_encoder_dir]
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
    parser.add_argument("--text-encoder-dir")
    args = parser.parse_args(argv)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # A plain launch can silently start one process, or N processes that each think they are rank 0 of 1.
    assert accelerator.num_processes == world == args.expect_processes, (
        f"accelerate runs {accelerator.num_processes} process(es), WORLD_SIZE={world}, "
        f"expected {args.expect_processes}")
    document = json.loads(Path(args.spec_json).read_text())
    # A build job passes its run directory's spec.json ({"name", "hash", "spec"}); build-hidden a bare spec.
    spec = ExperimentSpec.model_validate(document["spec"] if "hash" in document and "spec" in document else document)
    try:
        counts = build_shard(spec, accelerator.process_index, accelerator.num_processes, args.model_dir,
                             show_progress=accelerator.is_local_main_process, text_encoder_dir=args.text_encoder_dir)
    except UserError as exc:
        print(exc.line(), file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except OSError as exc:
        from trainers.build_latent_cache import disk_full_exit

        raise SystemExit(disk_full_exit(exc)) from None
    print(json.dumps({"process": accelerator.process_index, **counts}), flush=True)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()

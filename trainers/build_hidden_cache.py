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

Launch: one process per device (srun tasks in a build job, torchrun here; ``trainers.build_ranks``),
each on its own device (``cuda:LOCAL_RANK``, bf16 autocast; fp32 on the CPU). Demos in name order,
demo ``k`` goes to rank ``k mod world``: each file has one writer, and N ranks write exactly the files
one process writes (bitwise on the CPU). Nothing is reduced over all demos. Files already cached with
the spec's geometry and models are skipped; every write is atomic (temp + rename), so a crash leaves
nothing that reads as cached and a rerun finishes the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ground.startup import settled, starting

if __name__ == "__main__":
    starting()  # before torch and diffusers: their imports are most of a builder's start
import torch  # noqa: E402  (after starting(), on purpose)

from cache.episodes import EpisodeFile  # noqa: E402
from cache.hidden import cache_file, check_matches, inspect_file, write_hidden
from cache.latent.encoder import thread_count_invariant
from ground.errors import UserError
from ground.paths import REPO_ROOT, expand_path, sweep_dead_temp_files
from ground.spec.schema import DataSpec, ExperimentSpec
from trainers.cosmos_encode import (CACHE_TIMESTEP, VAE_TEMPORAL, encode_latents, hidden_states, load_models,
                                    pixel_frames, video_tensor)
from trainers.build_ranks import RANK_LINE_KEY, BuildRank, build_rank, builder_command, rank_line, start_rank
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
                data: DataSpec, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """(L, T, H, W, C) hidden states of the cached blocks (on the CPU), and the cache frame stride in
    timesteps. The models must already be on ``device`` (the CPU when None)."""
    steps = episodes.num_samples(demo)
    stride = frame_stride(steps, data.frames)
    times = [min(round(p * stride / VAE_TEMPORAL), steps - 1) for p in range(pixel_frames(data.frames))]
    video = video_tensor(episodes.obs(demo, camera_key(episodes, demo))[times], data)
    latents = encode_latents(vae, video.to(device) if device is not None else video)
    height, width = data.token_grid
    if latents.shape[2] != data.frames or latents.shape[3] != 2 * height or latents.shape[4] != 2 * width:
        raise UserError(f"the VAE gives latents {tuple(latents.shape[2:])}, the spec's cache needs "
                        f"({data.frames}, {2 * height}, {2 * width})", field="data.token_grid",
                        hint="use a Wan VAE (4× time, 8× space compression)")
    captured = hidden_states(transformer, latents, text, list(data.cached_layers))
    # Blocks emit (T·H·W, C) tokens flattened frame-major; unflatten to the cache's (T, H, W, C).
    hidden = torch.stack([tokens.reshape(data.frames, height, width, data.channels) for tokens in captured])
    return hidden.to(_DTYPES[data.dtype]).cpu(), stride


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


def build_shard(spec: ExperimentSpec, rank: BuildRank, model_dir: str | None = None,
                show_progress: bool = True, text_encoder_dir: str | None = None) -> dict[str, int]:
    """Encode this rank's share of the demos (demo k → rank k mod world) on its device; skip what is cached."""
    from tqdm.auto import tqdm

    data = spec.data
    _require_safetensors(data)
    episodes = EpisodeFile(expand_path(data.episodes))
    root = expand_path(data.cache_root)
    index, world = rank.ranks.rank, rank.ranks.world
    mine = episodes.demos("all")[index::world]
    if index == 0:
        # A killed earlier build's half-written files (live writers' stay). Rank 0 alone, before anyone
        # writes: a writer on another node has a pid this node cannot see.
        sweep_dead_temp_files(root)
    rank.barrier()
    vae, transformer, vae_id, tr_id = load_models(data, model_dir)
    vae, transformer = vae.to(rank.device), transformer.to(rank.device)
    _check_spec_identity(data, str(vae_id), str(tr_id))
    built_by = {"vae": str(vae_id), "transformer": str(tr_id)}
    todo = [demo for demo in mine if not is_cached(cache_file(root, demo, "safetensors"), data, built_by)]
    text = TextConditioning(spec, transformer.config.text_embed_dim, text_encoder_dir)
    settled()  # the models are loaded: the loop below is the build
    for demo in tqdm(todo, desc=f"hidden cache [{index}/{world}]", disable=not show_progress):
        with rank.autocast(), thread_count_invariant(rank.device):
            hidden, stride = encode_demo(vae, transformer, text.for_demo(episodes, demo), episodes, demo, data,
                                         rank.device)
        write_hidden(cache_file(root, demo, "safetensors"), hidden, list(data.cached_layers),
                     {"encoder": "wan-vae+cosmos", **built_by, "text_conditioning": text.source, "demo": demo,
                      "frame_stride": stride, "timestep": CACHE_TIMESTEP, "precision": rank.precision})
    episodes.close()
    return {"built": len(todo), "skipped": len(mine) - len(todo)}


def _check_spec_identity(data: DataSpec, vae: str, transformer: str) -> None:
    """Refuse to build with other models than the spec names (the cache would be stale at birth)."""
    for field, want, got in (("vae_id", data.vae_id, vae), ("transformer_id", data.transformer_id, transformer)):
        if want is not None and want != got:
            raise UserError(f"the loaded model is {got!r}, the spec names {want!r}", field=f"data.{field}",
                            hint="load the models the spec names (--model-dir) or update the spec")


def build_hidden_cache(spec: ExperimentSpec, processes: int = 1, model_dir: str | None = None,
                       text_encoder_dir: str | None = None) -> dict[str, Any]:
    """Fill ``data.cache_root`` for every demo of ``data.episodes``; ``processes > 1`` starts that many ranks."""
    data = spec.data
    _require_safetensors(data)
    root = expand_path(data.cache_root)
    demos = EpisodeFile(expand_path(data.episodes)).demos("all")
    if processes == 1:
        with build_rank({}) as rank:  # this process alone, whatever launched it
            counts = build_shard(spec, rank, model_dir, text_encoder_dir=text_encoder_dir)
        return {**counts, "processes": 1, "demos": len(demos), "cache_root": str(root)}
    cached_before = sum(is_cached(cache_file(root, d, "safetensors"), data) for d in demos)
    with tempfile.TemporaryDirectory(prefix="idmctl_build_") as scratch:
        spec_file = Path(scratch) / "canonical_spec.json"  # a spec dict, not a run directory
        spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
        builder = ["trainers.build_hidden_cache", "--spec-json", str(spec_file), "--expect-processes", str(processes)]
        if model_dir:
            builder += ["--model-dir", model_dir]
        if text_encoder_dir:
            builder += ["--text-encoder-dir", text_encoder_dir]
        argv, env = builder_command(builder, processes,
                                    env={**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
        result = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{argv[2] if argv[1] == '-m' else argv[0]} exited {result.returncode}: {tail[0]}")
    cached_after = sum(is_cached(cache_file(root, d, "safetensors"), data) for d in demos)
    per_process = sorted((json.loads(line) for line in result.stdout.splitlines()
                          if line.startswith(f'{{"{RANK_LINE_KEY}"')), key=lambda report: report[RANK_LINE_KEY])
    return {"built": cached_after - cached_before, "skipped": cached_before, "processes": processes,
            "demos": len(demos), "cache_root": str(root), "per_process": per_process}


def main(argv: list[str] | None = None) -> None:
    """Entry point of one rank (an srun task, a torchrun worker, or a plain process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec-json", required=True)
    parser.add_argument("--expect-processes", type=int, required=True)
    parser.add_argument("--model-dir")
    parser.add_argument("--text-encoder-dir")
    args = parser.parse_args(argv)
    try:
        rank = start_rank()
        # A launch that starts one process, or N that each think they are rank 0 of 1, would build it all N times.
        if rank.ranks.world != args.expect_processes:
            raise UserError(f"{rank.ranks.launcher} started {rank.ranks.world} rank(s), the build expects "
                            f"{args.expect_processes}", field="--expect-processes",
                            hint="launch one rank per device (srun --ntasks / torchrun --nproc-per-node)")
        document = json.loads(Path(args.spec_json).read_text())
        # A build job passes its run directory's spec.json ({"name", "hash", "spec"}); build-hidden a bare spec.
        spec = ExperimentSpec.model_validate(document["spec"] if "hash" in document and "spec" in document else document)
        counts = build_shard(spec, rank, args.model_dir, show_progress=rank.ranks.local_rank == 0,
                             text_encoder_dir=args.text_encoder_dir)
    except UserError as exc:
        print(exc.line(), file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except OSError as exc:
        from trainers.build_latent_cache import disk_full_exit

        raise SystemExit(disk_full_exit(exc)) from None
    print(rank_line(rank, **counts), flush=True)
    rank.barrier()
    rank.close()


if __name__ == "__main__":
    main()

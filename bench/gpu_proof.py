"""The GPU proof: the CUDA lines of the project, run once on one GPU in under 5 minutes.

``python -m bench.gpu_proof --out DIR [--device cuda|cpu]`` measures, and writes ``DIR/gpu_proof.json``:

1. **smoke**: ``trainers.smoke.run_smoke`` of ``latent_c_n4`` at card A's full dimensions, batch 2,
   bf16 autocast, over a synthetic hidden cache of the card's geometry (12 layers × 6 frames × 27 × 48
   × 5120 bf16 per demo, 2 demos: random values; the 6.6 TB cache cannot exist on a lent machine).
   Peak memory against the card's 5.46 GB; dataset / first sample / model build / step seconds against
   the card's 23 s / 0.7 s / 39 s (the card's dataset is the real one, ours two files: that row
   compares the code path, not the data size); finite losses.
2. **fabric**: one Fabric ``bf16-mixed`` DDP step of the same model on 1 device (NCCL on CUDA, gloo on
   the CPU), as ``trainers.train.setup_fabric`` builds it.
3. **hidden_build**: one window of the hidden-cache builder at full width: the Wan VAE at its default
   (Wan 2.1) size, then a Cosmos-Predict2-14B-shaped transformer (40 heads × 128 = 5120 wide, 36
   blocks), random weights made on the device, under the builder's bf16 autocast
   (``trainers.build_ranks``), capturing ``data.cached_layers``.
4. **nvml**: what the efficiency report reads (``torch.cuda.utilization``: NVML's GPU utilisation),
   sampled every 0.2 s while the smoke runs; its mean.

``--device cpu`` runs every line at a reduced size (``bench.gpu.reduced_spec`` widths, a 3 × 4 token
grid, a 2-block transformer, the tiny VAE), so CI keeps it alive (tests/bench/test_gpu_bench.py); its JSON
says ``"measured_on_gpu": false`` and the figures say "not measured on a GPU".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Figure

RECORDED = Path(__file__).with_name("gpu_proof.json")
SPEC = "latent_c_n4"
CARD = {"peak_mem_bytes": 5.46e9, "dataset_s": 23.0, "sample_s": 0.7, "model_s": 39.0}
"""Card A's smoke of latent_c_n4 at batch 2 (the figures this proof is compared with)."""
FULL_COSMOS = {"num_attention_heads": 40, "attention_head_dim": 128, "num_layers": 36, "mlp_ratio": 4.0,
               "adaln_lora_dim": 256, "text_embed_dim": 1024}
"""Cosmos-Predict2-14B's transformer widths (5120 wide, 36 blocks); the rest from the builder's config."""
SYNTHETIC_DEMOS = 2
NO_GPU = "no GPU on this machine and no GPU run recorded (bench/gpu.sh is the prepared run for a lent device)"


def _smoke_spec(device: str, root: Path) -> Any:
    """``latent_c_n4`` (reduced on the CPU) over a synthetic safetensors cache of its geometry under ``root``."""
    import numpy as np
    import torch

    from bench.gpu import reduced_spec
    from cache.episodes import Demo, write_episodes
    from cache.hidden import cache_file, write_hidden
    from ground.spec.loader import load_spec

    spec = load_spec(SPEC).spec
    if device == "cpu":
        spec = reduced_spec(spec)
    data = spec.data
    frames = data.frame_window + 1  # two windows per demo
    steps = frames + data.action_horizon
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)
    demos = []
    for index in range(SYNTHETIC_DEMOS):
        name = f"demo_{index}"
        hidden = torch.randn((len(data.cached_layers), frames, *data.token_grid, data.channels), generator=generator,
                             dtype=torch.float32).to(torch.bfloat16)
        write_hidden(cache_file(root / "hidden", name, "safetensors"), hidden, list(data.cached_layers),
                     {"demo": name, "frame_stride": 1, "encoder": "bench.gpu_proof random"})
        del hidden
        demos.append(Demo(name, rng.standard_normal((steps, data.action_dim)).astype(np.float32),
                          np.zeros((steps, 2)), obs={"robot0_eef_pos": np.zeros((steps, 3), dtype=np.float32)}))
    write_episodes(root / "episodes.hdf5", demos, env_args={"env_name": "bench"},
                   splits={"train": [d.name for d in demos], "valid": [demos[-1].name]})
    changes = {"episodes": str(root / "episodes.hdf5"), "cache_root": str(root / "hidden"),
               "cache_format": "safetensors", "frames": frames, "dtype": "bfloat16"}
    return spec.model_copy(update={"data": data.model_copy(update=changes),
                                   "loader": spec.loader.model_copy(update={"num_workers": 0})})


def measure_smoke(device: str, root: Path) -> dict[str, Any]:
    import torch

    from trainers.smoke import run_smoke

    spec = _smoke_spec(device, root)
    with NvmlSampler(torch.device("cuda", 0) if device == "cuda" else None) as nvml:
        report = run_smoke(spec, steps=3, batch_size=2, device=device, bf16=True)
    utilisation = nvml.samples
    params = report["params"]
    return {**report, "geometry": f"{len(spec.data.cached_layers)} layers × {spec.data.frames} frames × "
            f"{spec.data.token_grid[0]} × {spec.data.token_grid[1]} × {spec.data.channels} bf16 per demo, "
            f"{SYNTHETIC_DEMOS} demos", "params": params, "nvml_utilisation": utilisation}


class NvmlSampler:
    """NVML's GPU utilisation (percent) every ``period_s`` while the block runs, read as the trainer reads it
    at each log line (``torch.cuda.utilization``); no samples without NVML (the trainer then has none either)."""

    def __init__(self, device: Any, period_s: float = 0.2):
        import threading

        self.device, self.period_s, self.samples = device, period_s, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import torch

        while not self._stop.wait(self.period_s):
            try:
                self.samples.append(float(torch.cuda.utilization(self.device)))
            except Exception:  # noqa: BLE001 (pynvml missing or the driver refuses: no number, as in the trainer)
                return

    def __enter__(self) -> "NvmlSampler":
        if self.device is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def measure_fabric(device: str) -> dict[str, Any]:
    """One Fabric bf16-mixed DDP step on 1 device of the smoke's model (random batch of the cache's shape)."""
    import torch
    from lightning_fabric import Fabric

    from bench.gpu import reduced_spec
    from ground.spec.loader import load_spec
    from trainers.registry import build_model
    from trainers.train import noise_generator

    spec = load_spec(SPEC).spec
    if device == "cpu":
        spec = reduced_spec(spec)
    data = spec.data
    fabric = Fabric(accelerator=device, devices=1, strategy="ddp", precision="bf16-mixed")
    fabric.launch()
    torch.manual_seed(spec.train.seed)
    model = build_model(spec, device=fabric.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr)
    model, optimizer = fabric.setup(model, optimizer)
    hidden = torch.randn(2, data.routing_n, data.frame_window, *data.token_grid, data.channels, device=fabric.device)
    actions = torch.randn(2, data.action_horizon, data.action_dim, device=fabric.device)
    mask = torch.ones(2, data.action_horizon, device=fabric.device)
    started = time.perf_counter()
    loss = model(hidden, actions, mask, generator=noise_generator(spec.train.seed, 0, 0, 0))
    fabric.backward(loss)
    optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"
    result = {"step_s": seconds, "loss": float(loss.detach()), "loss_finite": math.isfinite(float(loss.detach())),
              "precision": "bf16-mixed", "strategy": "ddp", "world_size": fabric.world_size, "backend": backend,
              "device": str(fabric.device)}
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result


def measure_hidden_build(device: str) -> dict[str, Any]:
    """One window (``frame_window`` latent frames) through the builder's path at full width on ``device``."""
    import torch
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel

    from bench.gpu import REDUCED
    from cache.latent.encoder import TINY_CONFIG, thread_count_invariant
    from ground.spec.loader import load_spec
    from trainers.build_ranks import BuildRank
    from trainers.cosmos_encode import encode_latents, hidden_states, pixel_frames, pixel_size, tiny_cosmos_config
    from ground.ranks import SINGLE

    data = load_spec(SPEC).spec.data
    if device == "cpu":
        data = data.model_copy(update={"channels": REDUCED["channels"], "token_grid": REDUCED["token_grid"],
                                       "cached_layers": [0, 1]})
    data = data.model_copy(update={"frames": data.frame_window})
    rank = BuildRank(SINGLE, torch.device(device), torch.get_num_threads())
    started = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(rank.device):  # random weights made where they run: seconds, not the CPU's minutes
        vae = AutoencoderKLWan() if device == "cuda" else AutoencoderKLWan(**TINY_CONFIG)
        config = tiny_cosmos_config(data)
        z_dim = vae.config.z_dim
        config.update(in_channels=z_dim + 1, out_channels=z_dim)
        if device == "cuda":
            config.update(FULL_COSMOS)
        transformer = CosmosTransformer3DModel(**config)
    vae.eval().requires_grad_(False)
    transformer.eval().requires_grad_(False)
    build_s = time.perf_counter() - started
    from trainers.cosmos_encode import _torchvision_free_padding_mask

    _torchvision_free_padding_mask()
    height, width = pixel_size(data)
    video = torch.rand(1, 3, pixel_frames(data.frames), height, width, generator=torch.Generator().manual_seed(0)) * 2 - 1
    text = torch.zeros(1, 1, transformer.config.text_embed_dim)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad(), rank.autocast(), thread_count_invariant(rank.device):
        latents = encode_latents(vae, video.to(rank.device))
        vae_s = time.perf_counter() - started
        captured = hidden_states(transformer, latents, text, list(data.cached_layers))
    if device == "cuda":
        torch.cuda.synchronize()
    encode_s = time.perf_counter() - started
    finite = all(bool(torch.isfinite(t.float()).all()) for t in captured)
    return {"device": device, "precision": rank.precision, "width": transformer.config.num_attention_heads
            * transformer.config.attention_head_dim, "blocks": len(transformer.transformer_blocks),
            "transformer_params": sum(p.numel() for p in transformer.parameters()),
            "vae_params": sum(p.numel() for p in vae.parameters()), "video": list(video.shape),
            "latents": list(latents.shape), "captured_layers": len(captured), "tokens": int(captured[0].shape[0]),
            "model_build_s": build_s, "vae_s": vae_s, "encode_s": encode_s, "finite": finite,
            "peak_mem_bytes": int(torch.cuda.max_memory_allocated()) if device == "cuda" else None}


def measure(device: str) -> dict[str, Any]:
    import platform

    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        where: dict[str, Any] = {"gpu": props.name, "gpu_memory_bytes": props.total_memory, "cuda": torch.version.cuda}
    else:
        where = {"gpu": f"none (CPU run: {platform.machine()}, reduced sizes)", "gpu_memory_bytes": None, "cuda": None}
    result: dict[str, Any] = {**where, "measured_on_gpu": device == "cuda", "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    parts = {"fabric": lambda: measure_fabric(device), "hidden_build": lambda: measure_hidden_build(device)}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_proof_") as scratch:
        started = time.perf_counter()
        result["smoke"] = measure_smoke(device, Path(scratch))
        seconds["smoke"] = time.perf_counter() - started
    for name, part in parts.items():
        started = time.perf_counter()
        result[name] = part()
        seconds[name] = time.perf_counter() - started
        if device == "cuda":
            torch.cuda.empty_cache()
    util = result["smoke"]["nvml_utilisation"]
    result["nvml"] = {"gpu_util_mean": statistics.mean(util) / 100 if util else None, "samples": len(util),
                      "source": "torch.cuda.utilization (NVML), as trainers/train.py samples it at log lines"
                      if device == "cuda" else "not measured on a GPU"}
    result["part_seconds"] = seconds
    return result


def ok(result: dict[str, Any]) -> bool:
    return bool(result["smoke"]["all_finite"] and result["fabric"]["loss_finite"] and result["hidden_build"]["finite"])


def figures_from(result: dict[str, Any], recorded: bool) -> list[Figure]:
    smoke, fabric, build = result["smoke"], result["fabric"], result["hidden_build"]
    where = result["gpu"] + (f", recorded {result['date']} by bench/gpu.sh (bench/gpu_proof.json)" if recorded else "")
    if not result["measured_on_gpu"]:
        where = "not measured on a GPU: " + where
    figures = [
        Figure("latent_c_n4 smoke peak memory (B=2)", "B", [float(smoke["peak_mem_bytes"])], "card A",
               [CARD["peak_mem_bytes"]], target="≈ card's 5.46 GB", note=f"{where}; {smoke['geometry']}"),
        Figure("smoke dataset build", "s", [smoke["dataset_s"]], "card A", [CARD["dataset_s"]],
               note=f"{SYNTHETIC_DEMOS} synthetic demos vs the card's real data set: the code path, not the size"),
        Figure("smoke first sample", "s", [smoke["sample_s"]], "card A", [CARD["sample_s"]]),
        Figure("smoke model build", "s", [smoke["model_s"]], "card A", [CARD["model_s"]],
               note=f"{smoke['params']:,} params"),
        Figure("smoke seconds per step", "s", [smoke["step_s"]],
               note=f"losses {', '.join(f'{x:.4f}' for x in smoke['losses'])} (finite: {smoke['all_finite']})"),
        Figure("Fabric bf16-mixed DDP step, 1 device", "s", [fabric["step_s"]],
               note=f"backend {fabric['backend']}, world {fabric['world_size']}, loss {fabric['loss']:.4f}"),
        Figure("hidden-cache build of one window", "s", [build["encode_s"]],
               note=f"{build['width']} wide × {build['blocks']} blocks ({build['transformer_params']:,} params), "
                    f"{build['precision']}; video {build['video']} → latents {build['latents']}; "
                    f"VAE {build['vae_s']:.2f} s of it" + (f"; peak {build['peak_mem_bytes']:,} B" if build["peak_mem_bytes"] else "")),
    ]
    util = result["nvml"]["gpu_util_mean"]
    if util is not None:
        figures.append(Figure("NVML GPU utilisation during the smoke", "%", [100 * util],
                              note=f"{result['nvml']['samples']} samples; {result['nvml']['source']}"))
    if not result["measured_on_gpu"]:  # every row says so, not only the first: a CPU figure never reads as a GPU one
        for figure in figures[1:]:
            figure.note = f"not measured on a GPU (CPU, reduced sizes); {figure.note}".rstrip("; ")
    return figures


def run(fast: bool) -> list[Figure] | str:
    import os

    import torch

    from bench.gpu import RESULTS_ENV

    if folder := os.environ.get(RESULTS_ENV):  # bench/gpu.sh: report what it just measured
        return figures_from(json.loads((Path(folder) / "gpu_proof.json").read_text()), recorded=False)
    if torch.cuda.is_available():
        return figures_from(measure("cuda"), recorded=False)
    if RECORDED.exists():
        recorded = json.loads(RECORDED.read_text())
        if recorded.get("measured_on_gpu"):
            return figures_from(recorded, recorded=True)
    return NO_GPU


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_proof.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device visible (torch.cuda.is_available() is False; --device cpu runs the reduced "
              "sizes)", file=sys.stderr)
        return 2
    result = measure(args.device)
    from ground.paths import atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "gpu_proof.json", json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: result[key] for key in ("gpu", "measured_on_gpu", "part_seconds")}))
    return 0 if ok(result) else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU figures: the ``latent_c_n4`` model at card A's full dimensions on one GPU, bf16, SDPA, batch 2.

Measures peak memory (card A: 5.46 GB), seconds per optimizer step, and throughput of the routed DiT
(N=4 layers, depth 4) against the same DiT cross-attending all 12 cached layers
(``latent_c_n12_dense``: N=12, depth 12). The model comes from ``trainers.registry.build_model`` and
each step is the smoke's step (bf16 autocast, AdamW). The hidden states are random tensors of the
cache's exact shape, made on the device: the 6.6 TB Cosmos cache cannot exist on a lent machine, and
disk reads are figure 3's business, not this one's.

``bench/gpu.sh`` runs ``python -m bench.gpu --out FILE`` on a lent device and writes JSON. Without a
GPU, ``run()`` reports the JSON recorded at ``bench/gpu_result.json`` if one was committed, else
"not measured".

``python -m bench.gpu --device cpu`` runs every line of the same code on the CPU at a reduced size
(:func:`reduced_spec`: the same routing, depth and frame window; small widths and token grid), bf16
autocast included, so CI exercises all of it but the device itself (tests/bench/test_gpu_bench.py). The GPU
code once recursed forever on its first CUDA call (``synchronize()`` called itself); a CPU run could
not see that, which is why the device calls are few, named, and each one a single torch call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import Figure

RECORDED = Path(__file__).with_name("gpu_result.json")
RESULTS_ENV = "GPU_BENCH_RESULTS"
"""The folder bench/gpu.sh wrote its JSON to: ``bench.run`` then reports those results."""
CARD_PEAK_BYTES = 5.46e9
SPECS = {"routed": "latent_c_n4", "dense": "latent_c_n12_dense"}


REDUCED = {"channels": 64, "token_grid": (3, 4), "hidden_dim": 64, "num_heads": 4, "kv_dim": 64,
           "timestep_dim": 32}
"""Widths for the CPU run; routing N, depth, frame window, horizon and action size stay the spec's."""


def reduced_spec(spec: Any) -> Any:
    """``spec`` with small widths and token grid: the same structure at a size a CPU steps in seconds."""
    data = spec.data.model_copy(update={"channels": REDUCED["channels"], "token_grid": REDUCED["token_grid"]})
    model = spec.model.model_copy(update={key: REDUCED[key] for key in
                                          ("hidden_dim", "num_heads", "kv_dim", "timestep_dim")})
    return spec.model_copy(update={"data": data, "model": model})


def synchronize(device: Any) -> None:
    """Wait for the device's queued work, so a step's time includes it (CPU work is synchronous).

    Module level so a test can check the CUDA branch calls torch (it once called itself forever)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_spec(spec_name: str, batch_size: int, steps: int, warmup: int, device_name: str = "cuda",
                 reduced: bool = False, bf16: bool = True) -> dict[str, Any]:
    """Training steps of ``spec_name``'s model on one device (full dimensions unless ``reduced``);
    timings, peak memory, the arithmetic. ``bf16``: autocast to bfloat16, as the trainer's bf16-mixed."""
    import torch

    from ground.spec.loader import load_spec
    from trainers.registry import build_model
    from trainers.train import noise_generator, peak_memory_bytes

    spec = load_spec(spec_name).spec
    if reduced:
        spec = reduced_spec(spec)
    data = spec.data
    device = torch.device(device_name)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    torch.manual_seed(spec.train.seed)
    model = build_model(spec, device=device)
    matmul_dtypes: set[str] = set()
    first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    dtype_hook = first_linear.register_forward_hook(lambda _m, _i, out: matmul_dtypes.add(str(out.dtype)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr, weight_decay=spec.train.weight_decay)
    hidden_shape = (batch_size, data.routing_n, data.frame_window, *data.token_grid, data.channels)
    hidden = torch.randn(hidden_shape, device=device, dtype=torch.bfloat16)
    actions = torch.randn(batch_size, data.action_horizon, data.action_dim, device=device)
    mask = torch.ones(batch_size, data.action_horizon, device=device)
    seconds = []
    for step in range(warmup + steps):
        synchronize(device)
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(hidden, actions, mask, generator=noise_generator(spec.train.seed, step, 0, 0))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synchronize(device)
        if step >= warmup:
            seconds.append(time.perf_counter() - started)
    dtype_hook.remove()
    context_tokens = data.frame_window * data.token_grid[0] * data.token_grid[1]
    step_s = statistics.median(seconds)
    result = {
        "spec": spec_name, "routing_n": data.routing_n, "depth": spec.model.depth, "batch_size": batch_size,
        "device": str(device), "reduced": reduced, "bf16": bf16, "loss_dtype": str(loss.dtype),
        "params": sum(p.numel() for p in model.parameters()), "step_seconds": seconds, "step_s": step_s,
        "samples_per_s": batch_size / step_s,
        "context_tokens_per_sample": data.routing_n * context_tokens,
        "context_tokens_per_s": batch_size * data.routing_n * context_tokens / step_s,
        "context_arithmetic": (f"{batch_size} × {data.routing_n} layers × {data.frame_window} frames × "
                               f"{data.token_grid[0]} × {data.token_grid[1]} tokens = "
                               f"{batch_size * data.routing_n * context_tokens:,} tokens per step"),
        "peak_mem_bytes": peak_memory_bytes(device),
        "loss_finite": bool(torch.isfinite(loss.detach()).item()),
        "matmul_dtypes": sorted(matmul_dtypes),
    }
    del model, optimizer, hidden
    return result


def measure(batch_size: int = 2, steps: int = 10, warmup: int = 3, device_name: str = "cuda",
            reduced: bool = False) -> dict[str, Any]:
    import platform

    import torch

    if device_name == "cuda":
        props = torch.cuda.get_device_properties(0)
        where = {"gpu": props.name, "gpu_memory_bytes": props.total_memory, "cuda": torch.version.cuda}
    else:
        where = {"gpu": f"none (CPU run: {platform.processor() or platform.machine()}, reduced size {REDUCED})",
                 "gpu_memory_bytes": None, "cuda": None}
    return {
        **where, "torch": torch.__version__, "precision": "bf16 autocast (weights fp32, AdamW)", "attention": "SDPA",
        "hidden_states": "random bf16 tensors of the cache's shape, made on the device (no 6.6 TB cache here)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **{kind: measure_spec(name, batch_size, steps, warmup, device_name, reduced) for kind, name in SPECS.items()},
    }


def figures_from(result: dict[str, Any], recorded: bool) -> list[Figure]:
    routed, dense = result["routed"], result["dense"]
    where = f"{result['gpu']}, torch {result['torch']}, batch {routed['batch_size']}" + (
        f", recorded {result['date']} by bench/gpu.sh (bench/gpu_result.json)" if recorded else "")
    if result.get("gpu_memory_bytes") is None:
        where = f"not measured on a GPU: {where}"
    return [
        Figure("latent_c_n4 peak GPU memory (training step)", "B", [float(routed["peak_mem_bytes"])],
               "card A", [CARD_PEAK_BYTES], target="≈ card's 5.46 GB", note=where),
        Figure("latent_c_n4 seconds per optimizer step", "s", routed["step_seconds"],
               note=f"{routed['params']:,} params; {routed['context_arithmetic']}"),
        Figure("routed DiT (N=4, depth 4) samples/s", "samples/s", [routed["batch_size"] / s for s in routed["step_seconds"]],
               "same DiT cross-attending all 12 layers (N=12, depth 12)",
               [dense["batch_size"] / s for s in dense["step_seconds"]], higher_is_better=True,
               note=f"context tokens/s: routed {routed['context_tokens_per_s']:,.0f} vs dense "
                    f"{dense['context_tokens_per_s']:,.0f}; dense peak {dense['peak_mem_bytes']:,} B"),
    ]


def run(fast: bool) -> list[Figure] | str:
    import os

    import torch

    if folder := os.environ.get(RESULTS_ENV):  # bench/gpu.sh: report what it just measured, do not measure again
        return figures_from(json.loads((Path(folder) / "gpu_result.json").read_text()), recorded=False)
    if torch.cuda.is_available():
        return figures_from(measure(steps=3 if fast else 10), recorded=False)
    if RECORDED.exists():
        return figures_from(json.loads(RECORDED.read_text()), recorded=True)
    return "no GPU on this machine (bench/gpu.sh is the prepared script for a lent device)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the JSON here (atomically)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same code at a reduced size (CI), bf16 included")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device visible (torch.cuda.is_available() is False; --device cpu runs the reduced "
              "size)", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(1)
    result = measure(steps=args.steps, warmup=args.warmup, device_name=args.device, reduced=args.device == "cpu")
    text = json.dumps(result, indent=2)
    if args.out:
        from ground.paths import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    print(text)
    return 0 if all(result[kind]["loss_finite"] for kind in SPECS) else 1


if __name__ == "__main__":
    sys.exit(main())

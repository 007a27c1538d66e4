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
CARD_PEAK_BYTES = 5.46e9
SPECS = {"routed": "latent_c_n4", "dense": "latent_c_n12_dense"}


def measure_spec(spec_name: str, batch_size: int, steps: int, warmup: int, device_name: str = "cuda") -> dict[str, Any]:
    """Full-dimension training steps of ``spec_name``'s model on one device; timings, memory, the arithmetic.

    ``device_name="cpu"`` exists only to check this code on a machine without a GPU (tiny specs).
    """
    import torch

    from ground.spec.loader import load_spec
    from trainers.registry import build_model
    from trainers.train import noise_generator, peak_memory_bytes

    spec = load_spec(spec_name).spec
    data = spec.data
    device = torch.device(device_name)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    def synchronize() -> None:
        if on_gpu:
            synchronize()
    torch.manual_seed(spec.train.seed)
    model = build_model(spec, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr, weight_decay=spec.train.weight_decay)
    hidden_shape = (batch_size, data.routing_n, data.frame_window, *data.token_grid, data.channels)
    hidden = torch.randn(hidden_shape, device=device, dtype=torch.bfloat16)
    actions = torch.randn(batch_size, data.action_horizon, data.action_dim, device=device)
    mask = torch.ones(batch_size, data.action_horizon, device=device)
    seconds = []
    for step in range(warmup + steps):
        synchronize()
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
            loss = model(hidden, actions, mask, generator=noise_generator(spec.train.seed, step, 0, 0))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synchronize()
        if step >= warmup:
            seconds.append(time.perf_counter() - started)
    context_tokens = data.frame_window * data.token_grid[0] * data.token_grid[1]
    step_s = statistics.median(seconds)
    result = {
        "spec": spec_name, "routing_n": data.routing_n, "depth": spec.model.depth, "batch_size": batch_size,
        "params": sum(p.numel() for p in model.parameters()), "step_seconds": seconds, "step_s": step_s,
        "samples_per_s": batch_size / step_s,
        "context_tokens_per_sample": data.routing_n * context_tokens,
        "context_tokens_per_s": batch_size * data.routing_n * context_tokens / step_s,
        "context_arithmetic": (f"{batch_size} × {data.routing_n} layers × {data.frame_window} frames × "
                               f"{data.token_grid[0]} × {data.token_grid[1]} tokens = "
                               f"{batch_size * data.routing_n * context_tokens:,} tokens per step"),
        "peak_mem_bytes": peak_memory_bytes(device),
        "loss_finite": bool(torch.isfinite(loss.detach()).item()),
    }
    del model, optimizer, hidden
    return result


def measure(batch_size: int = 2, steps: int = 10, warmup: int = 3) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name, "gpu_memory_bytes": props.total_memory, "torch": torch.__version__,
        "cuda": torch.version.cuda, "precision": "bf16 autocast (weights fp32, AdamW)", "attention": "SDPA",
        "hidden_states": "random bf16 tensors of the cache's shape, made on the device (no 6.6 TB cache here)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **{kind: measure_spec(name, batch_size, steps, warmup) for kind, name in SPECS.items()},
    }


def figures_from(result: dict[str, Any], recorded: bool) -> list[Figure]:
    routed, dense = result["routed"], result["dense"]
    where = f"{result['gpu']}, torch {result['torch']}, batch {routed['batch_size']}" + (
        f", recorded {result['date']} by bench/gpu.sh (bench/gpu_result.json)" if recorded else "")
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
    import torch

    if torch.cuda.is_available():
        return figures_from(measure(steps=3 if fast else 10), recorded=False)
    if RECORDED.exists():
        return figures_from(json.loads(RECORDED.read_text()), recorded=True)
    return "no GPU on this machine (bench/gpu.sh is the prepared script for a lent device)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the JSON here (atomically)")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device visible (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    result = measure(steps=args.steps)
    text = json.dumps(result, indent=2)
    if args.out:
        from ground.paths import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

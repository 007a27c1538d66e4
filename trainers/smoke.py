"""The one-minute smoke (card A's ``tmp/debug_latent_C_n4.py``): the trainer's own factories, a few
real optimizer steps, timings — what catches jobs 6262 and 6321 before a 2 h stage.

``python -m trainers.smoke --spec-json FILE`` prints ONE JSON line (preflight runs it in a
subprocess with a timeout). FILE holds the canonical spec dict, or a run's ``spec.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ground.startup import settled, starting

if __name__ == "__main__":
    starting()  # before torch: its import is most of a smoke's start
import torch  # noqa: E402  (after starting(), on purpose)

from ground.paths import drop_from_page_cache  # noqa: E402
from ground.spec.schema import ExperimentSpec  # noqa: E402


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _peak_bytes(device: torch.device) -> int:
    from trainers.train import peak_memory_bytes

    return peak_memory_bytes(device)


def run_smoke(spec: ExperimentSpec, steps: int = 3, batch_size: int = 2, device: str | None = None,
              bf16: bool | None = None) -> dict[str, Any]:
    """Build the training dataset and the model exactly as the trainer does, then ``steps`` AdamW steps.

    GPU if one is visible (bf16 autocast, as the trainer's bf16-mixed), else CPU in fp32. ``device``
    and ``bf16`` override that, so the GPU path (bf16 autocast) also runs on a CPU (tests, CI).
    """
    from torch.utils.data import DataLoader

    from cache.batches import BatchLoader, supports
    from cache.registry import build_dataset, repeat_samples
    from trainers.registry import build_model
    from trainers.train import noise_generator

    device = torch.device(device) if device else _device()
    use_bf16 = device.type == "cuda" if bf16 is None else bf16
    if device.type == "cpu":
        torch.set_num_threads(1)
    else:
        torch.cuda.reset_peak_memory_stats(device)
    report: dict[str, Any] = {"device": str(device), "batch_size": batch_size, "steps": steps,
                              "precision": "bf16 autocast" if use_bf16 else "fp32"}

    started = time.perf_counter()
    dataset = build_dataset(spec, "train")
    report["dataset_s"] = time.perf_counter() - started
    report["samples"] = len(dataset)

    started = time.perf_counter()
    dataset[0]
    report["sample_s"] = time.perf_counter() - started

    started = time.perf_counter()
    torch.manual_seed(spec.train.seed)
    model = build_model(spec, device=device)
    report["model_s"] = time.perf_counter() - started
    report["params"] = sum(p.numel() for p in model.parameters())

    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr, weight_decay=spec.train.weight_decay)
    # In the rank's own process, as the trainer with num_workers 0: its batch loader when the dataset
    # has exact ranges (cache.batches), torch's DataLoader for a team's own class.
    # Sample repeats as the trainer does them: batch_size // K distinct samples, each K times.
    repeats = spec.loader.repeats
    distinct = max(1, batch_size // repeats)
    report["batch_size"] = distinct * repeats
    loader = (_ShuffledBatches(dataset, distinct, device) if supports(dataset) else
              DataLoader(dataset, batch_size=distinct, shuffle=True, generator=torch.Generator().manual_seed(0)))
    batches = iter(loader)
    losses, step_seconds = [], []
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16)
    settled()
    for step in range(steps):
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        started = time.perf_counter()
        with autocast:
            hidden, actions, mask = (repeat_samples(batch[k].to(device), repeats)
                                     for k in ("hidden", "actions", "action_mask"))
            loss = model(hidden, actions, mask, generator=noise_generator(spec.train.seed, step, 0, 0))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_seconds.append(time.perf_counter() - started)
    report["losses"] = losses
    report["all_finite"] = all(math.isfinite(x) for x in losses)
    if supports(dataset):
        if isinstance(batches, BatchLoader):
            batches.close(wait_s=60)  # its read-ahead must not run into the measurement
        report.update(measure_loader_cpu(dataset, distinct))
    report["step_s"] = statistics.median(step_seconds)
    report["peak_mem_bytes"] = _peak_bytes(device)
    report["checkpoint_s"], report["checkpoint_bytes"] = _time_checkpoint(model, optimizer)
    return report


class _ShuffledBatches:
    """Epochs of shuffled batches through the trainer's batch loader (a new loader per epoch)."""

    def __init__(self, dataset: Any, batch_size: int, device: torch.device):
        self.dataset, self.batch_size, self.device = dataset, batch_size, device
        self.generator = torch.Generator().manual_seed(0)

    def __iter__(self) -> Any:
        from cache.batches import BatchLoader

        order = torch.randperm(len(self.dataset), generator=self.generator).tolist()
        return BatchLoader(self.dataset, [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)],
                           self.batch_size, self.device)


LOADER_MEASURE_BYTES = 256 << 20
"""The loader's CPU is measured over at least this many bytes (or the whole split, if smaller)..."""
LOADER_MEASURE_MIN_BATCHES = 4
"""...and at least this many batches, so start-up costs (thread, first open) spread over several."""


def measure_loader_cpu(dataset: Any, batch_size: int) -> dict[str, Any]:
    """The loader's CPU seconds per GB on the job's own data path: the batch loader reading batches
    with nothing else running in this process, CPU time of every thread (``time.process_time``: the
    reader thread, the preadv pool, the HDF5 targets) ÷ the hidden-state bytes it read.

    The plan divides it by the rank's CPUs to get the loader's share of a step (``idmctl.plan.budget``).
    Two passes over the same batches, each from an empty page cache (the steps above warmed it, and a
    hit costs about half a miss's CPU: the kernel then only copies, it does not also fill the cache):
    through the page cache (``loader_cpu_s_per_gb``, what a job pays for the bytes it misses, an upper
    bound for the ones it hits) and with O_DIRECT (``loader_direct_cpu_s_per_gb``, None where no range
    is aligned for it), for the read path the plan chooses."""
    shape, dtype = dataset.hidden_shape()
    sample_bytes = int(torch.Size(shape).numel()) * dtype.itemsize
    batch_bytes = batch_size * sample_bytes
    items = len(dataset)
    batches = max(LOADER_MEASURE_MIN_BATCHES, min(-(-LOADER_MEASURE_BYTES // batch_bytes), -(-items // batch_size)))
    order = [[(b * batch_size + i) % items for i in range(batch_size)] for b in range(batches)]
    files = sorted({str(dataset.hidden_ranges(item)[0].path) for batch in order for item in batch})
    cached = _loader_pass(dataset, order, batch_size, files, direct=False)
    direct = _loader_pass(dataset, order, batch_size, files, direct=True)
    gigabytes = cached["bytes"] / 1e9
    return {"loader_cpu_s": cached["cpu"], "loader_wall_s": cached["wall"], "loader_bytes": cached["bytes"],
            "loader_cpu_s_per_gb": cached["cpu"] / gigabytes if gigabytes else None,
            "loader_direct_cpu_s_per_gb": (direct["cpu"] / (direct["bytes"] / 1e9)
                                           if direct["direct_bytes"] == direct["bytes"] > 0 else None)}


def _loader_pass(dataset: Any, order: list[list[int]], batch_size: int, files: list[str], direct: bool) -> dict[str, Any]:
    from cache.batches import BatchLoader  # start-up: the loader's modules, only for a dataset that has ranges

    drop_from_page_cache(files)
    cpu, wall = time.process_time(), time.perf_counter()
    loader = BatchLoader(dataset, order, batch_size, direct=direct)
    for _ in loader:
        pass
    return {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "bytes": loader.bytes_read,
            "direct_bytes": loader.direct_bytes}


def _time_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[float, int]:
    """Write model + optimizer state once as the trainer's checkpoint holds them, through the same
    publish (fsyncs, sha256 manifest, rename); the derived checkpoint interval and signal lead are sized
    from this time, the disk check from these bytes. Written where run directories live."""
    import tempfile

    from ground.paths import home
    from trainers.checkpoint import checkpoint_bytes, checkpoint_path, write_checkpoint_dir

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 0}
    parent = home() / "runs"  # the disk checkpoints will go to; the system temp dir before any run exists
    with tempfile.TemporaryDirectory(prefix=".smoke_ckpt_", dir=parent if parent.is_dir() else None) as tmp:
        started = time.perf_counter()
        path = write_checkpoint_dir(checkpoint_path(Path(tmp), 0), lambda target: torch.save(state, target), 0)
        return time.perf_counter() - started, checkpoint_bytes(path)


def _load_spec_json(path: Path) -> ExperimentSpec:
    document = json.loads(path.read_text())
    return ExperimentSpec.model_validate(document.get("spec", document) if "data" not in document else document)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainers.smoke", description="Real-trainer smoke; one JSON line.")
    parser.add_argument("--spec-json", required=True, type=Path, help="Canonical spec JSON (or a run's spec.json).")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when visible, else cpu")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="bf16 autocast (default: on GPU only)")
    args = parser.parse_args(argv)
    report = run_smoke(_load_spec_json(args.spec_json), steps=args.steps, batch_size=args.batch_size,
                       device=args.device, bf16=args.bf16)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0 if report["all_finite"] else 1


if __name__ == "__main__":
    sys.exit(main())

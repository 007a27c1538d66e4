"""Trainer overhead: the Fabric trainer's seconds per step vs a bare PyTorch loop, same model and data.

Both run in this process on one CPU rank, on the same real tiny cache (safetensors + HDF5), the same
DataLoader (``cache.registry.build_dataloader``), the same model factory, AdamW, gradient
accumulation and flow-noise generators. The Fabric side is the real ``trainers.train.fit`` (its own
``step_time_s`` metric, which excludes logging/checkpoint/eval between steps); the bare side is
the loop a person would write by hand. Runs alternate so machine drift hits both alike.
Target: Fabric within 5% of bare. ``python -m bench.trainer_overhead --fast`` prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Figure
from ground.contract import ENV_HOME, MLFLOW_RUN_ID_FILE


def _spec(root: Path, steps: int, fast: bool) -> Path:
    import yaml

    from trainers.tiny_data import tiny_spec, write_tiny_routed_data

    data = write_tiny_routed_data(root / "data", grid=(4, 4), channels=64 if fast else 256, demos=6, valid=2)
    width = 64 if fast else 256
    spec = tiny_spec(data, model={"depth": 4, "hidden_dim": width, "num_heads": 4, "kv_dim": width,
                                  "timestep_dim": 64},
                     loader={"batch_size": 4}, train={"steps": steps, "effective_batch": 8, "checkpoint_every": steps,
                                                      "log_every": 1})
    path = root / "overhead.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _fabric_step_times(spec_path: Path, run_dir: Path) -> list[float]:
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri
    from ground.spec.loader import load_spec
    from ground.run_dir import read_run_spec, write_run_spec
    from trainers.train import STOP_SIGNALS, fit, setup_fabric

    write_run_spec(run_dir, load_spec(str(spec_path)))
    run = read_run_spec(run_dir)
    fabric = setup_fabric(run.spec)
    # fit() installs the trainer's USR1/TERM handlers for the life of its process (a job's trainer
    # exits after it); run from bench.run, possibly inside the test suite's worker, they are given back.
    kept = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        assert fit(fabric, run) == 0
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
    run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    history = MlflowClient(tracking_uri=mlflow_tracking_uri()).get_metric_history(run_id, "step_time_s")
    return [m.value for m in sorted(history, key=lambda m: m.step)]


def _bare_step_times(spec_path: Path) -> list[float]:
    import torch

    from cache.registry import build_dataloader
    from ground.spec.loader import load_spec
    from trainers.registry import build_model
    from cache.batches import trainer_batches
    from trainers.train import learning_rate, micro_batches, noise_generator

    spec = load_spec(str(spec_path)).spec
    torch.manual_seed(spec.train.seed)
    model = build_model(spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr, weight_decay=spec.train.weight_decay)
    loader = build_dataloader(spec, "train", shuffle=True, seed=spec.train.seed)
    # The trainer's own loader (num_workers 0: the batch loader), so both loops load alike.
    batches = trainer_batches(loader, 0, torch.device("cpu")) or micro_batches(loader, 0)
    times = []
    for step in range(1, spec.train.steps + 1):
        started = time.perf_counter()
        for micro in range(spec.grad_accum):
            batch = next(batches)
            loss = model(batch["hidden"], batch["actions"], batch["action_mask"],
                         generator=noise_generator(spec.train.seed, step, 0, micro))
            (loss / spec.grad_accum).backward()
        if not torch.isfinite(loss):
            raise RuntimeError("non-finite loss in the bare loop")
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(spec, step - 1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return times


def run(fast: bool) -> list[Figure]:
    import torch

    torch.set_num_threads(1)
    # Fast mode only proves the module runs: one round. The full run's (30, 5) was (60, 5), minutes on 2
    # shared cores.
    steps, rounds = (12, 1) if fast else (30, 5)
    warmup = 2  # first steps pay for allocator and page-cache warm-up in both loops
    fabric_s, bare_s = [], []
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        root = Path(tmp)
        os.environ[ENV_HOME] = str(root / "home")
        spec_path = _spec(root, steps, fast)
        for index in range(rounds):
            bare_s.append(statistics.median(_bare_step_times(spec_path)[warmup:]))
            fabric_s.append(statistics.median(_fabric_step_times(spec_path, root / f"run{index}")[warmup:]))
    return [Figure("Fabric trainer: seconds per optimizer step", "s", fabric_s, "bare PyTorch loop", bare_s,
                   target="≤ 1.05× bare", note=f"median of steps {warmup + 1}..{steps} per round, {rounds} rounds, "
                                                "1 CPU rank, 32-true, grad_accum 2")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a 64-wide model, 12 steps × 1 round")
    args = parser.parse_args()
    figures = run(args.fast)
    print(json.dumps([figure.as_dict() for figure in figures], indent=2))


if __name__ == "__main__":
    main()


# -- bench.run adapter: steps/s as a ratio (Fabric ÷ bare, target ≥ 0.95),
# and the data-wait fraction of a step with an N=4 loader (layers 0-3 routed), from the trainer's
# own MLflow metric. -------------------------------------------------------------------------------

_seconds_per_step_figures = run


def _data_wait_fractions(fast: bool) -> tuple[list[float], str]:
    """One real Fabric fit over an N=4 selection; the trainer's data-wait fraction per logged window (in
    %), and a note comparing the loader's own time per step (the batch loader alone, no compute) with
    the trainer's step time: the fraction means something only where compute exceeds the data time."""
    import yaml
    from mlflow.tracking import MlflowClient

    from cache.batches import BatchLoader, sampler_batches
    from cache.registry import build_dataloader
    from ground.paths import mlflow_tracking_uri
    from ground.spec.loader import load_spec
    from ground.tracking import M_DATA_WAIT, M_STEP_TIME

    steps = 12 if fast else 30
    with tempfile.TemporaryDirectory(prefix="bench_datawait_") as tmp:
        root = Path(tmp)
        os.environ[ENV_HOME] = str(root / "home")
        spec_path = _spec(root, steps, fast)
        spec = yaml.safe_load(spec_path.read_text())
        spec["data"]["selected_layer_indices"] = [0, 1, 2, 3]
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        _fabric_step_times(spec_path, root / "run")
        run_id = (root / "run" / MLFLOW_RUN_ID_FILE).read_text().strip()
        client = MlflowClient(tracking_uri=mlflow_tracking_uri())
        waits = [100 * m.value for m in sorted(client.get_metric_history(run_id, M_DATA_WAIT), key=lambda m: m.step)]
        step_s = statistics.median(m.value for m in client.get_metric_history(run_id, M_STEP_TIME))
        loaded = load_spec(str(spec_path)).spec
        loader = build_dataloader(loaded, "train", shuffle=True, seed=loaded.train.seed)
        micro = steps * loaded.grad_accum
        started = time.perf_counter()
        for _ in BatchLoader(loader.dataset, (b for _, b in zip(range(micro), sampler_batches(loader.sampler,
                                                                                               loader.batch_size))),
                             loader.batch_size):
            pass
        data_s = (time.perf_counter() - started) / steps
    note = (f"the loader alone: {data_s * 1e3:.1f} ms of reads per step ({loaded.grad_accum} micro-batches, no compute) "
            f"vs the trainer's {step_s * 1e3:.1f} ms step (median)")
    return waits[2:], note  # same warm-up as above


def run(fast: bool) -> list[Figure]:  # type: ignore[no-redef]
    figures = _seconds_per_step_figures(fast)
    per_step = figures[0]
    figures.append(Figure("Fabric trainer: optimizer steps/s", "steps/s", [1 / s for s in per_step.samples],
                          "bare PyTorch loop", [1 / s for s in per_step.reference_samples], target="≥ 0.95× bare",
                          higher_is_better=True, note="1 ÷ the seconds-per-step figure above, round by round"))
    wait, data_note = _data_wait_fractions(fast)
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, shared with other helpers' work"
    figures.append(Figure("data-wait fraction of a step, N=4 loader", "%", wait, target="≤ 5%",
                          note="trainer's data_wait_frac per logged step (time in next(loader) ÷ step time), "
                               f"num_workers 0 (the batch loader, 2 batches ahead), 1 CPU rank; {data_note}; {load}"))
    return figures

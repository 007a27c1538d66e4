"""FIXED copy of team_idm/train.py (job 6262): persistent_workers follows num_workers.

HF-Trainer-style training loop for the latent IDM (``python -m team_idm.train --config ... ``).

Flags are named like HF ``TrainingArguments``; ``--config`` gives defaults that flags override. It
honours idmctl's entry contract (``ground/contract.py``): the run directory from ``IDMCTL_RUN_DIR``
(else ``--output_dir``) holding ``spec.json``, whose ``data.dataset`` and ``model.name`` are
``{class_path, init_args}``; ``IDMCTL_SMOKE_STEPS``/``IDMCTL_SMOKE_BATCH`` ask for that many steps at
that batch, then exit 0; one ``IDMCTL_STEP`` line per optimizer step (``trainers.entry_helper``);
``RUN_DIR/checkpoint-<step>/`` every ``--save_steps``, resumed from the newest; SIGUSR1/SIGTERM ->
checkpoint, exit 75 (the job script requeues).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import yaml

from ground import contract

DEFAULTS = {"learning_rate": 3e-3, "save_steps": 500, "seed": 0, "max_steps": None}
CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
_stop: list[str] = []


def _on_stop(signum: int, _frame: object) -> None:
    _stop.append(signal.Signals(signum).name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="team_idm.train")
    parser.add_argument("--config", help="YAML of defaults for the flags below")
    parser.add_argument("--output_dir", default="outputs/idm_robocasa_latent_C_n4")
    parser.add_argument("--dataloader_num_workers", type=int, default=0)
    parser.add_argument("--per_device_train_batch_size", type=int, default=2)
    parser.add_argument("--max_steps", type=int, help="default: the spec's train.steps")
    parser.add_argument("--learning_rate", type=float)
    parser.add_argument("--save_steps", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    config = yaml.safe_load(Path(args.config).read_text()) if args.config else {}
    for key, default in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, config.get(key, default))
    return args


def build(entry: dict, **extra: object) -> object:
    """``{class_path, init_args}`` -> ``cls(**init_args, **extra)``."""
    module, _, name = entry["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**entry.get("init_args", {}), **extra)


class StepBatches:
    """Batch k of a run is the same whichever attempt draws it: epoch e's order is a permutation seeded
    by (seed, e), so a resumed run trains on exactly the batches an uninterrupted one would."""

    def __init__(self, size: int, batch: int, seed: int, start_step: int):
        if batch > size:
            raise ValueError(f"per_device_train_batch_size {batch} is more than the {size} samples")
        self.size, self.batch, self.seed, self.start = size, batch, seed, start_step

    def __iter__(self):
        import torch

        per_epoch, step = self.size // self.batch, self.start
        while True:
            epoch, k = divmod(step, per_epoch)
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
            yield order[k * self.batch:(k + 1) * self.batch].tolist()
            step += 1


def newest_checkpoint(run_dir: Path) -> Path | None:
    found = [(int(m.group(1)), path) for path in run_dir.iterdir() if (m := CHECKPOINT.match(path.name))]
    return max(found)[1] if found else None


def save_checkpoint(run_dir: Path, step: int, model, optimizer, report) -> None:
    """Written under a temp name and renamed: a job killed mid-write leaves no checkpoint-<step>/."""
    import torch

    final = run_dir / f"checkpoint-{step}"
    if final.exists():  # the periodic save of this step already ran
        return
    started = time.perf_counter()
    tmp = run_dir / f".{final.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(model.state_dict(), tmp / "model.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for path in tmp.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    os.replace(tmp, final)
    report.checkpoint(time.perf_counter() - started, sum(p.stat().st_size for p in final.iterdir()))


def main(argv: list[str] | None = None) -> int:
    # Before torch loads (seconds on a busy node): a preemption notice during start-up is remembered.
    signal.signal(signal.SIGUSR1, _on_stop)
    signal.signal(signal.SIGTERM, _on_stop)
    args = parse_args(argv)
    run_dir = Path(os.environ.get(contract.ENV_RUN_DIR) or args.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_doc = json.loads((run_dir / contract.SPEC_FILE).read_text())
    spec = spec_doc["spec"]

    import torch
    from torch.utils.data import DataLoader

    from trainers.entry_helper import Reporter, smoke_batch, smoke_steps

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    smoke = smoke_steps()
    total = smoke if smoke is not None else (args.max_steps or spec["train"]["steps"])
    batch = smoke_batch(args.per_device_train_batch_size)
    report = Reporter(run_dir, spec_doc)

    started = time.perf_counter()
    dataset = build(spec["data"]["dataset"], split=spec["data"].get("train_split", "train"))
    dataset_s = time.perf_counter() - started
    dataset[0]  # one sample, timed: the card's smoke reported 0.7 s
    sample_s = time.perf_counter() - started - dataset_s
    model = build(spec["model"]["name"])
    report.phase(dataset_s=dataset_s, sample_s=sample_s, model_s=time.perf_counter() - started - dataset_s - sample_s)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)

    step = 0
    resume = None if smoke is not None else newest_checkpoint(run_dir)  # a smoke always starts fresh
    if resume is not None:
        model.load_state_dict(torch.load(resume / "model.pt", weights_only=True))
        optimizer.load_state_dict(torch.load(resume / "optimizer.pt", weights_only=True))
        step = json.loads((resume / "trainer_state.json").read_text())["global_step"]
        print(f"resumed from {resume.name} at step {step}", flush=True)

    loader = DataLoader(dataset, batch_sampler=StepBatches(len(dataset), batch, args.seed, step),
                        num_workers=args.dataloader_num_workers,
                        persistent_workers=args.dataloader_num_workers > 0)
    batches = iter(loader)
    while step < total and not _stop:
        started = time.perf_counter()
        sample = next(batches)
        loss = torch.nn.functional.mse_loss(model(sample["hidden"]), sample["actions"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        report.step(step, loss.item(), time.perf_counter() - started, total=total)
        if step % args.save_steps == 0 or (smoke is not None and step == total):
            save_checkpoint(run_dir, step, model, optimizer, report)
    if _stop:
        save_checkpoint(run_dir, step, model, optimizer, report)
        print(f"stop signal received ({_stop[0]}): checkpoint-{step} written, exiting {contract.EXIT_REQUEUE}",
              flush=True)
        report.finish("KILLED")  # a later attempt reopens the chain's run
        return contract.EXIT_REQUEUE
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

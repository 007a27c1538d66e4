"""The Fabric trainer for the layer-routed DiT, in litgpt's shape: setup → fit → validate.

Entry point: ``python -m trainers.train --run-dir DIR`` with ``DIR/spec.json`` written by
:func:`write_run_spec`. One run directory is one chain of attempts:

- ``DIR/progress.json``: step / total and recent s/step for the ETA (``ground.progress``).
- ``DIR/checkpoints/step-<N>.ckpt/``: every ``train.checkpoint_every`` steps (or the derived interval), at the
  end, and on SIGUSR1/SIGTERM (Slurm's warning before preemption or the time limit), with a manifest
  (``trainers.checkpoint``); a new attempt resumes from the newest one that verifies and loads, and
  continues exactly as an uninterrupted run would (the data order
  is a function of (seed, epoch) and the flow noise of (seed, step, rank, micro-step)).
- after a signal: finish the current step, checkpoint, exit 75 (EX_TEMPFAIL) so the job requeues.
- a NaN/inf loss: no optimizer step, no checkpoint; ``DIR/failure.json`` = ``{"cause": "nan_loss",
  "step": N}``, ``IDMCTL_FAILURE cause=nan_loss step=N`` on stderr, exit 3.
  Test hook: ``IDMCTL_INJECT_NAN_AT_STEP=N`` makes step N's loss NaN.
- the one rollback after a NaN (``IDMCTL_ROLLBACK=1``, set by sync's resubmit): resume from the last
  good checkpoint, skip the batches up to the NaN step and reseed the flow noise.
- ``DIR/mlflow_run_id``: the one MLflow run all attempts log to (see ``trainers.tracking``).
- ``DIR/tracking_spool.jsonl``: every MLflow write, appended before a thread sends it, so the step loop never
  waits on the tracking server; what an outage kept from MLflow waits there (``ground.tracking_spool``).

Only rank 0 logs, evaluates and writes files. Under ``srun`` Fabric takes ranks from Slurm
(``--ntasks-per-node`` must equal the devices); under ``fabric run`` (LT_CLI_USED) it is already
launched; otherwise ``Fabric.launch()`` starts the local ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.startup import settled, starting

# A preemption notice (USR1) or a scancel (TERM) can arrive while torch is still importing — 6–9 s
# on a loaded node — and Python's default action for both is to die: no checkpoint, no requeue, the
# job ends FAILED 10:0 (seen on the shared test cluster). Until fit() installs the real handler,
# remember the signal; StopSignals honours one that came first.
EARLY_SIGNALS: list[int] = []
if __name__ == "__main__":
    starting()  # before torch: its import is most of a trainer's start
    for _sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(_sig, lambda signum, _frame: EARLY_SIGNALS.append(signum))

import numpy as np  # noqa: E402  (after the early signal handlers, on purpose)
import torch  # noqa: E402

from ground.code_snapshot import code_version, refuse_unadmitted_code
from ground.errors import UserError
from ground.paths import atomic_write_text, sweep_dead_temp_files
from ground.spec.schema import ExperimentSpec
from ground.run_events import START, append_event
from ground.tracking import best_metric
from trainers.checkpoint import Retention, checkpoint_bytes, checkpoint_dir, resume, save_checkpoint
from ground.contract import (CAUSE_NAN_LOSS, ENV_CACHE_ROOT, ENV_CHECKPOINT_EVERY, ENV_CODE_VERSION,
                             ENV_INJECT_NAN_AT_STEP, ENV_RANK_DIGESTS, ENV_ROLLBACK, EXIT_NAN, EXIT_REQUEUE,
                             FAILURE_FILE, FAILURE_MARKER)
from ground.heartbeat import beat
from ground.progress import WINDOW_STEPS, WRITE_EVERY_S
from ground.run_dir import RunSpec, read_run_spec, write_run_spec  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from lightning_fabric import Fabric
    from torch.utils.data import DataLoader

    from trainers.tracking import RunLogger

ROLLBACK_SEED_OFFSET = 1_000_003
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


# -- setup ---------------------------------------------------------------------------------------

def setup_fabric(spec: ExperimentSpec) -> "Fabric":
    """Devices, nodes, strategy and precision from the spec; bf16-mixed on GPU, 32-true on CPU."""
    from lightning_fabric import Fabric

    res = spec.resources
    on_gpu = res.gpus_per_node > 0
    if on_gpu and not torch.cuda.is_available():
        raise UserError(f"the spec asks for {res.gpus_per_node} GPUs per node but this machine has none",
                        field="resources.gpus_per_node", hint="run it on a GPU node, or set 0 for CPU ranks")
    precision = spec.train.precision if spec.train.precision != "auto" else ("bf16-mixed" if on_gpu else "32-true")
    return Fabric(accelerator="cuda" if on_gpu else "cpu", devices=res.ranks_per_node, num_nodes=res.nodes,
                  strategy="ddp" if res.world_size > 1 else "auto", precision=precision)


def launch(fabric: "Fabric") -> None:
    if not os.environ.get("LT_CLI_USED"):  # `fabric run` has launched us already; .launch() would raise
        fabric.launch()


def learning_rate(spec: ExperimentSpec, step: int) -> float:
    """Linear warm-up to ``train.lr``, then cosine decay to 10% of it at ``train.steps``."""
    train = spec.train
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    progress = (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps)
    return train.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def noise_generator(seed: int, step: int, rank: int, micro: int) -> torch.Generator:
    """Flow noise and t for one micro-batch: a pure function of where it is in the run."""
    state = int(np.random.SeedSequence([seed, step, rank, micro]).generate_state(1)[0])
    return torch.Generator().manual_seed(state)


def micro_batches(loader: "DataLoader", consumed: int) -> Iterator[dict[str, Any]]:
    """Endless micro-batches across epochs, starting after ``consumed`` of them (resume)."""
    from torch.utils.data import DataLoader

    per_epoch = len(loader)
    epoch, skip = divmod(consumed, per_epoch)
    while True:
        loader.sampler.set_epoch(epoch)
        if skip:
            # Skip by index, not by loading: rebuild this epoch's loader on the remaining indices.
            batch_size = loader.batch_size
            remaining = list(loader.sampler)[skip * batch_size:]
            yield from DataLoader(loader.dataset, sampler=remaining, worker_init_fn=loader.worker_init_fn,
                                  **_loader_kwargs(loader))
            skip = 0
        else:
            yield from loader
        epoch += 1


def _loader_kwargs(loader: "DataLoader") -> dict[str, Any]:
    kwargs: dict[str, Any] = {"batch_size": loader.batch_size, "num_workers": loader.num_workers,
                              "pin_memory": loader.pin_memory, "persistent_workers": loader.persistent_workers,
                              "collate_fn": loader.collate_fn}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return kwargs


class StopSignals:
    """Remembers SIGUSR1/SIGTERM; the loop checks between steps so a step is never cut in half."""

    def __init__(self) -> None:
        self.received: int | None = EARLY_SIGNALS[0] if EARLY_SIGNALS else None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.received = signum


def parameter_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's bytes, in name order: equal digests mean identical weights."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in sorted(_unwrap(model).named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return host_peak_rss_bytes()


def host_peak_rss_bytes() -> int:
    """This process's peak resident memory.

    ``/proc/self/status`` VmHWM belongs to this program's own address space. ``ru_maxrss`` is not
    usable: Linux carries it over fork and execve, so a smoke started by a 4 GB parent reported 4 GB.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


# -- fit -----------------------------------------------------------------------------------------

def fit(fabric: "Fabric", run: RunSpec) -> int:
    """Train to ``train.steps`` (resuming if a checkpoint exists); returns the process exit code."""
    from cache.batches import trainer_batches
    from cache.registry import build_dataloader, repeat_samples
    from trainers.registry import build_model

    spec, rank = run.spec, fabric.global_rank
    signals = StopSignals()  # from the start: a SIGTERM during setup still ends in a checkpoint
    if rank == 0:  # stage-in is over: from here on the GPUs work (the ledger splits lost hours here)
        append_event(run.run_dir, START)

    def fresh_state() -> dict[str, Any]:
        fabric.seed_everything(spec.train.seed)
        model = build_model(spec, device=fabric.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr, weight_decay=spec.train.weight_decay)
        model, optimizer = fabric.setup(model, optimizer)
        return {"model": model, "optimizer": optimizer, "step": 0, "best": {}}

    state = fresh_state()
    if rank == 0:  # one trainer per run directory at a time: temp files here are a killed attempt's
        sweep_dead_temp_files(run.run_dir)
        sweep_dead_temp_files(checkpoint_dir(run.run_dir))
    resumed = resume(fabric, run.run_dir, state, spec_hash=run.hash)
    resumed_from = resumed.path
    if resumed.state_touched and resumed_from is None:  # a refused load wrote into the model part-way
        state = fresh_state()
    model, optimizer = state["model"], state["optimizer"]
    fabric.print(f"{run.name} {run.hash[:12]}: world {fabric.world_size}, grad_accum {spec.grad_accum}, "
                 f"{'resumed from ' + resumed_from.name if resumed_from else 'fresh start'} at step {state['step']}")
    if state["step"] >= spec.train.steps:
        fabric.print(f"already complete at step {state['step']}")
        return 0

    loader = build_dataloader(spec, "train", shuffle=True, seed=spec.train.seed, rank=rank,
                              world_size=fabric.world_size, cache_root=os.environ.get(ENV_CACHE_ROOT))
    if len(loader) == 0:
        raise UserError("the training split yields no batches", field="data.train_split",
                        hint="add demos or lower loader.batch_size")
    evaluators = _build_evaluators(fabric, spec)
    logger = _open_logger(fabric, run)  # after every check that can refuse the spec: no orphan MLflow runs
    if logger:
        logger.start_attempt(state["step"])
    consumed, noise_seed = state["step"] * spec.grad_accum, spec.train.seed
    nan_step = _rollback_past(fabric, run, state["step"])
    if nan_step is not None:
        # The resubmit after a NaN (at most once per chain): skip the batches up to the bad step and
        # draw other flow noise, so the same data and noise cannot produce the same NaN again.
        consumed += (nan_step - state["step"]) * spec.grad_accum
        noise_seed = spec.train.seed + ROLLBACK_SEED_OFFSET
    # num_workers 0: batches read straight into pinned buffers, prefetched while the step computes (cache.batches).
    batches = trainer_batches(loader, consumed, fabric.device) or micro_batches(loader, consumed)
    checkpoint_every = checkpoint_interval(spec)
    retention = Retention.of(spec)
    progress = _ProgressWriter(run, state["step"]) if rank == 0 else None
    # The hook stands for a transient NaN: a rolled-back attempt does not see it again.
    inject_nan_at = 0 if nan_step is not None else int(os.environ.get(ENV_INJECT_NAN_AT_STEP, "0"))
    window = _Window()
    totals = _StatsKeeper(run.run_dir, fabric.device) if rank == 0 else None
    settled()

    while state["step"] < spec.train.steps:
        step = state["step"] + 1
        started = time.perf_counter()
        loss_sum = torch.zeros((), device=fabric.device)
        for micro in range(spec.grad_accum):
            waited = time.perf_counter()
            batch = next(batches)
            window.data_wait_s += time.perf_counter() - waited
            hidden, actions, mask = (repeat_samples(fabric.to_device(batch[k]), spec.loader.repeats)
                                     for k in ("hidden", "actions", "action_mask"))
            with fabric.no_backward_sync(model, enabled=micro < spec.grad_accum - 1):
                loss = model(hidden, actions, mask, generator=noise_generator(noise_seed, step, rank, micro))
                if step == inject_nan_at:
                    loss = loss * float("nan")
                fabric.backward(loss / spec.grad_accum)
            loss_sum += loss.detach()
        # One collective per step: the mean loss over ranks (NaN anywhere → NaN) and any stop request.
        stats = torch.stack([loss_sum / spec.grad_accum, torch.tensor(float(signals.received is not None),
                                                                      device=fabric.device)])
        stats = fabric.all_reduce(stats, reduce_op="sum") if fabric.world_size > 1 else stats
        step_loss, stop = float(stats[0]) / fabric.world_size, bool(stats[1] > 0)
        if not math.isfinite(step_loss):
            return _fail_nan(fabric, run, logger, step, step_loss)
        lr = learning_rate(spec, step - 1)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] = step
        window.add(step_loss, time.perf_counter() - started)
        logged = step % spec.train.log_every == 0 or step == spec.train.steps or stop
        if progress:
            progress.step_done(step, time.perf_counter() - started, force=logged)
            beat(run.run_dir)  # the heartbeat the hang watchdog reads: progress.json's mtime, every step

        if logged:
            _log_window(fabric, logger, spec, step, lr, window)
            if totals:
                totals.record(window)
            window = _Window()
        evaluated: dict[str, float] = {}
        if step % checkpoint_every == 0 or step == spec.train.steps:
            evaluated = validate(fabric, model, evaluators, spec, state, logger, step, heartbeat_dir=run.run_dir)
        if step % checkpoint_every == 0 or step == spec.train.steps or stop:
            writing = time.perf_counter()
            saved = save_checkpoint(fabric, run.run_dir, step, state, spec_hash=run.hash,
                                    code_version=progress.version if progress else None, metrics=evaluated,
                                    retention=retention)
            if progress:
                progress.checkpoint_written(step, time.perf_counter() - writing, saved)
        if stop and step < spec.train.steps:
            fabric.print(f"stop signal received: checkpointed step {step}, exiting {EXIT_REQUEUE} to requeue")
            if logger:
                logger.finish("KILLED")
            return EXIT_REQUEUE

    if os.environ.get(ENV_RANK_DIGESTS):
        atomic_write_text(run.run_dir / "rank_digests" / f"rank-{rank}.sha256", parameter_digest(model) + "\n")
    if logger:
        logger.log_metrics({best_metric(k): v for k, v in state["best"].items()}, step=state["step"])
        logger.finish("FINISHED")
    fabric.print(f"done: step {state['step']}" + "".join(f", {k} {v:.2f}" for k, v in state["best"].items()))
    return 0


def checkpoint_interval(spec: ExperimentSpec) -> int:
    """Steps between checkpoints: the spec's value wins; else the one derived at submit from measured
    step and write times (``IDMCTL_CHECKPOINT_EVERY``); else a tenth of the run."""
    if spec.train.checkpoint_every is not None:
        return spec.train.checkpoint_every
    derived = os.environ.get(ENV_CHECKPOINT_EVERY, "")
    return int(derived) if derived.isdigit() and int(derived) > 0 else max(1, spec.train.steps // 10)


class _ProgressWriter:
    """Rank 0's ``progress.json``: step / total and the mean s/step of the last ``WINDOW_STEPS`` steps,
    written atomically at every log line and checkpoint and at least every ``WRITE_EVERY_S``."""

    def __init__(self, run: RunSpec, start_step: int):
        from collections import deque

        from ground.progress import timing_key

        self.run, self.start_step = run, start_step
        self.started_at = self.written_at = time.time()
        self.durations: "deque[float]" = deque(maxlen=WINDOW_STEPS)
        self.version = os.environ.get(ENV_CODE_VERSION) or code_version()
        self.key = timing_key(run.spec)
        self.checkpoint_s: float | None = None
        self.checkpoint_bytes: int | None = None
        self.step = start_step
        self._write()

    def step_done(self, step: int, seconds: float, force: bool = False) -> None:
        self.step = step
        self.durations.append(seconds)
        if force or time.time() - self.written_at >= WRITE_EVERY_S:
            self._write()

    def checkpoint_written(self, step: int, seconds: float, path: Path | None) -> None:
        self.checkpoint_s = seconds
        try:
            self.checkpoint_bytes = checkpoint_bytes(path) if path is not None else None
        except OSError:
            self.checkpoint_bytes = None
        self.step = step
        self._write()

    def _write(self) -> None:
        from ground.progress import Progress, write_progress

        window = sum(self.durations) / len(self.durations) if self.durations else None
        self.written_at = time.time()
        write_progress(self.run.run_dir, Progress(
            step=self.step, total=self.run.spec.train.steps, window_s_per_step=window, window_steps=len(self.durations),
            attempt_start_step=self.start_step, attempt_started_at=self.started_at, updated_at=self.written_at,
            spec_hash=self.run.hash, code_version=self.version, timing_key=self.key,
            checkpoint_write_s=self.checkpoint_s, checkpoint_bytes=self.checkpoint_bytes))


@dataclass
class _Window:
    """Sums over the steps since the last log line."""

    steps: int = 0
    loss: float = 0.0
    seconds: float = 0.0
    data_wait_s: float = 0.0

    def add(self, loss: float, seconds: float) -> None:
        self.steps, self.loss, self.seconds = self.steps + 1, self.loss + loss, self.seconds + seconds


class _StatsKeeper:
    """Rank 0's totals for this run of the attempt (``ground.trainer_stats``), written at each log line:
    the trainer's half of the job's efficiency report (data-wait fraction, peak memory, GPU utilisation)."""

    def __init__(self, run_dir: Path, device: torch.device) -> None:
        from ground.contract import ENV_ATTEMPT
        from ground.trainer_stats import RunStats, run_key

        self.run_dir, self.device = run_dir, device
        self.key = run_key(os.environ.get(ENV_ATTEMPT, "1"), os.environ.get("SLURM_RESTART_COUNT", "0"))
        self.stats = RunStats(device=device.type)

    def record(self, window: "_Window") -> None:
        from ground.trainer_stats import write_run

        stats = self.stats
        stats.steps += window.steps
        stats.step_s += window.seconds
        stats.data_wait_s += window.data_wait_s
        stats.peak_mem_bytes = max(stats.peak_mem_bytes, peak_memory_bytes(self.device))
        stats.host_peak_rss_bytes = max(stats.host_peak_rss_bytes, host_peak_rss_bytes())
        if self.device.type == "cuda":
            try:  # NVML through torch; absent NVML leaves utilisation unmeasured, never fails the run
                stats.gpu_util_sum += float(torch.cuda.utilization(self.device))
                stats.gpu_util_samples += 1
            except Exception:  # noqa: BLE001 (pynvml missing or the driver refuses: no number)
                pass
        write_run(self.run_dir, self.key, stats)


def _log_window(fabric: "Fabric", logger: "RunLogger | None", spec: ExperimentSpec, step: int, lr: float,
                window: _Window) -> None:
    from ground import tracking as names

    step_time = window.seconds / max(1, window.steps)
    metrics = {
        names.M_LOSS: window.loss / max(1, window.steps),
        names.M_LR: lr,
        names.M_STEP_TIME: step_time,
        names.M_SAMPLES_PER_S: spec.train.effective_batch / step_time if step_time > 0 else 0.0,
        names.M_DATA_WAIT: window.data_wait_s / window.seconds if window.seconds > 0 else 0.0,
        names.M_PEAK_MEM: float(peak_memory_bytes(fabric.device)),
    }
    fabric.print(f"step {step}/{spec.train.steps} loss {metrics[names.M_LOSS]:.4f} lr {lr:.2e} "
                 f"{step_time:.3f} s/step {metrics[names.M_SAMPLES_PER_S]:.1f} samples/s "
                 f"data-wait {100 * metrics[names.M_DATA_WAIT]:.1f}% peak {metrics[names.M_PEAK_MEM] / 1e6:.0f} MB",
                 flush=True)
    if logger:
        logger.log_metrics(metrics, step)


# -- validate ------------------------------------------------------------------------------------

def validate(fabric: "Fabric", model: torch.nn.Module, evaluators: list[Any], spec: ExperimentSpec,
             state: dict[str, Any], logger: "RunLogger | None", step: int,
             heartbeat_dir: Path | None = None) -> dict[str, float]:
    """Rank 0 scores the model on held-out episodes; other ranks wait at the checkpoint barrier. Each
    evaluator that finishes moves the heartbeat (``heartbeat_dir``): an evaluation is work, not a hang."""
    if fabric.global_rank != 0 or not evaluators:
        return {}
    from trainers.evaluate import ChunkPolicy

    policy = ChunkPolicy(_unwrap(model), fabric.device, seed=spec.train.seed)
    results: dict[str, float] = {}
    for evaluator in evaluators:
        results.update(evaluator.evaluate(policy, list(spec.eval.episodes)))
        if heartbeat_dir is not None:
            beat(heartbeat_dir)
        if logger:
            for metric, episodes in getattr(evaluator, "last_episodes", {}).items():
                logger.log_episodes(metric, step, evaluator.last_protocols[metric].to_json(), episodes)
    for name, value in results.items():
        state["best"][name] = min(value, state["best"].get(name, math.inf))
    fabric.print(f"eval at step {step}: " + ", ".join(f"{k} {v:.2f} mm" for k, v in results.items()))
    if logger:
        logger.log_metrics({**results, **{best_metric(k): v for k, v in state["best"].items()}}, step)
    return results


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "module", model)  # Fabric's wrapper → (DDP →) the model
    return getattr(inner, "module", inner)


def _build_evaluators(fabric: "Fabric", spec: ExperimentSpec) -> list[Any]:
    if fabric.global_rank != 0:
        return []
    from trainers.evaluate import build_evaluators

    return build_evaluators(spec, fabric.device)


def _open_logger(fabric: "Fabric", run: RunSpec) -> "RunLogger | None":
    if fabric.global_rank != 0:
        return None
    from trainers.tracking import RunLogger

    version = os.environ.get(ENV_CODE_VERSION) or code_version()
    return RunLogger(run.run_dir, run.name, run.hash, run.canonical, version)


def _rollback_past(fabric: "Fabric", run: RunSpec, resumed_step: int) -> int | None:
    """The NaN step to roll back past, when this attempt is the chain's rollback (``IDMCTL_ROLLBACK=1``)."""
    marker = run.run_dir / FAILURE_FILE
    if os.environ.get(ENV_ROLLBACK) != "1" or not marker.exists():
        return None
    failure = json.loads(marker.read_text())
    if failure.get("cause") != CAUSE_NAN_LOSS or int(failure.get("step", 0)) <= resumed_step:
        return None
    nan_step = int(failure["step"])
    fabric.print(f"rollback: resumed at step {resumed_step}, skipping the batches of steps "
                 f"{resumed_step + 1}..{nan_step} and reseeding the flow noise (NaN was at step {nan_step})")
    return nan_step


def _fail_nan(fabric: "Fabric", run: RunSpec, logger: "RunLogger | None", step: int, loss: float) -> int:
    if fabric.global_rank == 0:
        atomic_write_text(run.run_dir / FAILURE_FILE, json.dumps({"cause": CAUSE_NAN_LOSS, "step": step}) + "\n")
        print(f"{FAILURE_MARKER} cause={CAUSE_NAN_LOSS} step={step}", file=sys.stderr, flush=True)
        fabric.print(f"loss is {loss} at step {step}: stopped without an optimizer step or checkpoint")
        if logger:
            from ground.tracking import TAG_FAILURE_CAUSE

            logger.set_tag(TAG_FAILURE_CAUSE, CAUSE_NAN_LOSS)
            logger.finish("FAILED")
    return EXIT_NAN


# -- entry point ---------------------------------------------------------------------------------

def dump_stacks_on_signal() -> None:
    """Every thread's Python stack to stderr (the job log) on ``STACKS_SIGNAL``: what the hang watchdog
    records from every rank before it kills a hung job. faulthandler writes from C, so a rank stuck in a
    lock or a collective still answers."""
    import faulthandler

    from ground.contract import STACKS_SIGNAL

    faulthandler.register(getattr(signal, f"SIG{STACKS_SIGNAL}"), all_threads=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainers.train", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="Directory with spec.json; receives checkpoints.")
    args = parser.parse_args(argv)
    dump_stacks_on_signal()
    if (refused := refuse_unadmitted_code()) is not None:
        return refused
    try:
        run = read_run_spec(args.run_dir)
        if run.spec.resources.gpus_per_node == 0:
            torch.set_num_threads(1)  # CPU ranks share few cores; more threads only contend
        fabric = setup_fabric(run.spec)
        launch(fabric)
        return fit(fabric, run)
    except UserError as exc:
        print(exc.line(), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

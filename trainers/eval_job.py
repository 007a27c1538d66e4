"""An evaluation job's entry: score one checkpoint of a training chain and log it into the chain's run.

``python -m trainers.eval_job --run-dir DIR --step N``: ``DIR`` is the training chain's run directory
(``spec.json``, ``checkpoints/``, ``mlflow_run_id``). The job resumes nothing and writes no checkpoint:
it verifies ``checkpoints/step-N.ckpt`` against its manifest, loads the model weights alone, runs the
spec's evaluations (the same evaluators, episodes and seed the trainer's own evaluation uses) and logs
each metric and its per-episode artifact at step N under its protocol into the chain's one MLflow run,
which it reopens without touching its status (the training attempts own that).

Exit 0 when every evaluation was logged, 2 for bad input (no such checkpoint, no MLflow run yet), and
``EXIT_REQUEUE`` at once on USR1 (the notice Slurm sends before a preemption or the time limit): an evaluation
has nothing to save, so the job script requeues it and the rerun scores the checkpoint from the start. Left to
USR1's default action the process died with 138, the job ended FAILED, Slurm never requeued it (a job that
exits by itself during its grace time is not requeued) and the checkpoint went unscored.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ground import tracking as names
from ground.contract import EXIT_REQUEUE
from ground.code_snapshot import refuse_unadmitted_code
from ground.errors import UserError
from ground.run_dir import RunSpec, read_run_spec
from ground.startup import settled, starting
from trainers.checkpoint import checkpoint_path, complete_checkpoints, state_file, verify

if TYPE_CHECKING:
    import torch


def load_weights(run: RunSpec, step: int, device: torch.device) -> torch.nn.Module:
    """The model as checkpoint ``step`` holds it (verified against its manifest and the run's spec hash)."""
    from lightning_fabric import Fabric

    from trainers.registry import build_model

    path = checkpoint_path(run.run_dir, step)
    if not path.exists():
        have = ", ".join(str(s) for s, _ in complete_checkpoints(run.run_dir)) or "none"
        raise UserError(f"no checkpoint at step {step} (checkpoints present: {have})", file=str(path),
                        hint="the training attempt that writes it has not, or retention (train.keep_last) pruned it")
    problem = verify(path, step=step, spec_hash=run.hash)
    if problem is not None:
        raise UserError(f"checkpoint step {step} does not verify: {problem}", file=str(path),
                        hint="evaluate another step; this one was not written whole")
    model = build_model(run.spec, device=device)
    fabric = Fabric(accelerator="cuda" if device.type == "cuda" else "cpu", devices=1)
    fabric.load(state_file(path), {"model": model}, strict=False)  # the weights only: optimizer and counters stay
    return model


def evaluate(run: RunSpec, step: int) -> dict[str, float]:
    """Every evaluation of the spec on checkpoint ``step``, logged at that step; returns metric → mm."""
    import torch  # after main's USR1 handler: a notice during this import requeues, it does not kill

    from trainers.evaluate import ChunkPolicy, build_evaluators
    from trainers.tracking import RunLogger

    spec = run.spec
    device = torch.device("cuda" if spec.resources.gpus_per_node > 0 and torch.cuda.is_available() else "cpu")
    logger = RunLogger.attach(run.run_dir)  # before the work: a chain with no run has nowhere to log
    model = load_weights(run, step, device)
    policy = ChunkPolicy(model, device, seed=spec.train.seed)
    settled()  # the model and the MLflow run are loaded: the evaluation itself follows
    results: dict[str, float] = {}
    for evaluator in build_evaluators(spec, device):
        results.update(evaluator.evaluate(policy, list(spec.eval.episodes)))
        for metric, episodes in evaluator.last_episodes.items():
            logger.log_episodes(metric, step, evaluator.last_protocols[metric].to_json(), episodes)
    logger.log_metrics(results, step)
    logger.set_tag(names.eval_job_tag(step), os.environ.get("SLURM_JOB_ID") or f"local pid {os.getpid()}")
    return results


def requeue_on_notice(signum: int, _frame: object) -> None:
    """USR1: exit ``EXIT_REQUEUE`` now; nothing is half-written that a rerun would trust (metrics logged so
    far are logged again at the same step, the per-episode artifact is replaced)."""
    print(f"eval job: {signal.Signals(signum).name} received: exiting {EXIT_REQUEUE} to be requeued "
          "(an evaluation resumes nothing: the rerun scores the checkpoint from the start)", flush=True)
    os._exit(EXIT_REQUEUE)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGUSR1, requeue_on_notice)
    parser = argparse.ArgumentParser(prog="python -m trainers.eval_job", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="The training chain's run directory.")
    parser.add_argument("--step", required=True, type=int, help="The checkpoint's step.")
    args = parser.parse_args(argv)
    if (refused := refuse_unadmitted_code()) is not None:
        return refused
    print(f"eval job: step {args.step} of {args.run_dir}: starting (USR1 requeues it)", flush=True)
    try:
        run = read_run_spec(args.run_dir)
        if run.spec.resources.gpus_per_node == 0:
            import torch  # the handler is in place: see evaluate

            torch.set_num_threads(1)
        results = evaluate(run, args.step)
    except UserError as exc:
        print(exc.line(), file=sys.stderr)
        return 2
    print(f"eval job: step {args.step}: " + ", ".join(f"{k} {v:.2f} mm" for k, v in results.items()), flush=True)
    return 0


if __name__ == "__main__":
    starting()  # before torch, Fabric and MLflow: their imports are most of an evaluation's start
    sys.exit(main())

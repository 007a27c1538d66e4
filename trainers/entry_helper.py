"""For a team's own entry (``code.entry``): the contract's reports in three calls, and the chain's MLflow run.

The contract itself is plain (``ground.contract``): the run directory in ``IDMCTL_RUN_DIR``, one stdout
line per optimizer step (``IDMCTL_STEP step=3 loss=1.14 seconds=0.52``), exit 75 after checkpointing on
SIGUSR1/SIGTERM, resume from the newest checkpoint. An entry may print those lines itself; this module
also keeps the heartbeat the hang watchdog and ``idmctl jobs`` read, and logs the metrics into the chain's
MLflow run when the entry runs as a job (not in the preflight's smoke)::

    from trainers.entry_helper import Reporter
    report = Reporter.from_env()
    report.phase(dataset_s=0.4, model_s=1.2)
    for step in range(start, total):
        ...
        report.step(step + 1, loss.item(), seconds, total=total)
    report.finish()
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

from ground import contract
from ground.heartbeat import beat
from ground.progress import WINDOW_STEPS, WRITE_EVERY_S


def smoke_steps() -> int | None:
    """``IDMCTL_SMOKE_STEPS`` as an int: the preflight's smoke is asking for that many steps."""
    value = os.environ.get(contract.ENV_SMOKE_STEPS)
    return int(value) if value else None


def smoke_batch(default: int) -> int:
    value = os.environ.get(contract.ENV_SMOKE_BATCH)
    return int(value) if value else default


def _fields(**values: Any) -> str:
    return " ".join(f"{key}={value:.6g}" if isinstance(value, float) else f"{key}={value}"
                    for key, value in values.items() if value is not None)


class Reporter:
    """Rank 0's reports: the contract's lines on stdout, ``progress.json``, and (in a job) MLflow metrics."""

    def __init__(self, run_dir: Path, spec: dict[str, Any] | None = None, log_to_mlflow: bool = True):
        self.run_dir = Path(run_dir)
        self.spec = spec
        self.started = time.time()
        self.window: list[float] = []
        self.first_step: int | None = None
        self.written_at = 0.0
        self.log_every = int(((spec or {}).get("spec") or {}).get("train", {}).get("log_every") or 1)
        self.logger = None
        if log_to_mlflow and spec is not None and smoke_steps() is None and os.environ.get(contract.ENV_HOME):
            from trainers.tracking import RunLogger

            version = os.environ.get(contract.ENV_CODE_VERSION) or "unknown"
            self.logger = RunLogger(self.run_dir, spec["name"], spec["hash"], spec["spec"], version)

    @classmethod
    def from_env(cls, log_to_mlflow: bool = True) -> "Reporter":
        """The run directory from ``IDMCTL_RUN_DIR`` (the job script and the smoke set it)."""
        run_dir = Path(os.environ[contract.ENV_RUN_DIR])
        try:
            spec = json.loads((run_dir / contract.SPEC_FILE).read_text())
        except (OSError, ValueError):
            spec = None
        return cls(run_dir, spec, log_to_mlflow)

    def phase(self, **seconds: float) -> None:
        print(f"{contract.PHASE_MARKER} {_fields(**seconds)}", flush=True)

    def step(self, step: int, loss: float, seconds: float, total: int | None = None, **metrics: float) -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        print(f"{contract.STEP_MARKER} {_fields(step=step, loss=float(loss), seconds=float(seconds), peak_mem_bytes=peak)}",
              flush=True)
        self.window = (self.window + [float(seconds)])[-WINDOW_STEPS:]
        if total is not None:
            # As idmctl's trainer: the file at most every WRITE_EVERY_S (and at the first and last step),
            # the heartbeat's mtime after every step (one utime, no write).
            if step == total or self.first_step is None or time.time() - self.written_at >= WRITE_EVERY_S:
                self._progress(step, total)
            else:
                beat(self.run_dir)
        if self.logger is not None and (step % self.log_every == 0 or step == total):  # train.log_every
            self.logger.log_metrics({"loss": float(loss), **metrics}, step)

    def checkpoint(self, seconds: float, size_bytes: int) -> None:
        print(f"{contract.CHECKPOINT_MARKER} {_fields(seconds=float(seconds), bytes=int(size_bytes))}", flush=True)

    def _progress(self, step: int, total: int) -> None:
        """The heartbeat the hang watchdog and ``idmctl jobs``' ETA read (``ground.progress``)."""
        from ground.progress import Progress, timing_key, write_progress
        from ground.spec.schema import ExperimentSpec

        self.written_at = time.time()
        if self.first_step is None:
            self.first_step = step - 1
        spec = self.spec or {}
        key = timing_key(ExperimentSpec.model_validate(spec["spec"])) if "spec" in spec else "unknown"
        write_progress(self.run_dir, Progress(
            step=step, total=total, window_s_per_step=sum(self.window) / len(self.window) if self.window else None,
            window_steps=len(self.window), attempt_start_step=self.first_step, attempt_started_at=self.started,
            updated_at=time.time(), spec_hash=spec.get("hash", "unknown"),
            code_version=os.environ.get(contract.ENV_CODE_VERSION, "unknown"), timing_key=key))

    def finish(self, status: str = "FINISHED") -> None:
        if self.logger is not None:
            self.logger.finish(status)

"""MLflow logging for one training chain: every attempt (Slurm requeue) logs to ONE run.

The run id lives in ``<run_dir>/mlflow_run_id``: the first write to reach MLflow creates the run and
writes it (atomically); later attempts reopen it. Names come from :mod:`ground.tracking`. Only rank 0 logs.

Training never waits on the tracking server: every write is a line appended to the run directory's
spool (``ground.tracking_spool``, tens of microseconds) and a daemon thread ships the spool to MLflow.
When the server does not answer, the job log says so once, the lines wait in order, and they go
when it answers again (this process, a later attempt, or the control plane's ``flush_spool``).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ground import tracking as names
from ground import tracking_spool as spool
from ground.contract import ENV_ATTEMPT, ENV_CHAIN_ID, MLFLOW_RUN_ID_FILE
from ground.errors import UserError
from ground.paths import mlflow_artifacts_dir, mlflow_tracking_uri
from ground.redact import redacted
from ground.spec.schema import Goal

_MAX_PARAM_CHARS = 6000
"""MLflow's limit on one param value."""


def attempt_tags(env: dict[str, str] | None = None) -> dict[str, str]:
    """Tags that change per attempt: Slurm job id, restart count, attempt number."""
    env = dict(os.environ) if env is None else env
    tags = {}
    if env.get("SLURM_JOB_ID"):
        tags[names.TAG_SLURM_JOB] = env["SLURM_JOB_ID"]
    if env.get("SLURM_RESTART_COUNT"):
        tags[names.TAG_SLURM_RESTARTS] = env["SLURM_RESTART_COUNT"]
    if env.get(ENV_ATTEMPT):
        tags[names.TAG_ATTEMPT] = env[ENV_ATTEMPT]
    elif env.get("SLURM_RESTART_COUNT"):
        tags[names.TAG_ATTEMPT] = str(int(env["SLURM_RESTART_COUNT"]) + 1)
    return tags


def chain_id(env: dict[str, str] | None = None) -> int | None:
    value = (os.environ if env is None else env).get(ENV_CHAIN_ID)
    return int(value) if value else None


class _Shipper(threading.Thread):
    """Ships the spool to MLflow: at once when woken after an append, every ``backoff`` seconds (1, 2, 4 … 30)
    while the server does not answer. Says so in the job log once per outage, and once when it is over."""

    BACKOFF_MAX_S = 30.0

    def __init__(self, run_dir: Path, client: Any):
        super().__init__(name="idmctl-tracking", daemon=True)
        self.run_dir = run_dir
        self.wake = threading.Event()
        self.closing = False
        self.backoff: float | None = None
        """None while the server answers; seconds to the next try during an outage."""
        self.last: spool.FlushResult | None = None
        self._client = client

    def run(self) -> None:
        while True:
            self.wake.wait(self.backoff)
            self.wake.clear()
            closing = self.closing
            self._flush()
            if closing:
                return

    def _flush(self) -> None:
        try:
            if self._client is None:
                self._client = spool.open_client()
            result = spool.flush_spool(self.run_dir, client=self._client)
        except Exception as exc:  # noqa: BLE001 (opening the store failed: an outage like any other)
            result = spool.FlushResult(pending=spool.Spool(self.run_dir).pending_records(), error=str(exc))
        self.last = result
        if result.error is None:
            if self.backoff is not None:
                _say(f"tracking server answers again: {result.sent} spooled records sent to MLflow")
            self.backoff = None
        else:
            if self.backoff is None:
                _say(f"tracking server unreachable ({redacted(mlflow_tracking_uri())}: {result.error}): "
                     f"spooling to {spool.Spool(self.run_dir).path}; training goes on, the spool "
                     "is sent when the server answers")
            self.backoff = min(self.BACKOFF_MAX_S, 2 * self.backoff if self.backoff else 1.0)


def _say(line: str) -> None:
    print(f"idmctl: {line}", file=sys.stderr, flush=True)


class RunLogger:
    """Rank 0's handle on the chain's MLflow run: every method appends to the spool and returns."""

    CLOSE_WAIT_S = 2 * spool.HTTP_TIMEOUT_S + 2
    """How long closing waits for the last send: a request in flight and the final one timing out, and a
    margin; what is still spooled then stays for the next flusher."""
    STOP_WAIT_S = 2.0
    """The wait when the job stops early (``KILLED``: preempted, requeued): inside any grace time, and the
    next attempt sends what is left."""

    def __init__(self, run_dir: Path, name: str, spec_hash: str, canonical: dict[str, Any], code_version: str):
        self.run_dir = Path(run_dir)
        self.spool = spool.Spool(self.run_dir)
        self.resumed = (self.run_dir / MLFLOW_RUN_ID_FILE).exists()
        records: list[dict[str, Any]] = []
        if self.resumed:
            records.append(spool.status_record("RUNNING"))
        else:
            records.append(self._create_record(name, spec_hash, canonical))
        records.append(spool.tags_record({names.TAG_CODE_VERSION: code_version, **attempt_tags()}))
        self._start(records)

    @classmethod
    def attach(cls, run_dir: Path) -> "RunLogger":
        """The chain's existing run, reopened to add results (an evaluation job): its status, attempt tags
        and start points are the training attempts' and stay as they are."""
        id_file = Path(run_dir) / MLFLOW_RUN_ID_FILE
        if not id_file.exists() and not spool.Spool(Path(run_dir)).pending_records():
            raise UserError("the chain has no MLflow run yet: no training attempt has started", file=str(id_file),
                            hint="an evaluation job runs after the training attempt that writes its checkpoint")
        logger = cls.__new__(cls)
        logger.run_dir, logger.spool, logger.resumed = Path(run_dir), spool.Spool(Path(run_dir)), True
        logger._start([])
        return logger

    def _start(self, records: list[dict[str, Any]]) -> None:
        self._closed = False
        # MLflow is imported and its client made here, in the main thread: a DataLoader worker forked
        # while the shipping thread held an import lock would deadlock on its first import.
        try:
            client = spool.open_client()
        except Exception:  # noqa: BLE001 (the store cannot be opened now: the shipper retries)
            client = None
        self._shipper = _Shipper(self.run_dir, client)
        self._write(*records)  # before the thread starts: the first flush sends them, and earlier attempts' lines
        self._shipper.start()
        self._shipper.wake.set()
        atexit.register(self.close)

    @property
    def run_id(self) -> str | None:
        """The run's id once its creation reached MLflow (None before)."""
        id_file = self.run_dir / MLFLOW_RUN_ID_FILE
        return id_file.read_text().strip() if id_file.exists() else None

    def _create_record(self, name: str, spec_hash: str, canonical: dict[str, Any]) -> dict[str, Any]:
        """The run as the first attempt creates it: tags, the flattened spec as params, and the chart and
        goal views of the ``idmctl`` experiment charting this spec's metrics."""
        tags = {
            names.TAG_EXPERIMENT: name, names.TAG_SPEC_HASH: spec_hash,
            names.TAG_ROUTING_N: str(len(canonical["data"]["selected_layer_indices"])),
            names.TAG_QOS: str(canonical["resources"]["qos"]),
        }
        chain = chain_id()
        if chain is not None:
            tags[names.TAG_CHAIN] = str(chain)
        evaluation = canonical.get("eval") or {}
        episodes = [int(n) for n in evaluation.get("episodes") or []]
        keys = [names.eef_metric(n) for n in episodes] + [names.M_LOSS]
        if evaluation.get("simulator"):
            keys += [names.eef_metric(n, simulator=True) for n in episodes]
        goal = None
        if canonical.get("goal"):
            parsed = Goal.parse(str(canonical["goal"]))
            goal = (str(parsed), parsed.metric)
        params = [(key, str(value)[:_MAX_PARAM_CHARS]) for key, value in sorted(names.flatten(canonical).items())]
        return spool.create_record(name, names.run_name(name, chain), tags, params,
                                   mlflow_artifacts_dir().as_uri(), keys, goal)

    def _write(self, *records: dict[str, Any]) -> None:
        dropped = self.spool.append(*records)
        if dropped and self.spool.facts().dropped_records == dropped:
            _say(f"tracking spool {self.spool.path} is full ({spool.max_bytes()} bytes): newer metrics are "
                 f"dropped and counted in {self.spool.facts_path.name} until the server takes the spooled ones")
        if self._shipper.backoff is None:  # during an outage the shipper keeps its own backoff
            self._shipper.wake.set()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._write(spool.metrics_record(metrics, step))

    def log_episodes(self, metric: str, step: int, protocol: dict[str, Any], episodes: list[tuple[str, float]]) -> None:
        """One evaluation's per-episode errors as a JSON artifact, and the protocol its metric is under as a tag."""
        document = {"metric": metric, "step": step, "protocol": protocol, "unit": "mm",
                    "episodes": [{"episode": name, "error_mm": float(value)} for name, value in episodes]}
        self._write(spool.dict_record(document, names.episodes_artifact(metric, step)),
                    spool.tags_record({names.protocol_tag(metric): str(protocol["name"])}))

    def start_attempt(self, start_step: int) -> None:
        """Record that an attempt starts training at ``start_step`` (its checkpoint; 0 when fresh), before
        it logs any point: readers drop the earlier attempts' points past it (ground.tracking.surviving)."""
        self._write(spool.attempt_start_record(start_step))

    def set_tag(self, key: str, value: str) -> None:
        self._write(spool.tags_record({key: value}))

    def finish(self, status: str) -> None:
        """``FINISHED``, ``FAILED`` or ``KILLED`` (preempted: a later attempt reopens the run); then :meth:`close`."""
        self._write(spool.status_record(status))
        self.close(self.STOP_WAIT_S if status == "KILLED" else None)

    def close(self, wait_s: float | None = None) -> spool.FlushResult | None:
        """Send what is spooled, waiting at most ``wait_s`` (:data:`CLOSE_WAIT_S`). Records still spooled
        after it are a recorded fact (``tracking_spool.json``'s ``unflushed_at``) and one job-log line, never
        an error: the next attempt or the control plane sends them."""
        if self._closed:
            return self._shipper.last
        self._closed = True
        self._shipper.closing = True
        self._shipper.wake.set()
        self._shipper.join(self.CLOSE_WAIT_S if wait_s is None else wait_s)
        pending = self.spool.pending_records()
        if pending:
            self.spool.update_facts(unflushed_at=spool.utc_now(), unflushed_records=pending)
            _say(f"{pending} tracking records stay spooled in {self.spool.path} (the tracking server did not take "
                 "them): the next attempt, the controller or `idmctl sync` sends them")
        return self._shipper.last

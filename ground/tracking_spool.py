"""The tracking spool: a run directory's MLflow writes, in order, on disk before they reach MLflow.

Training must never wait on, or die of, the tracking server (an MLflow outage used to end the job
FAILED). So the trainer's ``RunLogger`` (``trainers.tracking``) never calls MLflow from the step loop:
each write (the run's creation, its params, tags, metrics, status, attempt starts, small JSON
artifacts) is appended as one JSON line to ``<run_dir>/tracking_spool.jsonl``, and a thread ships
them to MLflow with :func:`flush_spool`. While the server answers the spool stays a few lines long;
while it does not, the lines wait there,
in the order they were written, and whoever flushes next sends them: the same process when the
server answers again, a later attempt of the chain (its logger flushes on start), or the control
plane (``flush_spool(run_dir)``, torch- and thread-free).

Facts, never failure causes, in ``<run_dir>/tracking_spool.json`` (:class:`SpoolFacts`): how far the
spool was sent, what was dropped because the spool was full, what MLflow refused, since when the
server does not answer, and whether a writer exited with records still spooled.

Bounded: :data:`MAX_BYTES` (64 MiB: a 15-day run logging 6 metrics every 10 steps at 1 step/s is
1,296,000 s / 10 = 129,600 records of ~370 B = 48 MB). When a metrics record would pass it, the record
is dropped, not an older one: what is spooled stays a gap-free prefix, in order, and the drop is
counted (records, points, first and last step). Control records (creation, status, tags, attempt
starts) are a few per attempt and are always kept.

Each send is at most once per record in the common case, at least once after a crash between a send
and the offset's write: MLflow drops an identical metric point, and a repeated tag or status is the
same write again.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ground.contract import (ENV_TRACKING_SPOOL_MAX_BYTES, MLFLOW_RUN_ID_FILE, TRACKING_SPOOL_FACTS,
                             TRACKING_SPOOL_FILE)
from ground.errors import one_line
from ground.paths import atomic_write_text, mlflow_tracking_uri
from ground.redact import redacted

MAX_BYTES = 64 * 1024 * 1024
"""The spool's size limit unless ``IDMCTL_TRACKING_SPOOL_MAX_BYTES`` sets another (arithmetic above)."""
HTTP_TIMEOUT_S = 10
"""A request to the tracking server that has not answered in 10 s is an outage (MLflow's default is 120 s,
with 7 retries backing off for minutes). Only the shipping thread and a job's last flush wait for it, never
the step loop. Not less: a 500-point batch took ~1.2 s on the local server with 2 busy cores (1,200 points
in 3 requests, 3.8 s), and a loaded server answering late is not an outage."""
HTTP_MAX_RETRIES = 0
"""The spool is the retry: a failed send stays spooled and is tried again with a backoff."""
METRICS_PER_BATCH = 500
"""Points per log_batch when a backlog is sent: half MLflow's limit (1,000), so one request stays well
inside :data:`HTTP_TIMEOUT_S` on a loaded server."""
PARAMS_PER_BATCH = 100
"""MLflow's log_batch limit on params."""
REFUSED_CODES = frozenset({"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST",
                           "INVALID_STATE", "BAD_REQUEST"})
"""MLflow error codes meaning "the server answered and will never take this record": it is skipped and
counted, so one bad record cannot hold the spool forever. Anything else (no answer, 5xx, a locked SQLite)
is an outage: the record stays and is retried."""
_APPEND_LOCK = ".tracking_spool.append.lock"
_FLUSH_LOCK = ".tracking_spool.flush.lock"


@dataclass
class SpoolFacts:
    """``tracking_spool.json``: the spool's record of itself."""

    sent_bytes: int = 0
    """Bytes of ``tracking_spool.jsonl`` already in MLflow (the next flush starts there)."""
    flushed_records: int = 0
    """Records sent to MLflow through the spool, over the run's life."""
    dropped_records: int = 0
    """Metrics records dropped because the spool was full."""
    dropped_points: int = 0
    """Metric points in those records."""
    dropped_steps: list[int] | None = None
    """The first and last step dropped."""
    refused_records: int = 0
    """Records MLflow answered with a refusal (:data:`REFUSED_CODES`): skipped."""
    last_refusal: str | None = None
    outage_since: str | None = None
    """UTC time of the first failed send of the current outage; None while the server answers."""
    last_error: str | None = None
    """The last failed send's error, one line."""
    unflushed_at: str | None = None
    """UTC time a writer exited with records still spooled; cleared when a later flush empties the spool."""
    unflushed_records: int = 0
    """How many records it left."""


@dataclass
class FlushResult:
    """What one :func:`flush_spool` did."""

    sent: int = 0
    """Records sent to MLflow by this call."""
    refused: int = 0
    """Records MLflow refused (skipped, counted in the facts)."""
    pending: int = 0
    """Records still spooled after the call."""
    error: str | None = None
    """Why the call stopped early (the server did not answer); None when the spool is empty."""


@dataclass
class SpoolStatus:
    """What ``jobs show`` says about a run's spool (:func:`spool_status`)."""

    pending_records: int
    facts: SpoolFacts = field(default_factory=SpoolFacts)

    def describe(self) -> str | None:
        """One line, or None when there is nothing to say (everything reached MLflow, nothing was lost)."""
        parts = []
        if self.pending_records:
            since = f" since {self.facts.outage_since}" if self.facts.outage_since else ""
            parts.append(f"{self.pending_records} records spooled, not yet in MLflow{since}")
        if self.facts.unflushed_at and self.pending_records:
            parts.append(f"a job exited with {self.facts.unflushed_records} unflushed at {self.facts.unflushed_at}")
        if self.facts.dropped_records:
            first, last = self.facts.dropped_steps or (None, None)
            parts.append(f"{self.facts.dropped_points} metric points dropped (spool full, steps {first}..{last})")
        if self.facts.refused_records:
            parts.append(f"{self.facts.refused_records} records refused by MLflow ({self.facts.last_refusal})")
        return "tracking: " + "; ".join(parts) if parts else None


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_ms() -> int:
    return int(time.time() * 1000)


def max_bytes() -> int:
    value = os.environ.get(ENV_TRACKING_SPOOL_MAX_BYTES, "")
    return int(value) if value.isdigit() and int(value) > 0 else MAX_BYTES


class Spool:
    """One run directory's spool: :meth:`append` (never touches the network) and the facts."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / TRACKING_SPOOL_FILE
        self.facts_path = self.run_dir / TRACKING_SPOOL_FACTS

    @contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        """A flock on a file of its own per acquisition: excludes other processes and other threads."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / name, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def facts(self) -> SpoolFacts:
        try:
            return SpoolFacts(**json.loads(self.facts_path.read_text()))
        except (OSError, ValueError, TypeError):
            return SpoolFacts()

    def _write_facts(self, facts: SpoolFacts) -> None:
        atomic_write_text(self.facts_path, json.dumps(asdict(facts), sort_keys=True) + "\n")

    def update_facts(self, **changes: Any) -> SpoolFacts:
        with self._lock(_APPEND_LOCK):
            facts = self.facts()
            for key, value in changes.items():
                setattr(facts, key, value)
            self._write_facts(facts)
            return facts

    def append(self, *records: dict[str, Any]) -> int:
        """Append ``records`` in order; returns how many were dropped (metrics past the size limit)."""
        with self._lock(_APPEND_LOCK):
            size = self.path.stat().st_size if self.path.exists() else 0
            limit, kept, dropped = max_bytes(), [], []
            if size > limit // 2:  # the part already sent (not yet truncated) does not count: only what waits
                size -= self.facts().sent_bytes
            for record in records:
                line = json.dumps(record, separators=(",", ":")) + "\n"
                if record["op"] == "metrics" and size + len(line) > limit:
                    dropped.append(record)
                    continue
                kept.append(line)
                size += len(line)
            if kept:
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write("".join(kept))
            if dropped:
                facts = self.facts()
                steps = [int(point[3]) for record in dropped for point in record["metrics"]]
                first = min(steps + ([facts.dropped_steps[0]] if facts.dropped_steps else []))
                facts.dropped_records += len(dropped)
                facts.dropped_points += len(steps)
                facts.dropped_steps = [first, max(steps + ([facts.dropped_steps[1]] if facts.dropped_steps else []))]
                self._write_facts(facts)
            return len(dropped)

    def pending_records(self) -> int:
        """Complete lines past the sent offset."""
        if not self.path.exists():
            return 0
        with open(self.path, "rb") as handle:
            handle.seek(self.facts().sent_bytes)
            return handle.read().count(b"\n")


def spool_status(run_dir: Path) -> SpoolStatus | None:
    """The spool's state for ``jobs show``; None when the run never spooled (no facts, nothing pending)."""
    spool = Spool(run_dir)
    if not spool.path.exists() and not spool.facts_path.exists():
        return None
    return SpoolStatus(spool.pending_records(), spool.facts())


# -- records ---------------------------------------------------------------------------------------

def metrics_record(metrics: dict[str, float], step: int, stamp_ms: int | None = None) -> dict[str, Any]:
    stamp = now_ms() if stamp_ms is None else stamp_ms
    return {"op": "metrics", "metrics": [[key, float(value), stamp, int(step)] for key, value in metrics.items()]}


def tags_record(tags: dict[str, str]) -> dict[str, Any]:
    return {"op": "tags", "tags": {key: str(value) for key, value in tags.items()}}


def status_record(status: str) -> dict[str, Any]:
    """``RUNNING`` (a resumed attempt), or a terminal status with its end time."""
    return {"op": "status", "status": status, "t": now_ms()}


def attempt_start_record(start_step: int) -> dict[str, Any]:
    """:data:`ground.tracking.M_ATTEMPT_START`'s point; its ordinal is counted when it reaches MLflow."""
    return {"op": "attempt_start", "step": int(start_step), "t": now_ms()}


def dict_record(document: dict[str, Any], artifact_path: str) -> dict[str, Any]:
    return {"op": "dict", "document": document, "path": artifact_path}


def create_record(experiment: str, run_name: str, tags: dict[str, str], params: list[tuple[str, str]],
                  artifact_location: str, chart_keys: list[str], goal: tuple[str, str] | None) -> dict[str, Any]:
    """The chain's run, created when it reaches MLflow unless ``mlflow_run_id`` exists by then; ``goal``
    is (goal as the spec states it, its metric) for the spec's goal view."""
    return {"op": "create", "t": now_ms(), "experiment": experiment, "run_name": run_name, "tags": tags,
            "params": [list(pair) for pair in params], "artifact_location": artifact_location,
            "chart_keys": chart_keys, "goal": list(goal) if goal else None}


# -- flushing --------------------------------------------------------------------------------------

@contextmanager
def short_http() -> Iterator[None]:
    """MLflow's HTTP client with :data:`HTTP_TIMEOUT_S` and no retries for the block (it reads both from
    the environment at each request); the caller's values come back after."""
    wanted = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(HTTP_TIMEOUT_S), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(HTTP_MAX_RETRIES)}
    before = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def open_client() -> Any:
    """An ``MlflowClient`` on ``mlflow_tracking_uri()``; a new SQLite store is seeded first, one process at a time."""
    from mlflow.tracking import MlflowClient

    from ground.mlflow_store import store_init_lock

    with store_init_lock():
        return MlflowClient(tracking_uri=mlflow_tracking_uri())


class _Refused(Exception):
    pass


def _error_code(exc: BaseException) -> str | None:
    return getattr(exc, "error_code", None)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    errno = re.search(r"\[Errno -?\d+\] [^'\")(]+", text)  # requests' ConnectionError nests it three deep
    if errno:
        return errno.group(0).strip()
    if "timed out" in text.lower():
        return f"no answer within {HTTP_TIMEOUT_S} s"
    return redacted(one_line(text, 300))


def flush_spool(run_dir: Path, client: Any = None) -> FlushResult:
    """Send a run directory's spooled records to MLflow, in order, and empty the spool once all are sent.

    Safe to call from any process at any time (the trainer's shipping thread, a later attempt, the
    controller or sync): one flusher at a time per run directory, writers never wait for it. Never
    raises for an unreachable server: the records stay, the facts say since when, and the result says
    what is left. Requests time out after :data:`HTTP_TIMEOUT_S` without retries."""
    spool = Spool(run_dir)
    if not spool.path.exists():
        return FlushResult()
    with spool._lock(_FLUSH_LOCK), short_http():
        facts = spool.facts()
        offset = facts.sent_bytes
        with open(spool.path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
        data = data[:data.rfind(b"\n") + 1]  # a line being appended right now waits for the next flush
        lines = data.splitlines(keepends=True)
        result = FlushResult(pending=len(lines))
        if lines:
            try:
                client = client or open_client()
            except Exception as exc:  # noqa: BLE001 (a store that cannot be opened is an outage too)
                return _outage(spool, result, exc)
        index, alone = 0, 0
        while index < len(lines):
            group, size = _group(lines, index, merge=index >= alone)
            try:
                _apply(client, spool.run_dir, group)
                result.sent += len(group)
                refusal = None
            except _Refused as exc:
                if len(group) > 1:  # find the record refused: send this group's records one by one
                    alone = index + len(group)
                    continue
                result.refused += len(group)
                refusal = str(exc)
            except Exception as exc:  # noqa: BLE001 (no answer, 5xx, a locked store: all outages)
                return _outage(spool, result, exc)
            index += len(group)
            offset += size
            result.pending = len(lines) - index
            facts = spool.facts()
            changes: dict[str, Any] = {"sent_bytes": offset, "flushed_records": facts.flushed_records + len(group) * (refusal is None)}
            if refusal is not None:
                changes.update(refused_records=facts.refused_records + len(group), last_refusal=refusal)
            spool.update_facts(**changes)
        _drain_if_sent(spool)
        result.pending = spool.pending_records()
        return result


def _outage(spool: Spool, result: FlushResult, exc: BaseException) -> FlushResult:
    result.error = _one_line(exc)
    facts = spool.facts()
    spool.update_facts(outage_since=facts.outage_since or utc_now(), last_error=result.error)
    return result


def _drain_if_sent(spool: Spool) -> None:
    """Everything appended was sent: empty the file (the offset to 0 first, so a crash between the two
    sends again rather than skips) and close the outage."""
    with spool._lock(_APPEND_LOCK):
        facts = spool.facts()
        size = spool.path.stat().st_size if spool.path.exists() else 0
        if size != facts.sent_bytes:
            return
        facts.sent_bytes, facts.outage_since, facts.last_error = 0, None, None
        facts.unflushed_at, facts.unflushed_records = None, 0
        spool._write_facts(facts)
        os.truncate(spool.path, 0)


def _group(lines: list[bytes], start: int, merge: bool = True) -> tuple[list[dict[str, Any]], int]:
    """The records sent in one request from ``lines[start]``: consecutive metrics records merge into one
    log_batch of at most :data:`METRICS_PER_BATCH` points (unless ``merge`` is False: a merged request was
    refused and its records go alone); any other record goes alone. Returns (records, bytes)."""
    first = json.loads(lines[start])
    group, size, points = [first], len(lines[start]), len(first.get("metrics", []))
    if first["op"] != "metrics" or not merge:
        return group, size
    for line in lines[start + 1:]:
        record = json.loads(line)
        if record["op"] != "metrics" or points + len(record["metrics"]) > METRICS_PER_BATCH:
            break
        group.append(record)
        size += len(line)
        points += len(record["metrics"])
    return group, size


def _run_id(run_dir: Path) -> str | None:
    path = run_dir / MLFLOW_RUN_ID_FILE
    return path.read_text().strip() if path.exists() else None


def _apply(client: Any, run_dir: Path, group: list[dict[str, Any]]) -> None:
    """Send one group; :class:`_Refused` when the server answered that it never will take it."""
    try:
        _send(client, run_dir, group)
    except Exception as exc:
        if _error_code(exc) in REFUSED_CODES:
            raise _Refused(f"{group[0]['op']}: {_one_line(exc)}") from exc
        raise


def _send(client: Any, run_dir: Path, group: list[dict[str, Any]]) -> None:
    from mlflow.entities import Metric, RunTag

    from ground import tracking as names

    record = group[0]
    op = record["op"]
    if op == "create":
        _create(client, run_dir, record)
        return
    run_id = _run_id(run_dir)
    if run_id is None:
        raise _Refused(f"{op}: the run was never created (its creation was refused)")
    if op == "metrics":
        client.log_batch(run_id, metrics=[Metric(k, v, t, s) for r in group for k, v, t, s in r["metrics"]])
    elif op == "tags":
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in record["tags"].items()])
    elif op == "status":
        if record["status"] == "RUNNING":
            client.update_run(run_id, status="RUNNING")
        else:
            client.set_terminated(run_id, status=record["status"], end_time=record["t"])
    elif op == "attempt_start":
        history = client.get_metric_history(run_id, names.M_ATTEMPT_START)
        if any(point.timestamp == record["t"] and point.step == record["step"] for point in history):
            return  # sent before a crash kept the offset from moving
        client.log_batch(run_id, metrics=[Metric(names.M_ATTEMPT_START, float(len(history) + 1), record["t"],
                                                 record["step"])],
                         tags=[RunTag(names.TAG_ATTEMPT_START_STEP, str(record["step"]))])
    elif op == "dict":
        client.log_dict(run_id, record["document"], record["path"])
    else:
        raise _Refused(f"unknown spool record {op!r}")


def _create(client: Any, run_dir: Path, record: dict[str, Any]) -> None:
    from mlflow.entities import Param

    from ground.mlflow_view import ensure_experiment, ensure_goal_view

    if _run_id(run_dir) is not None:
        return  # created by an earlier record (an earlier attempt spooled its own creation too)
    if record["artifact_location"].startswith("file://"):
        Path(record["artifact_location"].removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    experiment_id = ensure_experiment(client, record["artifact_location"], record["chart_keys"])
    if record["goal"]:
        goal, metric = record["goal"]
        ensure_goal_view(client, experiment_id, record["experiment"], goal, metric, record["chart_keys"])
    run = client.create_run(experiment_id, start_time=record["t"], tags=record["tags"], run_name=record["run_name"])
    params = [Param(key, value) for key, value in record["params"]]
    for start in range(0, len(params), PARAMS_PER_BATCH):
        client.log_batch(run.info.run_id, params=params[start:start + PARAMS_PER_BATCH])
    atomic_write_text(run_dir / MLFLOW_RUN_ID_FILE, run.info.run_id + "\n")

"""The smoke of the job's own entry: what the job will run, from the snapshot it will run from.

``idmctl preflight`` freezes the tree it checks (the same snapshot submit hands the job), writes a run
directory with ``spec.json``, and starts the entry there under the contract (``ground.contract``):
``IDMCTL_RUN_DIR``, ``IDMCTL_SMOKE_STEPS`` steps at ``IDMCTL_SMOKE_BATCH``. A Python module is started
as ``python -m MODULE --run-dir RUN_DIR``; a command line (the team's launch script) as written, from
the snapshot's copy of the first code root. The figures come from the entry's own ``IDMCTL_STEP``
lines: card A's job 6262 (``persistent_workers=True`` hard-coded against ``num_workers 0``) fails
here in seconds with Python's own ValueError instead of after a 2 h stage-in.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ground import contract
from ground.spec.loader import ResolvedSpec
from ground.spec.schema import detect_launch
from idmctl.core.checks import SmokeMeasurement
from idmctl.gate import box
from ground.code_snapshot import default_store, materialize
from ground.class_path import spec_roots
from ground.run_dir import write_run_spec
from idmctl.gate.tracebacks import last_frame_and_exception

SMOKE_STEPS = 3
SMOKE_BATCH = 2
"""Card A's smoke: 3 backward steps at batch 2."""
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_FIELD = re.compile(r"(\w+)=(\S+)")
CONTRACT_LINE = (f"`{contract.STEP_MARKER} step=N loss=X seconds=S` on stdout per optimizer step when "
                 f"{contract.ENV_SMOKE_STEPS} is set (trainers.entry_helper.Reporter.step prints it)")


def is_module(entry: str) -> bool:
    return bool(_MODULE.fullmatch(entry))


def _fields(line: str, marker: str) -> dict[str, float] | None:
    if not line.startswith(marker + " "):
        return None
    out = {}
    for key, value in _FIELD.findall(line[len(marker):]):
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


MAX_SECONDS = 30 * 86_400.0
"""A duration beyond 30 days (card A's whole 60K-step run is 18–22 days) is no step's, phase's or save's."""
MAX_BYTES = float(1 << 50)
"""1 PiB: beyond any node's memory or any checkpoint; a figure above it is in another unit (or garbage)."""
MAX_STEP = 1e12
DOMAINS: dict[str, tuple[str, float, bool]] = {
    "step": ("a step number", MAX_STEP, True), "seconds": ("seconds", MAX_SECONDS, False),
    "peak_mem_bytes": ("bytes", MAX_BYTES, True), "bytes": ("bytes", MAX_BYTES, True),
    "dataset_s": ("seconds", MAX_SECONDS, False), "sample_s": ("seconds", MAX_SECONDS, False),
    "model_s": ("seconds", MAX_SECONDS, False), "step_s": ("seconds", MAX_SECONDS, False),
    "checkpoint_s": ("seconds", MAX_SECONDS, False), "checkpoint_bytes": ("bytes", MAX_BYTES, True),
}
"""Figure → (unit, largest plausible value, whole number): each is finite and ≥ 0. ``loss`` has no domain
here: a non-finite loss is the smoke's own verdict (``losses not finite``), and a loss may be negative."""


def out_of_domain(fields: dict[str, float]) -> str | None:
    """Why one line's figures cannot be true (``seconds=-0.5 is negative``), or None."""
    for key, value in fields.items():
        if key not in DOMAINS:
            continue
        unit, largest, whole = DOMAINS[key]
        if not math.isfinite(value):
            return f"{key}={value} is not a finite number of {unit}"
        if value < 0:
            return f"{key}={value:g} is negative ({unit})"
        if value > largest:
            return f"{key}={value:g} is beyond any plausible {unit} (at most {largest:g})"
        if whole and value != int(value):
            return f"{key}={value:g} is not a whole number of {unit}"
    return None


class OutOfDomain(ValueError):
    """A contract line whose figure cannot be true: the message quotes the line."""


def parse_reports(stdout: str) -> tuple[list[dict[str, float]], dict[str, float], dict[str, float]]:
    """(step lines, phase figures, last checkpoint figures) from an entry's stdout. OutOfDomain for a
    figure outside its domain (:data:`DOMAINS`), quoting the line."""
    steps, phase, checkpoint = [], {}, {}
    for line in stdout.splitlines():
        line = line.strip()
        for marker in (contract.STEP_MARKER, contract.PHASE_MARKER, contract.CHECKPOINT_MARKER):
            fields = _fields(line, marker)
            if fields is not None and (why := out_of_domain(fields)) is not None:
                raise OutOfDomain(f"{why}, in the line {line[:300]!r}")
        if (fields := _fields(line, contract.STEP_MARKER)) is not None and "step" in fields:
            steps.append(fields)
        elif (fields := _fields(line, contract.PHASE_MARKER)) is not None:
            phase.update(fields)
        elif (fields := _fields(line, contract.CHECKPOINT_MARKER)) is not None:
            checkpoint = fields
    return steps, phase, checkpoint


def entry_argv(entry: str, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", entry, "--run-dir", str(run_dir)] if is_module(entry) else shlex.split(entry)


def _launch_env(resolved: ResolvedSpec, entry: str) -> dict[str, str]:
    """An entry that starts its own ranks (``code.launch: per_node``) is smoked as the job starts it, on one
    device: told to start one rank on one node (the job tells it the node's GPUs and the nodes)."""
    if (resolved.spec.code.launch or detect_launch(entry)) != "per_node":
        return {}
    return {contract.ENV_NPROC_PER_NODE: "1", contract.ENV_NNODES: "1"}


def run_entry_smoke(resolved: ResolvedSpec, entry: str, timeout_s: float) -> SmokeMeasurement:
    """Run ``entry`` for :data:`SMOKE_STEPS` steps from a snapshot of the code it will run as a job."""
    from idmctl.job.code import tree_for  # start-up: 11 more project modules only this path needs

    started = time.perf_counter()
    snapshot = tree_for(resolved.spec)
    directory = materialize(snapshot, default_store())
    roots = [str(p) for p in snapshot.import_dirs(directory, spec_roots(resolved.spec))]
    batch = min(SMOKE_BATCH, resolved.spec.loader.batch_size)
    with tempfile.TemporaryDirectory(prefix="idmctl_entry_smoke_") as tmp:
        run_dir = Path(tmp) / "run"
        write_run_spec(run_dir, resolved)
        env = {**os.environ, contract.ENV_RUN_DIR: str(run_dir), contract.ENV_SMOKE_STEPS: str(SMOKE_STEPS),
               contract.ENV_SMOKE_BATCH: str(batch), "IDMCTL_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(directory), *roots, *filter(None, [os.environ.get("PYTHONPATH")])]),
               **({contract.ENV_CODE_ROOTS: os.pathsep.join(roots)} if roots else {}),
               **_launch_env(resolved, entry)}
        cwd = Path(roots[0]) if roots and not is_module(entry) else directory
        try:
            # In the box: its own session, output bounded, and at the deadline (or once it has ended)
            # everything it started is ended too, a grandchild in a session of its own included.
            ran = box.command(entry_argv(entry, run_dir), env=env, cwd=cwd, deadline_s=timeout_s,
                              markers=(contract.STEP_MARKER, contract.PHASE_MARKER, contract.CHECKPOINT_MARKER))
        except OSError as exc:
            return SmokeMeasurement(ok=False, error=f"cannot start {entry!r}: {exc.strerror or exc}",
                                    wall_s=time.perf_counter() - started)
    wall = time.perf_counter() - started
    timed_out, stderr, stdout = ran.timed_out, ran.stderr, ran.stdout
    try:
        steps, phase, checkpoint = parse_reports("\n".join(ran.marked))
    except OutOfDomain as exc:
        return SmokeMeasurement(ok=False, wall_s=wall, error=f"{entry!r} reported a figure outside its domain: {exc}")
    if timed_out and not steps:
        return SmokeMeasurement(ok=False, wall_s=wall, error=f"{entry!r} reported no step within {timeout_s:.0f} s: "
                                                              f"the contract expects {CONTRACT_LINE}")
    if ran.returncode != 0 and not timed_out:
        own = [Path(r) for r in roots] + [directory]  # the team's frames first, then the project's
        where = last_frame_and_exception(stderr or stdout, own)
        fact = f"exit {ran.returncode}" if ran.returncode and ran.returncode > 0 else box.ended(ran.returncode or 0)
        return SmokeMeasurement(ok=False, wall_s=wall, error=f"{fact}: {where}")
    if not steps:
        return SmokeMeasurement(ok=False, wall_s=wall, error=f"{entry!r} exited 0 without reporting a step: the "
                                                              f"contract expects {CONTRACT_LINE}")
    seconds = [s["seconds"] for s in steps if "seconds" in s]
    peaks = [int(s["peak_mem_bytes"]) for s in steps if "peak_mem_bytes" in s]
    return SmokeMeasurement(
        ok=True, losses=[s.get("loss", float("nan")) for s in steps], device="cpu", batch_size=batch,
        dataset_s=phase.get("dataset_s"), sample_s=phase.get("sample_s"), model_s=phase.get("model_s"),
        # The first step pays warm-up (allocation, first reads): the median of the rest is the pace.
        step_s=statistics.median(seconds[1:] or seconds) if seconds else None,
        peak_mem_bytes=max(peaks) if peaks else None, wall_s=wall,
        checkpoint_s=checkpoint.get("seconds"), checkpoint_bytes=int(checkpoint["bytes"]) if "bytes" in checkpoint else None)

"""The quickstart loop, stage by stage, on embedded defaults (SQLite store, local executor, MLflow SQLite).

demos (robosuite) → hidden cache (tiny Wan VAE + Cosmos) → preflight with smoke → submit → training →
evaluation (offline ``eef_mm`` and simulator ``sim_eef_mm``, trained vs untrained) → compare and decide.
Every stage calls the library function the matching ``idmctl`` command calls; each prints
``[k/N] stage: result with numbers``. Re-running reuses the demos and the cache and trains a new run.
The data-plane stages (torch, robosuite, mlflow) import inside their functions.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.errors import CheckFailed, UserError
from idmctl.core.job_state import JobState
from idmctl.cli.output import console
from ground.paths import expand_path, home
from ground.spec.loader import ResolvedSpec
from ground.spec import list_experiments, load_experiments
from idmctl.core.job_state import is_terminal

if TYPE_CHECKING:
    from idmctl.record.records import JobRecord

EXPERIMENT = "quickstart"
DEMOS = 12
"""Scripted Lift demos; the last ``VALID`` are the held-out split the evaluation replays."""
VALID = 4
DEMO_SEED = 0
CAMERA_PX = 64
"""Square agentview frames; a multiple of 16 as video models want."""
DEMO_STEPS = 50
STAGES = 9
JOB_TIMEOUT_S = 1800.0
WHAT_TO_DO = {
    "doctor": "fix the FAIL rows above (`idmctl doctor` shows the full table)",
    "specs": "`idmctl exp list` validates every spec and names the broken field",
    "demos": "`idmctl doctor` checks rendering; the demo file is written atomically, so rerunning is safe",
    "cache": "rerun: cached episodes are kept (`idmctl cache inspect quickstart` shows the cache)",
    "preflight": "the rows above give each failing check's numbers and fix",
    "submit": "`idmctl submit quickstart --dry-run` shows the job script; `idmctl jobs` lists the jobs",
    "train": "read the job's log (`idmctl jobs`; `idmctl failures` classifies the cause), then rerun",
    "eval": "the trained run is in MLflow (`idmctl compare quickstart`); rerun to train and evaluate again",
    "compare": "`idmctl compare quickstart` draws the same table; `idmctl decide quickstart` the goal's verdict",
    "report": "`idmctl report quickstart --markdown` writes the same card from the record",
}
"""What to do when a stage fails, shown on the one line that reports it (``--debug`` shows the traceback)."""
TRAIN_LINE = re.compile(r"^(step \d+/\d+ loss \S+|eval at step .*|done: .*)")
"""Trainer log lines worth echoing while the job runs (progress, evaluations, the final summary)."""


@dataclass
class QuickstartResult:
    """What each stage produced, for tests and ``--json``-style callers."""

    stages: dict[str, Any] = field(default_factory=dict)


def stage(k: int, name: str, text: str) -> None:
    console.print(f"[{k}/{STAGES}] {name}: {text}", markup=False)


def detail(text: str) -> None:
    console.print(f"      {text}", markup=False)


def register_specs_stage(result: QuickstartResult) -> ResolvedSpec:
    from idmctl.record.specs import register_specs  # start-up: pulls sqlalchemy and pydantic

    specs = [variant for path in list_experiments() for variant in load_experiments(str(path))]
    new = register_specs(specs)
    stage(1, "specs", f"{len(specs)} experiments valid, {len(new)} new versions registered")
    resolved = next(r for r in specs if r.name == EXPERIMENT)
    detail(f"{resolved.name} {resolved.short_hash}: {resolved.spec.description}")
    result.stages["specs"] = {"experiments": len(specs), "new": len(new), "quickstart_hash": resolved.hash}
    return resolved


def _demos_present(path: Path) -> bool:
    """A complete demo file from an earlier run (writes are atomic, so existing means complete)."""
    from cache.episodes import list_demos  # start-up: pulls h5py and numpy

    if not path.exists():
        return False
    try:
        return len(list_demos(path, "all")) == DEMOS and len(list_demos(path, "valid")) == VALID
    except Exception:  # unreadable or another layout: make it again
        return False


def demos_stage(resolved: ResolvedSpec, result: QuickstartResult) -> Path:
    path = expand_path(resolved.spec.data.episodes)
    if _demos_present(path):
        stage(2, "demos", f"reusing {DEMOS} demos in {path}")
        result.stages["demos"] = {"reused": True, "path": str(path)}
        return path
    from idmctl.cli.commands.data import demos_progress, describe  # start-up: pulls typer
    from trainers.sim.demos import make_demos  # start-up: pulls numpy

    detail(f"robosuite Lift, Panda + OSC pose controller, scripted policy, seed {DEMO_SEED}: "
           f"{DEMOS} demos × {DEMO_STEPS} steps with {CAMERA_PX}×{CAMERA_PX} frames")
    summary = make_demos(path, "Lift", DEMOS, seed=DEMO_SEED, camera_size=CAMERA_PX, horizon=DEMO_STEPS,
                         valid=VALID, progress=demos_progress)
    stage(2, "demos", describe(summary))
    result.stages["demos"] = {"reused": False, **summary}
    return path


def cache_stage(resolved: ResolvedSpec, result: QuickstartResult) -> None:
    from ground.geometry import HiddenGeometry, sample_io  # start-up: only this command needs it (1 more project modules)
    from trainers.build_hidden_cache import build_hidden_cache  # start-up: pulls torch and h5py

    data = resolved.spec.data
    started = time.perf_counter()
    summary = build_hidden_cache(resolved.spec, processes=1)
    seconds = time.perf_counter() - started
    geometry = HiddenGeometry.from_spec(data)
    stage(3, "cache", f"{summary['built']} built, {summary['skipped']} already cached, {summary['demos']} demos "
                      f"in {seconds:.1f} s → {summary['cache_root']}")
    detail(f"per file: {geometry.layers} layers × {geometry.frames} frames × {geometry.height} × {geometry.width} × "
           f"{geometry.channels} × {geometry.dtype_bytes} B = {geometry.file_bytes:,} B")
    detail(f"per sample: {sample_io(data, mmap=resolved.spec.loader.mmap).formula}")
    result.stages["cache"] = {**summary, "seconds": seconds}


def preflight_stage(resolved: ResolvedSpec, result: QuickstartResult) -> None:
    from idmctl.gate.runner import run_preflight  # start-up: only this command needs it (35 more project modules)
    from idmctl.core.profile import load_profile  # start-up: only this command needs it (1 more project modules)

    profile, profile_hash = load_profile(None)
    report = run_preflight(resolved, profile, profile_hash, with_smoke=True)
    counts: dict[str, int] = {}
    for check in report.results:
        counts[check.status.value] = counts.get(check.status.value, 0) + 1
        detail(f"{check.status.value:4s} {check.name:13s} {check.summary}")
    verdict = ", ".join(f"{n} {status}" for status, n in counts.items())
    stage(4, "preflight", f"{verdict} in {report.seconds:.1f} s on cluster {profile.name!r} (run {report.run_id})")
    result.stages["preflight"] = report.as_dict()
    if report.failed:
        raise CheckFailed(f"quickstart stopped: preflight FAILed {', '.join(report.failed)} (see the rows above)")


def submit_stage(result: QuickstartResult) -> "JobRecord":
    from idmctl.core.job_options import JobRequest  # start-up: only this command needs it (1 more project modules)
    from idmctl.ops.submit import submit  # start-up: only this command needs it (23 more project modules)

    submitted = submit(EXPERIMENT, JobRequest(), None)
    job = submitted.job
    stage(5, "submit", f"job {job.id} ({job.executor} {job.scheduler_id}), chain {job.chain_id}, qos {job.qos}, "
                       f"script {job.script_path}")
    result.stages["submit"] = {"job": job.id, "chain": job.chain_id, "executor": job.executor,
                               "scheduler_id": job.scheduler_id, "log": job.log_path}
    return job


def _follow(log_path: Path, offset: int, echo: Callable[[str], None]) -> int:
    """Echo the trainer's progress lines written since ``offset``; returns the new offset."""
    if not log_path.exists():
        return offset
    with open(log_path, "rb") as handle:
        handle.seek(offset)
        chunk = handle.read()
    complete, _, _ = chunk.rpartition(b"\n")
    if not complete:
        return offset
    for line in complete.decode(errors="replace").splitlines():
        if TRAIN_LINE.match(line.strip()):
            echo(line.strip())
    return offset + len(complete) + 1


def train_stage(job: "JobRecord", result: QuickstartResult, poll_s: float = 1.0) -> Path:
    """Wait for the job through ``idmctl sync`` (the same path for the local executor and Slurm)."""
    from idmctl.ops.submit import chain_run_dir  # start-up: only this command needs it (23 more project modules)
    from idmctl.ops.sync import sync  # start-up: pulls sqlalchemy and pydantic
    from idmctl.record.store import store  # start-up: only this command needs it

    started = time.perf_counter()
    jobs = store()
    log_path, offset, state = Path(job.log_path), 0, job.state_text
    while True:
        sync(retry=True)
        found = jobs.job(job.id)
        state = found.state_text if found else "UNKNOWN"
        offset = _follow(log_path, offset, detail)
        if is_terminal(state):
            break
        if time.perf_counter() - started > JOB_TIMEOUT_S:
            raise CheckFailed(f"quickstart stopped: job {job.id} still {state} after {JOB_TIMEOUT_S:.0f} s "
                              f"(log {log_path})")
        time.sleep(poll_s)
    seconds = time.perf_counter() - started
    losses = [float(m.group(1)) for m in re.finditer(r"^step \d+/\d+ loss (\S+)", log_path.read_text(), re.M)]
    result.stages["train"] = {"state": state, "seconds": seconds, "losses": losses, "log": str(log_path)}
    if state != JobState.COMPLETED:
        raise CheckFailed(f"quickstart stopped: job {job.id} ended {state} (log {log_path}; `idmctl failures`)")
    shown = f"loss {losses[0]:.4f} → {losses[-1]:.4f} ({len(losses)} logged windows)" if losses else "no loss lines"
    stage(6, "train", f"job {job.id} COMPLETED in {seconds:.0f} s, {shown}")
    run_dir = chain_run_dir(job)
    assert run_dir is not None  # a submitted job's script was written
    return run_dir


def evaluation_stage(resolved: ResolvedSpec, run_dir: Path, result: QuickstartResult) -> dict[str, float]:
    from trainers.sim.scoring import score_trained_and_untrained  # start-up: pulls torch and numpy

    started = time.perf_counter()
    scores = score_trained_and_untrained(resolved.spec, run_dir)
    seconds = time.perf_counter() - started
    parts = [f"{metric} {scores['trained'][metric]:.1f} mm (untrained {scores['untrained'][metric]:.1f} mm)"
             for metric in scores["trained"]]
    stage(7, "eval", f"{'; '.join(parts)} in {seconds:.0f} s")
    detail(f"checkpoint {scores['checkpoint']}; the trained numbers are also in MLflow run {scores['mlflow_run_id']}")
    for demo, trained, untrained in scores["per_episode"]:
        detail(f"{demo}: simulator replay {trained:.1f} mm trained vs {untrained:.1f} mm untrained")
    result.stages["eval"] = scores
    return scores["trained"]


def compare_stage(resolved: ResolvedSpec, result: QuickstartResult) -> None:
    from idmctl.cli.commands.compare import compare  # start-up: pulls typer and rich
    from idmctl.track.compare import build_report  # start-up: only this command needs it (4 more project modules)

    from ground.tracking import eef_metric  # start-up: only this command needs it (1 more project modules)

    metric = eef_metric(max(resolved.spec.eval.episodes), simulator=resolved.spec.eval.simulator)
    stage(8, "compare", f"card A's baselines and the {EXPERIMENT} runs, ranked by {metric} (lower is better)")
    compare([EXPERIMENT], metric=metric, as_json=False, as_markdown=False, plot=None)
    report = build_report([EXPERIMENT], metric=metric)
    result.stages["compare"] = report.to_json()
    # The goal decided from the per-episode results the trainer logged, with its interval.
    from idmctl.cli.commands.decide import decide
    from idmctl.track.goal_decisions import build_decisions  # start-up: pulls numpy

    decide(EXPERIMENT, goal=None, checkpoint="last", as_json=False, plot=None, no_tags=False)
    result.stages["decide"] = [d.to_json() for d in build_decisions(EXPERIMENT)]


def report_stage(result: QuickstartResult) -> None:
    """The progress card from the record: what `idmctl report quickstart --markdown` prints."""
    import sys

    from idmctl.track.card import build_card, card_json  # start-up: only this stage needs it

    card = build_card([EXPERIMENT])
    stage(9, "report", f"the {EXPERIMENT} card from the record ({len(card.sections)} sections, "
                       f"{len(card.open_items)} open items): idmctl report {EXPERIMENT} --markdown")
    sys.stdout.write(card.markdown())
    result.stages["report"] = card_json(card)


def doctor_stage(result: QuickstartResult) -> None:
    """``idmctl doctor`` first: quiet when every row is OK; otherwise the rows that are not, with their fixes."""
    from idmctl.ops.doctor import OK, run_doctor  # start-up: only this command needs it (4 more project modules)

    report = run_doctor()
    result.stages["doctor"] = report.as_dict()
    counts: dict[str, int] = {}
    for row in report.rows:
        counts[row.status] = counts.get(row.status, 0) + 1
        if row.status != OK:
            detail(f"{row.status:4s} {row.name:12s} {row.detail}" + (f" — fix: {row.fix}" if row.fix else ""))
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    console.print(f"doctor: {summary} in {report.seconds:.1f} s", markup=False)
    if report.failed:
        raise CheckFailed(f"quickstart stopped: doctor found {', '.join(report.failed)} missing; "
                          f"what to do: {WHAT_TO_DO['doctor']}")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _stage(k: int, name: str, debug: bool, run: Callable[..., Any], *args: Any) -> Any:
    """Run one stage; any failure becomes one line: which stage, what went wrong, what to do."""
    where = f"[{k}/{STAGES}] {name}" if k else name
    try:
        return run(*args)
    except CheckFailed:
        raise  # already one line with its own fix (preflight, job state, doctor)
    except UserError as exc:
        if debug:
            raise
        raise UserError(f"quickstart stopped at {where}: {exc.what}", file=exc.file, field=exc.field,
                        hint=exc.hint or WHAT_TO_DO[name]) from exc
    except Exception as exc:
        if debug:
            raise
        raise CheckFailed(f"quickstart stopped at {where}: {_first_line(exc)}; what to do: {WHAT_TO_DO[name]} "
                          f"(`--debug` shows the traceback)") from exc


def run_quickstart(debug: bool = False) -> QuickstartResult:
    result = QuickstartResult()
    console.print(f"idmctl quickstart  IDMCTL_HOME={home()}", markup=False)
    _stage(0, "doctor", debug, doctor_stage, result)
    resolved = _stage(1, "specs", debug, register_specs_stage, result)
    _stage(2, "demos", debug, demos_stage, resolved, result)
    _stage(3, "cache", debug, cache_stage, resolved, result)
    _stage(4, "preflight", debug, preflight_stage, resolved, result)
    job = _stage(5, "submit", debug, submit_stage, result)
    run_dir = _stage(6, "train", debug, train_stage, job, result)
    _stage(7, "eval", debug, evaluation_stage, resolved, run_dir, result)
    _stage(8, "compare", debug, compare_stage, resolved, result)
    _stage(9, "report", debug, report_stage, result)
    return result

"""MLflow naming contract shared by the trainer (writes) and compare/failures (read).

Everything lives in one MLflow experiment so the compare page can line runs up column by column.
No mlflow import here: this module only names things.
"""

from __future__ import annotations

import re
from typing import Any

MLFLOW_EXPERIMENT = "idmctl"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""MLflow 3 opens an experiment without this tag on its GenAI overview; with it, on the runs table."""

# Tags
TAG_EXPERIMENT = "idmctl.experiment"
TAG_SPEC_HASH = "idmctl.spec_hash"
TAG_CODE_VERSION = "idmctl.code_version"
TAG_CHAIN = "idmctl.chain_id"
TAG_SLURM_JOB = "idmctl.slurm_job_id"
TAG_ATTEMPT = "idmctl.attempt"
TAG_QOS = "idmctl.qos"
TAG_ROUTING_N = "idmctl.routing_n"
TAG_SLURM_RESTARTS = "idmctl.slurm_restart_count"
TAG_ATTEMPT_START_STEP = "idmctl.attempt_start_step"
"""The step the current attempt resumed from (0: a fresh start); the full record is :data:`M_ATTEMPT_START`."""
TAG_FAILURE_CAUSE = "failure_cause"
TAG_SLURM_STATE = "slurm_state"
TAG_BUILD = "idmctl.build"
"""On a cache build job's run: the mode built (hidden, rgb, pt, ff); compare leaves such runs out."""

# Params: the trainer logs the canonical spec flattened (``flatten``), so a param key is the spec
# field's dotted path. These are the ones the control plane reads back (compare); a test checks each
# is a key of a real spec's flattened params, so a renamed spec field cannot silently empty a column.
P_TRAIN_STEPS = "train.steps"
P_EFFECTIVE_BATCH = "train.effective_batch"
P_GOAL = "goal"
P_CACHED_LAYERS = "data.cached_layers"
P_SELECTED_LAYERS = "data.selected_layer_indices"
READ_PARAMS = (P_TRAIN_STEPS, P_EFFECTIVE_BATCH, P_GOAL, P_CACHED_LAYERS, P_SELECTED_LAYERS)

# Metrics (per step unless noted)
M_LOSS = "loss"
M_LR = "lr"
M_STEP_TIME = "step_time_s"
M_SAMPLES_PER_S = "samples_per_s"
M_DATA_WAIT = "data_wait_frac"
M_PEAK_MEM = "peak_mem_bytes"
# Per job (step = the attempt), logged by sync from sacct when the job ends (idmctl/plan/efficiency.py)
M_JOB_CPU_EFF = "job_cpu_efficiency"
M_JOB_MEM_EFF = "job_mem_efficiency"
M_JOB_TIME_FRAC = "job_time_used_frac"
M_JOB_PEAK_RSS = "job_peak_rss_bytes"
TAG_EFFICIENCY = "idmctl.efficiency"
"""Prefix of a per-attempt tag holding the report's lines: ``idmctl.efficiency.attempt-2``."""
M_ATTEMPT_START = "attempt_start_step"
"""One point per start of the trainer in a run: step = the checkpoint step it resumed from (0: fresh),
value = the attempt's ordinal in the run, timestamp = when it started. A resume from a checkpoint older
than the last logged step supersedes the earlier attempts' points past that step: :func:`surviving`."""


def surviving(points: list[tuple[int, int, float]], starts: list[tuple[int, int]]) -> list[tuple[int, float]]:
    """The curve a run really trained along: ``points`` are a metric's (timestamp ms, step, value) as
    MLflow keeps them, every attempt's included (MLflow's issue #4248: resumed curves overlap);
    ``starts`` are the (timestamp ms, start step) of :data:`M_ATTEMPT_START`. A point belongs to the
    latest attempt started at or before it and survives unless a later attempt resumed from a step
    before it. Returns (step, value), each step once, in step order."""
    import bisect

    starts = sorted(starts)
    stamps = [stamp for stamp, _ in starts]
    # floor[k]: the lowest start step of attempts k.. (later attempts overwrite everything past it).
    floor = [float("inf")] * (len(starts) + 1)
    for k in range(len(starts) - 1, -1, -1):
        floor[k] = min(floor[k + 1], starts[k][1])
    kept: dict[int, tuple[int, float]] = {}
    for stamp, step, value in points:
        later = bisect.bisect_right(stamps, stamp)  # attempts started after this point was logged
        if step > floor[later]:
            continue
        if step not in kept or stamp >= kept[step][0]:
            kept[step] = (stamp, value)
    return [(step, kept[step][1]) for step in sorted(kept)]


def eef_metric(episodes: int, simulator: bool = False) -> str:
    """``eef_mm_24ep`` (offline) or ``sim_eef_mm_24ep`` (robosuite replay)."""
    return f"{'sim_' if simulator else ''}eef_mm_{episodes}ep"


EEF_METRIC = re.compile(r"^(sim_)?eef_mm_(\d+)ep$")
"""Matches every name :func:`eef_metric` makes; group 1 is ``sim_`` or None, group 2 the episode count."""
DEFAULT_RANK_METRIC = eef_metric(24)
"""Card A decides on 24 held-out episodes (its goal: ``eef_mm_24ep <= 125``)."""


def best_metric(metric: str) -> str:
    """``best_eef_mm_24ep``: the running best of an eval metric, logged beside it (MLflow keeps only the last)."""
    return f"best_{metric}"


def run_name(experiment: str, chain_id: int | None) -> str:
    """``latent_c_n4#12``: experiment name + attempt chain; all attempts of a chain share the run."""
    return experiment if chain_id is None else f"{experiment}#{chain_id}"


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"data": {"frames": 24}}`` → ``{"data.frames": 24}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


# Evaluation protocols and decisions (issue: metrics of different protocols were ranked in one table)
TAG_PROTOCOL = "idmctl.protocol"
"""Prefix of the tag naming the protocol a metric was evaluated under: ``idmctl.protocol.sim_eef_mm_4ep``."""
EPISODES_ARTIFACT_DIR = "episodes"
"""Per-episode results: ``episodes/<metric>/step-<step>.json`` (protocol, step, each episode's error in mm)."""
TAG_DECISION = "idmctl.decision"
"""Prefix of the tags ``idmctl decide`` writes on the run it decided: ``idmctl.decision.verdict``, …"""
DECISION_FIELDS = ("verdict", "goal", "protocol", "step", "estimate_mm", "interval_mm", "p_goal", "episodes")


def protocol_tag(metric: str) -> str:
    return f"{TAG_PROTOCOL}.{metric}"


TAG_EVAL_JOB = "idmctl.eval_job"
"""``idmctl.eval_job.step-N``: the Slurm job that evaluated checkpoint N (``trainers.eval_job``)."""


def eval_job_tag(step: int) -> str:
    return f"{TAG_EVAL_JOB}.step-{step}"


def episodes_artifact(metric: str, step: int) -> str:
    """The artifact path of one evaluation's per-episode results (zero-padded so names sort by step)."""
    return f"{EPISODES_ARTIFACT_DIR}/{metric}/step-{step:09d}.json"


def decision_tag(field: str) -> str:
    return f"{TAG_DECISION}.{field}"

"""The statistics of a goal decision: an estimate, its 95 % interval, P(goal holds) and a verdict.

Numpy only, pure (no I/O), so the coverage test can drive it through thousands of simulated
decisions with a known truth (``tests/idmctl/track/test_decision_stats.py``).

The method is the **studentized bootstrap** (bootstrap-t) over episodes: resample the episodes,
studentize each resampled mean by its own standard error, and read the interval from the quantiles of
that t-statistic. The percentile bootstrap, the obvious choice, under-covers badly at the episode
counts the team decides on: with 5 episodes its "95 %" interval covers the truth ~85 % of the time
(normal errors) and ~80 % (skewed ones), because a resample of 5 cannot be more spread than the 5 it
came from. Bootstrap-t keeps ~95 % at 5 and at 24 episodes, on normal and on log-normal errors
(measured in the test), at the price of a wider interval at 5 episodes — which is the truth about
5 episodes.

When several runs of one spec (seeds) were evaluated on the same episodes the data are a seeds ×
episodes matrix: both are resampled, and the standard error adds the spread of the episode means
(over seeds) and of the seed means (over episodes). Two runs on the same episodes are compared
**paired**: the interval is the one of the per-episode differences.

P(goal holds) is the share of the bootstrap-t confidence distribution (mean − t*·se) on the goal's
side. The verdict is PASS when the whole 95 % interval is on the goal's side, FAIL when it is all on
the other side, else UNDECIDED, with about how many episodes would make the interval narrow enough
to decide if the estimate and spread stayed as they are.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

LEVEL = 0.95
DRAWS = 2000
"""Bootstrap resamples; the 2.5 % tail quantile then rests on 50 draws."""
SEED = 0
"""Fixed, so one set of episodes always gives the same interval."""
MAX_EPISODES = 100_000
"""Beyond this the answer is "no practical number of episodes decides it" (the estimate sits on the goal)."""
METHOD = "studentized bootstrap (bootstrap-t) over episodes"
_Z975 = 1.959963984540054


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish–Fisher expansion in the normal quantile (|error| < 0.01 for df ≥ 3
    at p = 0.975: 2.776 for df 4, 2.069 for df 23); used only for "how many episodes would decide"."""
    if df < 1:
        raise ValueError("df must be ≥ 1")
    z = _Z975 if p == 0.975 else _normal_quantile(p)
    v = float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


def _normal_quantile(p: float) -> float:
    """Acklam's rational approximation (relative error < 1.2e-9)."""
    a = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00]
    b = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01]
    c = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00]
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


@dataclass(frozen=True)
class Estimate:
    """A mean over episodes (and seeds) with its interval; ``draws`` is the confidence distribution."""

    mean: float
    low: float
    high: float
    episodes: int
    seeds: int
    sd: float
    """Spread of one episode's error (over seeds: of the per-episode means)."""
    se: float
    draws: np.ndarray
    level: float = LEVEL
    method: str = METHOD

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("draws")
        return data


def _se(matrix: np.ndarray) -> np.ndarray:
    """Standard error of the grand mean of (…, seeds, episodes): episode spread / √n (+ seed spread / √k)."""
    seeds, episodes = matrix.shape[-2], matrix.shape[-1]
    episode_means = matrix.mean(axis=-2)
    variance = episode_means.var(axis=-1, ddof=1) / episodes
    if seeds > 1:
        variance = variance + matrix.mean(axis=-1).var(axis=-1, ddof=1) / seeds
    return np.sqrt(variance)


def estimate(values: Any, level: float = LEVEL, draws: int = DRAWS, seed: int = SEED) -> Estimate:
    """The mean of per-episode values — a list (one run) or a seeds × episodes matrix (runs sharing
    their episodes) — with its bootstrap-t interval. Needs ≥ 2 episodes: one has no spread."""
    matrix = np.atleast_2d(np.asarray(values, dtype=np.float64))
    seeds, episodes = matrix.shape
    if episodes < 2:
        raise ValueError(f"{episodes} episode has no spread: an interval needs at least 2")
    if not np.all(np.isfinite(matrix)):
        raise ValueError("per-episode values must be finite")
    mean = float(matrix.mean())
    se = float(_se(matrix))
    sd = float(se * math.sqrt(episodes))
    if se == 0.0:
        return Estimate(mean, mean, mean, episodes, seeds, sd, se, np.full(1, mean), level)
    rng = np.random.default_rng(seed)
    cols = rng.integers(0, episodes, (draws, episodes))
    if seeds == 1:  # one run: the common case, without the seeds axis (4× faster)
        resampled_1 = matrix[0][cols]
        boot_means = resampled_1.mean(axis=1)
        boot_se = np.sqrt(((resampled_1 - boot_means[:, None]) ** 2).sum(axis=1) / (episodes - 1) / episodes)
    else:
        rows = rng.integers(0, seeds, (draws, seeds))
        resampled = matrix[rows[:, :, None], cols[:, None, :]]
        boot_means, boot_se = resampled.mean(axis=(1, 2)), _se(resampled)
    usable = boot_se > 0  # a resample of one repeated episode has no spread to studentize by
    t = (boot_means[usable] - mean) / boot_se[usable]
    confidence = mean - t * se
    tail = (1 - level) / 2
    low, high = np.quantile(confidence, [tail, 1 - tail])
    return Estimate(mean, float(low), float(high), episodes, seeds, sd, se, confidence, level)


def paired(a: Any, b: Any, **kwargs: Any) -> Estimate:
    """a − b episode by episode (same episodes, same order): the interval of the difference."""
    first, second = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if first.shape != second.shape:
        raise ValueError(f"paired results need the same episodes: {first.shape} vs {second.shape}")
    return estimate(first - second, **kwargs)


@dataclass(frozen=True)
class Decision:
    verdict: str
    """PASS, FAIL or UNDECIDED."""
    p_goal: float
    """Share of the confidence distribution on the goal's side."""
    episodes_to_decide: int | None
    """UNDECIDED only: about how many episodes in all would decide it (None: no practical number)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def holds(op: str, observed: Any, goal: float) -> Any:
    return {"<=": observed <= goal, "<": observed < goal, ">=": observed >= goal, ">": observed > goal}[op]


def decide(est: Estimate, op: str, goal: float) -> Decision:
    """PASS when the whole interval satisfies the goal, FAIL when none of it does, else UNDECIDED."""
    p_goal = float(np.mean(holds(op, est.draws, goal)))
    if bool(holds(op, est.high, goal)) and bool(holds(op, est.low, goal)):
        return Decision("PASS", p_goal, None)
    if not bool(holds(op, est.high, goal)) and not bool(holds(op, est.low, goal)):
        return Decision("FAIL", p_goal, None)
    return Decision("UNDECIDED", p_goal, episodes_to_decide(est.sd, abs(est.mean - goal), est.level))


def episodes_to_decide(sd: float, margin: float, level: float = LEVEL) -> int | None:
    """Smallest n with t(n−1)·sd/√n < margin: the episodes whose interval would clear the goal if the mean
    and the spread stayed as measured. None when the mean sits on the goal (no n is enough)."""
    if margin <= 0:
        return None
    if sd == 0:
        return 2
    p = 1 - (1 - level) / 2
    n = max(2, math.ceil((_normal_quantile(p) * sd / margin) ** 2))
    while n <= MAX_EPISODES:
        if t_quantile(p, n - 1) * sd / math.sqrt(n) < margin:
            return n
        n += max(1, n // 50)
    return None


def sd_that_decides(mean: float, goal: float, episodes: int, level: float = LEVEL) -> float | None:
    """For a point estimate without a spread: the largest per-episode sd under which ``episodes``
    episodes would still decide the goal (t(n−1)·sd/√n < |mean − goal|); None for one episode."""
    if episodes < 2:
        return None
    return abs(mean - goal) * math.sqrt(episodes) / t_quantile(1 - (1 - level) / 2, episodes - 1)

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
to decide at a stated probability (80 % by default) once the uncertainty of the estimate and of the
spread is counted (:func:`episodes_for_power`).

Three things keep the interval honest on real evaluation files:
- **success rates** (every value 0 or 1) get the Wilson score interval, not a bootstrap: at 198/200
  one resample in seven has no spread, and a bootstrap-t of such data under-covers;
- a resample without spread is **kept** (its t is ±∞, or 0 when it equals the estimate), not dropped;
- each end of the interval has a **Monte-Carlo error** (order statistics of the resampled t), and
  resampling doubles until the goal sits clear of both ends by that error (the verdict is stable) or
  :data:`MAX_DRAWS` is reached; beyond :data:`CLT_EPISODES` episodes the t interval is used (the
  bootstrap's memory grows with episodes × resamples; the central limit theorem has long held there).
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
MAX_DRAWS = 64_000
"""The most resamples spent to make a verdict stable (the ends' Monte-Carlo error below the goal's distance)."""
CLT_EPISODES = 20_000
"""From this many episodes (one run) the t interval replaces the bootstrap: bounded memory, same coverage."""
CHUNK_CELLS = 2_000_000
"""Resampled cells (resamples × episodes) held at once: ~16 MB of float64."""
POWER = 0.80
"""The default probability that the episodes "that would decide" do decide."""
METHOD = "studentized bootstrap (bootstrap-t) over episodes"
WILSON = "Wilson score interval (success rate)"
T_INTERVAL = "t interval (≥ 20,000 episodes: the central limit theorem holds)"
_Z975 = 1.959963984540054


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish–Fisher expansion in the normal quantile (|error| < 0.01 for df ≥ 3
    at p = 0.975: 2.776 for df 4, 2.069 for df 23); used only for "how many episodes would decide"."""
    if df < 1:
        raise ValueError("df must be ≥ 1")
    if df == 1:  # exact: Cauchy
        return math.tan(math.pi * (p - 0.5))
    if df == 2:  # exact
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
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
    resamples: int = 0
    """Bootstrap resamples spent (0: no bootstrap)."""
    mc_error_low: float = 0.0
    """Monte-Carlo standard error of the low end (resampling noise, not sampling noise)."""
    mc_error_high: float = 0.0
    zero_spread_resamples: int = 0
    """Resamples that had no spread (one repeated value): kept, with t = ±∞ (or 0)."""
    successes: int | None = None
    """For a success rate: the successes among ``episodes`` (the Wilson interval's input)."""

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


def is_success_rate(matrix: np.ndarray) -> bool:
    """Every value 0 or 1, one run: a proportion (its interval is Wilson's, not a bootstrap)."""
    return matrix.shape[0] == 1 and bool(np.all((matrix == 0) | (matrix == 1)))


def wilson(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of a proportion (keeps ~95 % coverage down to 0/n and n/n)."""
    z = _normal_quantile(1 - (1 - level) / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _rate(matrix: np.ndarray, level: float, draws: int, seed: int) -> Estimate:
    n = matrix.shape[1]
    successes = int(matrix.sum())
    low, high = wilson(successes, n, level)
    mean = successes / n
    sd = float(matrix.std(ddof=1))
    # P(goal) from the Jeffreys posterior Beta(s + ½, f + ½) of the rate.
    posterior = np.random.default_rng(seed).beta(successes + 0.5, n - successes + 0.5, draws)
    return Estimate(mean, low, high, n, 1, sd, sd / math.sqrt(n), posterior, level, WILSON, successes=successes)


def _t_interval(matrix: np.ndarray, level: float, draws: int, seed: int) -> Estimate:
    n = matrix.shape[1]
    row = matrix[0]
    mean, sd = float(row.mean()), float(row.std(ddof=1))
    se = sd / math.sqrt(n)
    half = t_quantile(1 - (1 - level) / 2, n - 1) * se
    confidence = mean + se * np.random.default_rng(seed).standard_normal(draws)
    return Estimate(mean, mean - half, mean + half, n, 1, sd, se, confidence, level, T_INTERVAL)


def _conservative_t(matrix: np.ndarray, mean: float, se: float, sd: float, level: float, resamples: int,
                    flat: int, why: str) -> Estimate:
    """mean ± t(min(seeds, episodes) − 1)·se: Student's t with the conservative degrees of freedom."""
    seeds, episodes = matrix.shape
    df = max(1, min(seeds, episodes) - 1) if seeds > 1 else episodes - 1
    half = t_quantile(1 - (1 - level) / 2, df) * se
    low, high = _bounded(matrix, mean - half, mean + half)
    confidence = mean + se * np.random.default_rng(0).standard_t(df, max(resamples, DRAWS))
    return Estimate(mean, low, high, episodes, seeds, sd, se, confidence, level,
                    f"t interval, {df} degrees of freedom ({why})", resamples, 0.0, 0.0, flat)


def _bounded(matrix: np.ndarray, low: float, high: float) -> tuple[float, float]:
    """A mean of 0/1 values lies in [0, 1]: an interval end past it is cut there."""
    if bool(np.all((matrix == 0) | (matrix == 1))):
        return max(0.0, low), min(1.0, high)
    return low, high


def _resampled_t(matrix: np.ndarray, mean: float, rng: np.random.Generator, draws: int) -> tuple[np.ndarray, int]:
    """``draws`` bootstrap-t statistics, in chunks of at most :data:`CHUNK_CELLS` resampled cells; a
    resample without spread is kept: t = ±∞ by the side of its mean (0 when it equals the estimate)."""
    seeds, episodes = matrix.shape
    chunk = max(1, CHUNK_CELLS // (seeds * episodes))
    parts, flat = [], 0
    for start in range(0, draws, chunk):
        size = min(chunk, draws - start)
        cols = rng.integers(0, episodes, (size, episodes))
        if seeds == 1:  # one run: the common case, without the seeds axis (4× faster)
            resampled_1 = matrix[0][cols]
            boot_means = resampled_1.mean(axis=1)
            boot_se = np.sqrt(((resampled_1 - boot_means[:, None]) ** 2).sum(axis=1) / (episodes - 1) / episodes)
        else:
            rows = rng.integers(0, seeds, (size, seeds))
            resampled = matrix[rows[:, :, None], cols[:, None, :]]
            boot_means, boot_se = resampled.mean(axis=(1, 2)), _se(resampled)
        # Rounding leaves ~1e-15 of "spread" in a resample of one repeated value: that is none.
        none = boot_se <= 1e-12 * max(1.0, abs(mean))
        flat += int(none.sum())
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (boot_means - mean) / np.where(none, 1.0, boot_se)
        offset = np.round(boot_means[none] - mean, 12)
        t[none] = np.where(offset > 0, np.inf, np.where(offset < 0, -np.inf, 0.0))
        parts.append(t)
    return np.concatenate(parts), flat


def _ends(confidence: np.ndarray, level: float) -> tuple[float, float, float, float]:
    """The interval's ends and each one's Monte-Carlo standard error, from the order statistics around
    each quantile (a binomial ±1.96 σ band of ranks, divided by 2 × 1.96); non-finite when an end is."""
    with np.errstate(invalid="ignore"):
        return _ends_of(np.sort(confidence), level)


def _ends_of(ordered: np.ndarray, level: float) -> tuple[float, float, float, float]:
    count = len(ordered)
    tail = (1 - level) / 2
    ends, errors = [], []
    for p in (tail, 1 - tail):
        ends.append(float(np.quantile(ordered, p)))
        spread = _Z975 * math.sqrt(count * p * (1 - p))
        lo, hi = int(max(0, math.floor(count * p - spread))), int(min(count - 1, math.ceil(count * p + spread)))
        width = ordered[hi] - ordered[lo]
        errors.append(float(width / (2 * _Z975)) if np.isfinite(width) else math.inf)
    return ends[0], ends[1], errors[0], errors[1]


def estimate(values: Any, level: float = LEVEL, draws: int = DRAWS, seed: int = SEED,
             goal: float | None = None) -> Estimate:
    """The mean of per-episode values — a list (one run) or a seeds × episodes matrix (runs sharing
    their episodes) — with its interval. Needs ≥ 2 episodes: one has no spread. With ``goal``, the
    resampling goes on (doubling, up to :data:`MAX_DRAWS`) until neither end is within 2 Monte-Carlo
    errors of the goal: the verdict does not hang on resampling noise."""
    matrix = np.atleast_2d(np.asarray(values, dtype=np.float64))
    seeds, episodes = matrix.shape
    if episodes < 2:
        raise ValueError(f"{episodes} episode has no spread: an interval needs at least 2")
    if not np.all(np.isfinite(matrix)):
        raise ValueError("per-episode values must be finite")
    if is_success_rate(matrix):
        return _rate(matrix, level, draws, seed)
    if seeds == 1 and episodes >= CLT_EPISODES:
        return _t_interval(matrix, level, draws, seed)
    mean = float(matrix.mean())
    se = float(_se(matrix))
    sd = float(se * math.sqrt(episodes))
    if se == 0.0:
        return Estimate(mean, mean, mean, episodes, seeds, sd, se, np.full(1, mean), level)
    rng = np.random.default_rng(seed)
    t, flat = _resampled_t(matrix, mean, rng, draws)
    while True:
        confidence = mean - t * se
        low, high, mc_low, mc_high = _ends(confidence, level)
        stable = goal is None or (abs(low - goal) > 2 * mc_low and abs(high - goal) > 2 * mc_high)
        if not (math.isfinite(low) and math.isfinite(high)):
            # So few episodes that more than a tail's share of resamples repeat one value: the
            # bootstrap has no finite end; Student's t does (wide, which is the truth about them).
            return _conservative_t(matrix, mean, se, sd, level, len(t), flat,
                                   f"{flat} of {len(t):,} resamples had no spread: too few episodes for the bootstrap")
        if seeds > 1 and (high - low) / 2 > t_quantile(1 - (1 - level) / 2, min(seeds, episodes) - 1) * se:
            # A few seeds that differ a lot (0.36 vs 0.96 success): resamples repeating one seed have a
            # tiny se and a huge t; the t interval with the fewer of seeds and episodes as its degrees of
            # freedom is wide enough and does not swing with them.
            return _conservative_t(matrix, mean, se, sd, level, len(t), flat,
                                   f"the bootstrap over {seeds} seeds was wider and unstable")
        if stable or len(t) >= MAX_DRAWS:
            break
        more, more_flat = _resampled_t(matrix, mean, rng, len(t))
        t, flat = np.concatenate([t, more]), flat + more_flat
    low, high = _bounded(matrix, low, high)
    return Estimate(mean, low, high, episodes, seeds, sd, se, confidence, level, METHOD, len(t), mc_low, mc_high, flat)


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
    """UNDECIDED only: how many episodes in all (these and more of the same kind) decide it with probability
    ``power``, the uncertainty of the mean and of the spread counted (None: no practical number does)."""
    power: float = POWER
    """The probability of deciding that ``episodes_to_decide`` is computed for."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def holds(op: str, observed: Any, goal: float) -> Any:
    return {"<=": observed <= goal, "<": observed < goal, ">=": observed >= goal, ">": observed > goal}[op]


def decide(est: Estimate, op: str, goal: float, power: float = POWER) -> Decision:
    """PASS when the whole interval satisfies the goal, FAIL when none of it does, else UNDECIDED."""
    p_goal = float(np.mean(holds(op, est.draws, goal)))
    if bool(holds(op, est.high, goal)) and bool(holds(op, est.low, goal)):
        return Decision("PASS", p_goal, None, power)
    if not bool(holds(op, est.high, goal)) and not bool(holds(op, est.low, goal)):
        return Decision("FAIL", p_goal, None, power)
    if est.seeds > 1:  # the spread between seeds may dominate: more episodes of the same seeds may never decide
        return Decision("UNDECIDED", p_goal, None, power)
    return Decision("UNDECIDED", p_goal, episodes_for_power(est, goal, power), power)


ASSURANCE_DRAWS = 4000
"""Simulated futures behind "n episodes decide it with probability p" (the probability's own error ~0.6 %)."""


def assurance(est: Estimate, goal: float, more: int, draws: int = ASSURANCE_DRAWS, seed: int = SEED) -> float:
    """The probability that ``more`` further episodes of the same kind, pooled with these, give an interval
    clear of ``goal`` — averaged over what the truth may be given these episodes (the posterior of the mean
    and of the spread, Jeffreys' prior), not over the measured mean and spread taken as exact.

    Normal model: σ² ~ (n−1)s²/χ²(n−1), μ ~ N(x̄, σ²/n); the new episodes' mean ~ N(μ, σ²/m) and sum of
    squares ~ σ²χ²(m−1); decided when |pooled mean − goal| > t(n+m−1)·s_pooled/√(n+m). A success rate:
    p ~ Beta(s+½, f+½), new successes ~ Binomial(m, p), decided when the Wilson interval clears the goal.
    The draws are common to every ``more`` (fixed seed), so the search over ``more`` is smooth."""
    rng = np.random.default_rng(seed)
    n = est.episodes
    total = n + more
    if est.successes is not None:
        rate = rng.beta(est.successes + 0.5, n - est.successes + 0.5, draws)
        # Binomial(m, p) from one normal per draw, the same for every m (common random numbers: the
        # probability grows smoothly with m, so the search does not stop on noise; rng.binomial per m
        # kept its promise 72 % of the time, this 79 %: test_decision_power.py).
        z = rng.standard_normal(draws)
        new = np.clip(np.round(more * rate + z * np.sqrt(more * rate * (1 - rate))), 0, more)
        pooled = (est.successes + new) / total
        z = _normal_quantile(1 - (1 - est.level) / 2)
        centre = (pooled + z * z / (2 * total)) / (1 + z * z / total)
        half = z * np.sqrt(pooled * (1 - pooled) / total + z * z / (4 * total * total)) / (1 + z * z / total)
        return float(np.mean((centre - half > goal) | (centre + half < goal)))
    z_sigma, z_mean, z_new, z_chi = (rng.standard_normal(draws) for _ in range(4))
    df = max(1, n - 1)
    # χ²(df) by Wilson–Hilferty from one normal draw: common random numbers across every ``more``.
    def chi2(k: int, normal: np.ndarray) -> np.ndarray:
        return k * np.clip(1 - 2 / (9 * k) + normal * math.sqrt(2 / (9 * k)), 1e-6, None) ** 3
    ss = est.sd**2 * df
    sigma = np.sqrt(ss / chi2(df, z_sigma))
    truth = est.mean + sigma / math.sqrt(n) * z_mean
    if more == 0:
        pooled_mean, pooled_ss = np.full(draws, est.mean), np.full(draws, ss)
    else:
        new_mean = truth + sigma / math.sqrt(more) * z_new
        new_ss = sigma**2 * chi2(more - 1, z_chi) if more > 1 else np.zeros(draws)
        pooled_mean = (n * est.mean + more * new_mean) / total
        pooled_ss = ss + new_ss + n * more / total * (est.mean - new_mean) ** 2
    half = t_quantile(1 - (1 - est.level) / 2, total - 1) * np.sqrt(pooled_ss / (total - 1) / total)
    half = half * _BOOTSTRAP_WIDER(total)
    return float(np.mean(np.abs(pooled_mean - goal) > half))


def _BOOTSTRAP_WIDER(episodes: int) -> float:
    """How much wider decide's bootstrap-t interval is than Student's t on normal errors, on average:
    1 + 3.5/(n − 3)² (measured over 200 samples each: 1.26 at 6 episodes, 1.13 at 8, 1.05 at 12, 1.02
    at 16, 1.00 from 40). Without it, totals under ~15 episodes decide ~70 % of the time, not 80 %."""
    return 1.0 + 3.5 / (episodes - 3) ** 2 if episodes > 4 else 1.5


def episodes_for_power(est: Estimate, goal: float, power: float = POWER) -> int | None:
    """The fewest episodes in all (≥ the ones there are) whose interval clears ``goal`` with probability
    ``power`` (:func:`assurance`); None when even :data:`MAX_EPISODES` would not. One run only: with
    seeds × episodes the count of seeds matters too, and the t interval of the episode means stands in."""
    if not 0 < power < 1:
        raise ValueError("power must be between 0 and 1")
    if est.sd == 0 and est.successes is None:
        return est.episodes
    low, high = 0, MAX_EPISODES - est.episodes
    if high <= 0 or assurance(est, goal, high) < power:
        return None
    step = 1
    while step < high and assurance(est, goal, step) < power:  # doubling, then bisection
        low, step = step, step * 2
    high = min(step, high)
    while high - low > max(1, low // 100):  # to 1 %: the probability itself is known to ~0.6 %
        middle = (low + high) // 2
        if assurance(est, goal, middle) >= power:
            high = middle
        else:
            low = middle
    return est.episodes + high


def episodes_to_decide(sd: float, margin: float, level: float = LEVEL) -> int | None:
    """Smallest n with t(n−1)·sd/√n < margin: the episodes whose interval would clear the goal if the mean
    and the spread stayed exactly as measured — which decides only about half the time it promises to
    (the simulation in ``test_decision_power.py``); :func:`episodes_for_power` is what decide reports.
    None when the mean sits on the goal (no n is enough)."""
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

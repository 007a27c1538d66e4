""""n episodes would decide it" is a promise with a probability (80 %): checked by simulation.

Seed 20261207 (numpy's default_rng). Each scenario draws a truth — the mean anywhere within ±40 mm of
the goal (a flat prior: the evaluator does not know where the truth is), the spread 10–40 mm — then
the team's first evaluation (5 or 24 episodes, normal or right-skewed log-normal errors). When decide
says UNDECIDED with "N episodes in all decide it", the scenario evaluates N − n more episodes of the
same truth and decides again on all of them with decide's own statistics (bootstrap-t, Monte-Carlo
stable). The share that then decides is the promise kept; it must be 72–88 % for an 80 % promise (about 100–270 scenarios ask, so ±2 standard errors;
measured with this seed: 0.80 / 0.77 normal, 0.81 / 0.79 log-normal, first 5 / 24 episodes).

The old figure (mean and sd taken as exact, :func:`episodes_to_decide`) is run on the same scenarios:
it keeps its promise only about half the time, which is why decide no longer reports it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from idmctl.track.goal_stats import decide, episodes_to_decide, estimate

SEED = 20261207
SCENARIOS = 400
GOAL = 125.0
MOST = 3000
"""Scenarios asking for more episodes than this are counted apart (the simulation's cost, not the promise)."""


def _draw(rng: np.random.Generator, shape: str, mean: float, sd: float, n: int) -> np.ndarray:
    if shape == "normal":
        return rng.normal(mean, sd, n)
    s2 = math.log(1 + (sd / mean) ** 2)  # log-normal with this mean and sd: right-skewed, positive
    return rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), n)


def _kept(shape: str, first: int, plug_in: bool) -> tuple[int, int]:
    rng = np.random.default_rng(SEED)
    asked = kept = 0
    for index in range(SCENARIOS):
        truth, sd = GOAL + rng.uniform(-40, 40), rng.uniform(10, 40)
        values = _draw(rng, shape, truth, sd, first)
        est = estimate(values, goal=GOAL, seed=index)
        verdict = decide(est, "<=", GOAL)
        if verdict.verdict != "UNDECIDED":
            continue
        n = episodes_to_decide(est.sd, abs(est.mean - GOAL)) if plug_in else verdict.episodes_to_decide
        if n is None or n > MOST:
            continue
        asked += 1
        pooled = np.concatenate([values, _draw(rng, shape, truth, sd, max(0, n - first))])
        kept += decide(estimate(pooled, goal=GOAL, seed=index), "<=", GOAL).verdict != "UNDECIDED"
    return asked, kept


@pytest.mark.parametrize("first", [5, 24])
@pytest.mark.parametrize("shape", ["normal", "lognormal"])
def test_the_episodes_that_would_decide_do_decide_80_percent_of_the_time(shape: str, first: int):
    asked, kept = _kept(shape, first, plug_in=False)
    assert asked >= 50, f"only {asked} undecided scenarios: the test exercises too little"
    share = kept / asked
    assert 0.72 <= share <= 0.88, f"{shape}, {first} episodes first: {kept}/{asked} = {share:.3f} decided"


def test_the_plug_in_figure_keeps_its_promise_only_about_half_the_time():
    asked, kept = _kept("normal", 5, plug_in=True)
    assert kept / asked < 0.70, f"{kept}/{asked}"


def test_a_success_rate_keeps_the_promise_too():
    """Success rates (0/1, Wilson's interval): truth 0.45–0.95 against a goal of ≥ 0.75, 20 episodes first."""
    rng = np.random.default_rng(SEED)
    asked = kept = 0
    for index in range(SCENARIOS):
        truth = rng.uniform(0.45, 0.95)
        first = (rng.random(20) < truth).astype(float)
        verdict = decide(estimate(first, goal=0.75, seed=index), ">=", 0.75)
        if verdict.verdict != "UNDECIDED" or verdict.episodes_to_decide is None or verdict.episodes_to_decide > MOST:
            continue
        asked += 1
        pooled = np.concatenate([first, (rng.random(verdict.episodes_to_decide - 20) < truth).astype(float)])
        kept += decide(estimate(pooled, goal=0.75, seed=index), ">=", 0.75).verdict != "UNDECIDED"
    # Measured with this seed: 192 / 242 = 0.79.
    assert asked >= 50 and 0.72 <= kept / asked <= 0.88, f"{kept}/{asked}"

"""The README's first command, end to end on real components: robosuite demos, the tiny-Cosmos cache,
preflight with smoke, the local executor, the Fabric trainer, MLflow, simulator replay, compare."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


@pytest.mark.slow
def test_quickstart_from_an_empty_home_ends_with_a_sim_eef_compare_row(cli, idmctl_home: Path) -> None:
    assert not idmctl_home.exists()
    result = cli("quickstart")
    assert result.exit_code == 0, result.output[-3000:]
    output = result.output
    for k, name in enumerate(["specs", "demos", "cache", "preflight", "submit", "train", "eval", "compare", "report"], 1):
        assert f"[{k}/9] {name}: " in output, name
    assert "[2/9] demos: 12 Lift demos × 50 steps" in output
    assert "splits train 8, valid 4" in output
    assert "[3/9] cache: 12 built, 0 already cached, 12 demos" in output
    assert re.search(r"\[4/9\] preflight: 9 PASS in", output)
    assert re.search(r"\[6/9\] train: job \d+ COMPLETED", output)
    # Stage 9: the card from the record, its TL;DR deciding the goal with its interval.
    assert re.search(r"\[9/9\] report: the quickstart card from the record \(\d+ sections, \d+ open items\)", output)
    assert "# Where quickstart stands" in output and "- decision: quickstart#1: " in output

    losses = re.search(r"loss (\d+\.\d+) → (\d+\.\d+)", output)
    assert losses and float(losses.group(2)) < 0.7 * float(losses.group(1))
    scores = re.search(r"eef_mm_4ep (\d+\.\d) mm \(untrained (\d+\.\d) mm\); "
                       r"sim_eef_mm_4ep (\d+\.\d) mm \(untrained (\d+\.\d) mm\)", output)
    assert scores, output[-3000:]
    offline, offline_untrained, sim, sim_untrained = map(float, scores.groups())
    # The simulator's verdict: the trained IDM's actions track the demos far better than its start.
    assert sim < 0.6 * sim_untrained
    assert offline < offline_untrained

    from idmctl.track.compare import build_report

    report = build_report(["quickstart"], metric="sim_eef_mm_4ep")
    runs = [row for row in report.rows if row.kind == "run"]
    assert len(runs) == 1 and runs[0].label == "quickstart#1"
    assert runs[0].metrics["sim_eef_mm_4ep"].last == pytest.approx(sim, abs=0.06)
    assert "sim EEF mm (4 ep)" in output and "quickstart#1" in output
    # The Lift numbers are their own protocol: never in a column of card A's MG-30 numbers.
    assert runs[0].protocols == {"eef_mm_4ep": "offline:Lift/valid:4ep", "sim_eef_mm_4ep": "sim:Lift/valid:4ep"}
    assert "offline:Lift/valid:4ep: quickstart#1" in output

    # decide: an interval and a verdict from the per-episode results the trainer logged at step 200.
    decided = cli("decide", "quickstart", "--json")
    assert decided.exit_code == 0, decided.output
    decision = __import__("json").loads(decided.output)["decisions"][0]
    assert decision["goal"] == "eef_mm_4ep <= 60" and decision["protocol"] == "offline:Lift/valid:4ep"
    assert decision["runs"][0]["step"] == 200 and len(decision["runs"][0]["episodes"]) == 4
    estimate = decision["estimate"]
    assert estimate["low"] <= estimate["mean"] <= estimate["high"]
    assert estimate["mean"] == pytest.approx(offline, abs=0.06)
    assert decision["verdict"] in ("PASS", "FAIL", "UNDECIDED")
    assert "decide quickstart#1: goal eef_mm_4ep <= 60" in output and "  verdict: " in output

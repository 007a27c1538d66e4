"""``idmctl decide`` tells the team each verdict it writes, once: the real trainer-logged MLflow runs of
tests/idmctl/track/test_decide.py, the real apprise, a real HTTP server receiving the JSON webhook."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.contract import ENV_EXPERIMENTS, ENV_HOME, ENV_NOTIFY
from test_decide import SPEC, _train_run
from test_notify import TOKEN, Webhook, webhook  # noqa: F401  (the fixture)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    specs = tmp_path / "experiments"
    specs.mkdir()
    (specs / "qdecide.yaml").write_text(SPEC.format(lr="3.0e-3"))
    (specs / "qclose.yaml").write_text(SPEC.format(lr="1.0e-3"))
    monkeypatch.setenv(ENV_EXPERIMENTS, str(specs))
    monkeypatch.setenv(ENV_HOME, str(tmp_path / "home"))
    return {"pass": _train_run(tmp_path, "qdecide", 1, {200: [38.0, 44.5, 41.0, 35.5]}),
            "close": _train_run(tmp_path, "qclose", 3, {200: [55.0, 66.0, 58.0, 63.0]})}


def test_a_verdict_is_announced_once_with_goal_interval_and_runs(cli, monkeypatch, runs, webhook: Webhook, caplog) -> None:
    monkeypatch.setenv(ENV_NOTIFY, webhook.url("/hooks/team"))
    first = cli("decide", "qdecide#1")
    assert first.exit_code == 0, first.output
    [message] = webhook.messages("/hooks/team")
    assert message["title"] == "idmctl decide qdecide#1: PASS" and message["type"] == "success"
    assert message["event"] == "verdict" and message["subject"] == "qdecide#1"
    assert message["goal"] == "sim_eef_mm_4ep <= 60 under sim:Lift/valid:4ep"
    assert message["verdict"] == "PASS (the whole interval [34.0, 47.8] mm is <= 60 mm)"
    assert message["estimate"] == "mean 39.8 mm = 159.0 mm / 4 episodes"
    assert message["runs"] == f"qdecide#1 (MLflow run {runs['pass']}, step 200)"
    assert message["done"] == "verdict tagged on the runs (idmctl.decision.*)"

    again = cli("decide", "qdecide#1")
    assert again.exit_code == 0 and again.output == first.output
    assert cli("decide", "qclose#3", "--no-tags").exit_code == 0  # a verdict not written is not announced
    assert len(webhook.received) == 1
    assert [r for r in caplog.records if r.name == "idmctl"] == []


def test_a_failing_notifier_leaves_decide_as_it_was(cli, monkeypatch, runs, webhook: Webhook, caplog) -> None:
    unannounced = cli("decide", "qclose#3")  # no notifier configured: the verdict, the tags and the UI links
    monkeypatch.setenv(ENV_NOTIFY, webhook.url(f"/fail/{TOKEN}"))
    result = cli("decide", "qclose#3")
    assert result.exit_code == 0, result.output
    assert "MLflow: 1 run(s) tagged idmctl.decision.* (verdict, interval, P(goal))\n" in unannounced.output
    assert result.output == unannounced.output
    [line] = [r.getMessage() for r in caplog.records if r.name == "idmctl"]
    assert line.startswith(f"warning: notification (verdict) not sent to json://127.0.0.1:{webhook.port}/*** "
                           f"({ENV_NOTIFY} entry 1): "), line
    assert TOKEN not in result.output + caplog.text

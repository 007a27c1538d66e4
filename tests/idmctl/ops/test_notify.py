"""The team is told: sync's decisions (a failure and what was done, a chain stopped, a chain completed) and
decide's verdicts arrive as apprise JSON webhooks at a real HTTP server on 127.0.0.1.

Real local jobs (the local executor), the real store, the real classifier and the real apprise; nothing
is faked. A server that is down is a port nobody listens on; one that fails answers 500.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ground import contract
from ground.contract import ENV_NOTIFY
from ground.redact import notify_secrets, redacted_notify_url, scrub_environment
from idmctl.ops.executors.local import LocalExecutor
from idmctl.ops.failures.classify import get_cause
from idmctl.record.db import session
from idmctl.record.models import Job
from net_support import free_port
from test_sync_failure_order import EXCEPTION, PREEMPTED, _submit as submit_local, _sync

REPO = Path(__file__).resolve().parents[3]
TOKEN = "Wk7hookKeyZq93"
PASSWORD = "pw-Zq7Secr3t"


class Webhook:
    """A JSON webhook receiver: every POST body by path; ``/fail…`` answers 500."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((self.path, json.loads(body)))
                self.send_response(500 if self.path.startswith("/fail") else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"json://127.0.0.1:{self.port}{path}"

    def messages(self, path: str) -> list[dict[str, str]]:
        """Each message to ``path`` as its ``key: value`` lines, with the title under ``title``."""
        found = []
        for where, payload in self.received:
            if where == path:
                lines = dict(line.split(": ", 1) for line in payload["message"].splitlines())
                found.append({"title": payload["title"], "type": payload["type"], **lines})
        return found


@pytest.fixture
def webhook():
    server = Webhook()
    yield server
    server.server.shutdown()
    server.server.server_close()


def _submit(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, sample: tuple[str, int] | None) -> dict:
    """One local job that prints ``sample``'s log and exits with its status (None: it completes), ended."""
    submitted = submit_local(cli, monkeypatch, tmp_path, name, sample)
    LocalExecutor().wait(submitted["scheduler_id"], timeout_s=120)
    return submitted


def _job(job_id: int) -> Job:
    with session() as db:
        job = db.get(Job, job_id)
        assert job is not None
        return job


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "idmctl"]


def test_each_decision_of_sync_arrives_once_with_job_cause_evidence_fix_and_what_was_done(
        cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, webhook: Webhook, caplog) -> None:
    """A loader exception stops its chain, a preempted job is resubmitted, a job completes: three messages
    from one sync; the resubmission completing is the fourth, from the next sync; a third sync and a
    second announcement of an event already sent send nothing."""
    stops = _submit(cli, monkeypatch, tmp_path, "exception", EXCEPTION)
    resumes = _submit(cli, monkeypatch, tmp_path, "preempted", PREEMPTED)
    completes = _submit(cli, monkeypatch, tmp_path, "completes", None)
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")  # what the preempted chain's resubmission does
    monkeypatch.setenv(ENV_NOTIFY, webhook.url("/hooks/team"))

    report = _sync(cli)
    [(old, new)] = report["resubmitted"]
    assert old == resumes["job"]
    by_job = {message["job"].rsplit("idmctl job ", 1)[1].rstrip(")"): message for message in webhook.messages("/hooks/team")}
    assert sorted(by_job) == sorted(str(submitted["job"]) for submitted in (stops, resumes, completes))

    stopped = by_job[str(stops["job"])]
    assert stopped["event"] == "chain_stopped" and stopped["type"] == "failure"
    assert stopped["job"] == f"quickstart#{stops['chain']} attempt 1, local job {stops['scheduler_id']} (idmctl job {stops['job']})"
    assert stopped["cause"] == "python_exception"
    assert stopped["evidence"] == ("TypeError: __init__() got an unexpected keyword argument 'selected_layer_indices' "
                                   "at /home/team/idm/cache/dataset.py:568")
    assert stopped["fix"] == get_cause("python_exception").fix
    assert stopped["done"] == f"chain stopped: {dict(report['stopped'])[stops['job']]}"
    assert stopped["title"] == f"idmctl: quickstart chain {stops['chain']} stopped (python_exception)"

    resubmitted = by_job[str(resumes["job"])]
    new_job = _job(new)
    assert resubmitted["event"] == "failure" and resubmitted["cause"] == "preempted"
    assert resubmitted["fix"] == get_cause("preempted").fix
    assert re.fullmatch(r"preempted after running [\d.]+ s", resubmitted["evidence"]), resubmitted  # as `failures` shows it
    assert resubmitted["done"].startswith(f"resubmitted as local job {new_job.scheduler_id} (idmctl job {new}, attempt 2): ")

    completed = by_job[str(completes["job"])]
    assert (completed["event"], completed["type"], completed["done"]) == ("chain_completed", "success",
                                                                          "chain completed at attempt 1")
    assert "cause" not in completed

    LocalExecutor().wait(new_job.scheduler_id or "", timeout_s=120)
    _sync(cli)
    fourth = webhook.messages("/hooks/team")[3:]
    assert [(m["event"], m["job"]) for m in fourth] == [
        ("chain_completed", f"quickstart#{resumes['chain']} attempt 2, local job {new_job.scheduler_id} (idmctl job {new})")]

    _sync(cli)  # nothing ended since: nothing to say
    from idmctl.ops.notify import announce_decision
    from idmctl.ops.retry import Decision
    from idmctl.ops.sync import SyncReport

    # A second sync deciding the same job (a manual sync racing the chain's controller) claims it in vain.
    announce_decision(completes["job"], Decision("done", "completed", "finished"), SyncReport())
    assert len(webhook.received) == 4
    assert _warnings(caplog) == []


def test_a_server_down_or_answering_500_leaves_sync_as_it_was_with_one_line_each_and_no_secret(
        cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, webhook: Webhook) -> None:
    """The real command in its own process (what an operator's terminal shows): the chain stops as it
    would with no notifier, each failed target is one warning line on stderr, masked, and neither the
    password nor the webhook key is printed anywhere — nor apprise's own log lines."""
    stops = _submit(cli, monkeypatch, tmp_path, "exception", EXCEPTION)
    down = f"json://team:{PASSWORD}@127.0.0.1:{free_port()}/hooks/{TOKEN}"
    failing = webhook.url(f"/fail/{TOKEN}")
    env = {**os.environ, ENV_NOTIFY: f"{down}, {failing}"}
    result = subprocess.run([sys.executable, "-m", "idmctl", "sync", "--json"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [job for job, _ in report["stopped"]] == [stops["job"]]
    assert report["finished"] == [stops["job"]] and report["resubmitted"] == []
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("warning: notification (chain_stopped) not sent to json://***@127.0.0.1:"), lines
    assert f"({ENV_NOTIFY} entry 1)" in lines[0]
    assert lines[1].startswith(f"warning: notification (chain_stopped) not sent to json://127.0.0.1:{webhook.port}/*** "
                               f"({ENV_NOTIFY} entry 2): "), lines
    assert "500" in lines[1]
    assert [path for path, _ in webhook.received] == [f"/fail/{TOKEN}"]  # it was tried, once
    for secret in (PASSWORD, TOKEN):
        assert secret not in result.stdout + result.stderr
    assert _job(stops["job"]).state == "FAILED"


def test_a_malformed_url_is_one_warning_for_sync_and_exit_2_for_the_check(
        cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, webhook: Webhook, caplog) -> None:
    """A URL apprise cannot use, in a cluster profile: sync stops the chain as always, with one warning
    naming the profile's file and entry (the token masked), and sends to the good URL beside it; ``idmctl
    notify --test`` (the check an operator runs after configuring) is exit 2 with one line."""
    profile = tmp_path / "team.yaml"
    local = (REPO / "clusters" / "local.yaml").read_text()
    profile.write_text(local.replace("name: local", "name: team")
                       + f"notify:\n  - nosuchscheme://{TOKEN}/x\n  - {webhook.url('/hooks/team')}\n")
    monkeypatch.setenv(contract.ENV_CLUSTER, str(profile))
    stops = _submit(cli, monkeypatch, tmp_path, "exception", EXCEPTION)

    report = _sync(cli)
    assert [job for job, _ in report["stopped"]] == [stops["job"]]
    [line] = _warnings(caplog)
    assert line.startswith(f"warning: notification (chain_stopped) not sent to nosuchscheme://***/*** ({profile} notify[0]): "
                           "not a notification URL apprise can use"), line
    assert [m["event"] for m in webhook.messages("/hooks/team")] == ["chain_stopped"]

    checked = cli("notify", "--test")
    assert checked.exit_code == 2
    assert checked.output.strip().splitlines() == [
        f"error: {profile} notify[0]: not a notification URL apprise can use (nosuchscheme://***/***) "
        "(use an apprise URL such as json://HOST:PORT/PATH, slack://TOKEN_A/TOKEN_B/TOKEN_C, mailto://USER:PASS@HOST)"]
    assert TOKEN not in checked.output + caplog.text
    assert len(webhook.received) == 1  # the check sent nothing, since one URL is bad


def test_notify_test_sends_one_message_to_each_url_and_fails_on_one_that_does_not_answer(
        cli, monkeypatch: pytest.MonkeyPatch, webhook: Webhook, caplog) -> None:
    monkeypatch.setenv(ENV_NOTIFY, webhook.url("/hooks/team"))
    result = cli("notify", "--test")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"notify: sent a test message to json://127.0.0.1:{webhook.port}/*** "
                                          f"({ENV_NOTIFY} entry 1)"]
    [message] = webhook.messages("/hooks/team")
    assert message["event"] == "test"

    monkeypatch.setenv(ENV_NOTIFY, f"{webhook.url('/hooks/team')} {webhook.url('/fail/' + TOKEN)}")
    result = cli("notify", "--test")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1].startswith("error: 1 of 2 notification URLs did not take the test message")
    assert TOKEN not in result.output + caplog.text

    monkeypatch.setenv(ENV_NOTIFY, "")
    result = cli("notify", "--test")
    assert (result.exit_code, result.output.strip()) == (0, f"notify: no URL configured ({ENV_NOTIFY} is set and empty: "
                                                            "nothing is sent)")


@pytest.mark.parametrize("url, shown", [
    (f"json://team:{PASSWORD}@hooks.example.org/x/{TOKEN}?rto=2", "json://***@hooks.example.org/***?***"),
    (f"slack://{TOKEN}/B0{TOKEN}/C1{TOKEN}/#alerts", "slack://***/***?***"),
    (f"ntfy://{TOKEN}", "ntfy://***"),
    (f"discord://1234567/{TOKEN}", "discord://***/***"),
    (f"mailto://me:{PASSWORD}@example.org?to=team@example.org", "mailto://***@***"),  # an @ in the query: over-masked
    (f"tgram://{TOKEN}:AAH/123", "tgram://***/***"),
])
def test_the_secret_parts_of_notification_urls_are_masked_and_scrubbed(monkeypatch, url: str, shown: str) -> None:
    assert redacted_notify_url(url) == shown
    for secret in (s for s in (PASSWORD, TOKEN) if s in url):
        assert secret not in redacted_notify_url(url)
        text = f"apprise: failed to reach {url} ({secret})"
        for found in notify_secrets(url):
            text = text.replace(found, "***")
        assert secret not in text
    # The net under every printed line knows IDMCTL_NOTIFY's secrets too, without an '@' in the URL.
    monkeypatch.setenv(ENV_NOTIFY, f"json://127.0.0.1:9/x {url}")
    assert TOKEN not in scrub_environment(f"error from {url}")


def test_a_server_that_never_answers_costs_one_timeout_and_a_warning(caplog) -> None:
    """A listening socket that never reads nor answers (the kernel completes the connection): the send
    gives up after the read timeout instead of holding sync, and says so in one line."""
    import socket

    from idmctl.ops.notify import TIMEOUT_S, Message, Target, send

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        target = Target(f"json://127.0.0.1:{port}/hooks/{TOKEN}", f"{ENV_NOTIFY} entry 1")
        failed = send(Message("failure", "t", ["event: failure"]), [target])
    assert len(failed) == 1 and failed[0].startswith(
        f"warning: notification (failure) not sent to json://127.0.0.1:{port}/*** ({ENV_NOTIFY} entry 1): ")
    assert [r.getMessage() for r in caplog.records if r.name == "idmctl"] == failed
    assert TOKEN not in caplog.text and TIMEOUT_S <= 5

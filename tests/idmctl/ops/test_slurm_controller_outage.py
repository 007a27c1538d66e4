"""A chain never waits for a person, on the real local Slurm and a real PostgreSQL store: the store is
stopped while an attempt waits (held) and then runs to its end, so the controller that follows it finds
the store down. It leaves a follow-up controller (``--begin`` after the profile's backoff), tells the team
through a real webhook, and the follow-up that still finds the store down leaves the next; once the store
is back, that one catches up from sacct and the chain completes with nobody running sync.

The PostgreSQL is a private one this test starts (scripts/postgres/up.sh on its own root and port) and
stops: never the shared server other engineers' tests use. The backoff is the profile's
``controller.outage_backoff``, 4 s here (2 min by default) so the test waits seconds, not minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ground import contract
from ground.paths import REPO_ROOT, clusters_dir
from idmctl.record.records import JobRecord
from net_support import free_port
from slurm_support import sh, text_so_far, wait_until
from test_notify import Webhook

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_home")]

BACKOFF_S = 4
TRIES = 3


class PrivatePostgres:
    """A PostgreSQL of this test's own (its root, its port), stopped and started by the test."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="idmctl-pg-outage-"))
        self.port = free_port()
        self.env = {**os.environ, "IDMCTL_PG_ROOT": str(self.root), "IDMCTL_PG_PORT": str(self.port)}
        self.url = f"postgresql://idmctl:idmctl@127.0.0.1:{self.port}/idmctl"

    def _script(self, name: str) -> None:
        done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "postgres" / name)], env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"

    def start(self) -> None:
        self._script("up.sh")

    def stop(self) -> None:
        self._script("down.sh")

    def remove(self) -> None:
        self._script("down.sh")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    if not shutil.which("pg_ctl") and not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        pytest.skip("no PostgreSQL server binaries (scripts/system_deps.sh installs them)")
    server = PrivatePostgres()
    server.start()
    try:
        yield server
    finally:
        from idmctl.record.db import dispose_engines

        dispose_engines()
        server.remove()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    server = Webhook()
    yield server
    server.server.shutdown()
    server.server.server_close()


def _events(webhook: Webhook) -> list[dict[str, str]]:
    return webhook.messages("/team")


def _controller_logs(run_dir: Path) -> str:
    return "".join(text_so_far(path) for path in sorted(run_dir.glob("controller-*.out")))


def _chain(chain_id: int) -> tuple[str | None, list[JobRecord]]:
    """The chain's status and attempts, read afresh from the store (None while it does not answer)."""
    from idmctl.ops.controller import chain_state

    try:
        return chain_state(chain_id)
    except Exception:  # the store is coming back: pooled connections are pinged and replaced
        return None, []


def test_a_store_outage_as_an_attempt_ends_is_caught_up_by_a_follow_up_controller(
        cli, private_pg: PrivatePostgres, webhook: Webhook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = yaml.safe_load((clusters_dir() / "local-slurm.yaml").read_text())
    profile["controller"] = {**profile["controller"], "enabled": True, "outage_tries": TRIES,
                             "outage_backoff": f"{BACKOFF_S}s"}
    path = tmp_path / "controlled.yaml"
    path.write_text(yaml.safe_dump(profile))
    monkeypatch.setenv(contract.ENV_CLUSTER, str(path))
    monkeypatch.setenv(contract.ENV_DB_URL, private_pg.url)
    monkeypatch.setenv(contract.ENV_NOTIFY, webhook.url("/team"))
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:4:0.25")
    # A tree edited while submit snapshots it is refused with "submit again": a working tree shared with
    # other editors (as this suite's may be) gets a few tries.
    def submitted():  # type: ignore[no-untyped-def]
        got = cli("submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason", "store outage test",
                  "--json", "--mem", "300MB", "--hold", "-J", "ctl-outage")
        return got if got.exit_code == 0 or "cannot write the code snapshot" not in got.output else None

    result = wait_until(submitted, 60, "a submit whose snapshot no editor raced")
    assert result.exit_code == 0, result.output
    sub = json.loads(result.stdout)
    chain_id, log, run_dir = sub["chain"], Path(sub["log"]), Path(sub["script"]).parent
    first = _chain(chain_id)[1][0].controller["scheduler_id"]  # type: ignore[index]

    # Held at submit, so the store is down before the attempt can run and end: its controller finds it so.
    private_pg.stop()
    try:
        sh("scontrol", "release", sub["scheduler_id"])
        wait_until(lambda: "entry: done 4 steps" in text_so_far(log), 90,
                   f"job {sub['scheduler_id']} to run to its end with the store down")
        outage = wait_until(lambda: [m for m in _events(webhook) if m["event"] == "controller_outage"], 90,
                            lambda: f"the outage message from controller {first} (logs: {_controller_logs(run_dir)[-800:]})")
        # The first follow-up finds the store down too and leaves the second: two tries, then the store.
        wait_until(lambda: f"(try 2 of {TRIES})" in _controller_logs(run_dir), 60,
                   lambda: f"follow-up 1 to leave follow-up 2 (logs: {_controller_logs(run_dir)[-800:]})")
    finally:
        private_pg.start()
    (message,) = outage
    assert message["title"] == f"idmctl: chain {chain_id}'s controller could not reach the store", message
    assert message["chain"] == f"{chain_id} (after job {sub['scheduler_id']})"
    assert message["done"].startswith("follow-up controller job ") and f"(try 1 of {TRIES}) starts in {BACKOFF_S} s" \
        in message["done"], message
    assert "idmctl:idmctl@" not in json.dumps(webhook.received)  # the store's password is never sent

    def recorded() -> list[dict] | None:  # the controller notes its run after its sync completed the chain
        status, attempts = _chain(chain_id)
        return attempts if status == "COMPLETED" and (attempts[0].controller or {}).get("last_run") else None

    attempts = wait_until(recorded, 90, lambda: f"chain {chain_id} to complete once the store is back and its "
                                                f"controller to record its run (logs: {_controller_logs(run_dir)[-800:]})")
    (attempt,) = attempts
    assert attempt.state == "COMPLETED", attempt
    ran = attempt.controller["last_run"]  # type: ignore[index]
    logs = _controller_logs(run_dir)
    # Each controller that found the store down left exactly one follow-up; the last one left found it
    # again (2 under light load; 3 when the restart took longer than the second backoff).
    failed = logs.count("nothing was recorded: follow-up controller job")
    assert ran["ok"] and ran["follow_up"] == failed >= 2 and ran["outage_from"] == first, (attempt.controller, logs)
    caught = wait_until(lambda: [m for m in _events(webhook) if m["event"] == "controller_caught_up"], 30,
                        "the caught-up message")
    assert caught[0]["done"].startswith(f"follow-up {failed} (controller job {ran['scheduler_id']}) found the store "
                                        "again: "), caught
    assert [m["event"] for m in _events(webhook)] == ["controller_outage", "chain_completed", "controller_caught_up"]
    wait_until(lambda: not sh("squeue", "-h", "-n", f"idmctl-controller-{chain_id}", "-o", "%i", check=False).strip(),
               30, f"chain {chain_id}'s controllers to leave the queue")

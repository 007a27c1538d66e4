"""No part of a store URL's credentials is ever printed, whatever their form, on any path that prints a
URL: the error of every command that opens the store, ``--json``, ``doctor`` (table and JSON),
``--debug`` tracebacks. The server is real but does not answer (127.0.0.1 on a port nobody listens on)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ground.contract import ENV_DB_URL
from ground.redact import redacted, scrub_environment
from net_support import free_port
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


PORT = free_port()
SECRET = "Zq7Secr3t"
URLS = {
    "slash": f"postgresql://team:{SECRET}/x@127.0.0.1:{PORT}/idmctl",
    "hash": f"postgresql://team:{SECRET}#x@127.0.0.1:{PORT}/idmctl",
    "question": f"postgresql://team:{SECRET}?x@127.0.0.1:{PORT}/idmctl",
    "at": f"postgresql://team:{SECRET}@x@127.0.0.1:{PORT}/idmctl",
    "plain": f"postgresql://team:{SECRET}@127.0.0.1:{PORT}/idmctl",
    "query": f"postgresql://team@127.0.0.1:{PORT}/idmctl?password={SECRET}&sslmode=disable",
    "user_only": f"postgresql://{SECRET}@127.0.0.1:{PORT}/idmctl",
    "malformed": f"postgresql://team:{SECRET}@[::1:{PORT}/idmctl",
    "huge_port": f"postgresql://team:{SECRET}@127.0.0.1:99999999999999999999999/idmctl",
    "driver": f"postgresql+psycopg://team:{SECRET}/?#@127.0.0.1:{PORT}/idmctl",
}


@pytest.mark.parametrize("form", sorted(URLS))
def test_the_redaction_helper_keeps_no_part_of_a_credential(form: str) -> None:
    shown = redacted(URLS[form])
    assert SECRET not in shown and "Secr" not in shown, shown
    assert shown.startswith(URLS[form].split("://")[0] + "://")
    if form not in ("malformed",):
        assert "127.0.0.1" in shown, shown  # the host stays: it is what the user needs to check


def test_text_is_scrubbed_of_the_environments_secrets(monkeypatch) -> None:
    monkeypatch.setenv(ENV_DB_URL, URLS["slash"])
    assert scrub_environment(f"libpq: host {SECRET}/x unknown") == "libpq: host *** unknown"


COMMANDS = [("jobs",), ("jobs", "--json"), ("failures",), ("failures", "--json"), ("ledger",), ("jobs", "show", "1"),
            ("--debug", "failures")]


@pytest.mark.parametrize("form", sorted(URLS))
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_no_command_prints_the_secret(cli, monkeypatch, form: str, command: tuple[str, ...]) -> None:
    monkeypatch.setenv(ENV_DB_URL, URLS[form])
    result = cli(*command)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    text = result.output + (repr(result.exception) if crashed else "")
    assert SECRET not in text and "Secr" not in text, text
    if command[0] != "--debug":
        assert result.exit_code == 2, text
        lines = text.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {ENV_DB_URL}: "), text


@pytest.mark.parametrize("form", ["slash", "query", "user_only", "plain"])
def test_doctor_checks_the_shared_store_it_is_told_to_use_and_never_prints_its_secret(form: str, monkeypatch,
                                                                                     idmctl_home) -> None:
    env = {**__import__("os").environ, ENV_DB_URL: URLS[form]}
    run = subprocess.run([sys.executable, "-m", "idmctl", "doctor", "--no-render", "--json"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert SECRET not in run.stdout + run.stderr, run.stdout + run.stderr
    assert run.returncode == 1, run.stdout + run.stderr  # the store does not answer: a FAIL row, not "ready"
    rows = {row["name"]: row for row in json.loads(run.stdout)["rows"]}
    assert rows["store"]["status"] == "FAIL" and "127.0.0.1" in rows["store"]["detail"], rows["store"]
    table = subprocess.run([sys.executable, "-m", "idmctl", "doctor", "--no-render"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert SECRET not in table.stdout + table.stderr and "ready" not in table.stdout, table.stdout


def test_doctor_on_the_real_shared_store_says_its_level(monkeypatch) -> None:
    from pg_support import fresh_database

    with fresh_database() as url:
        from idmctl.record import db as store_db

        monkeypatch.setenv(ENV_DB_URL, url)
        store_db.open_store()  # migrates it, as any command would
        from idmctl.ops.doctor import check_store

        row = check_store()
    assert row.status == "OK" and "migration head" in row.detail and ":idmctl@" not in row.detail, row


def test_warnings_on_stderr_are_scrubbed_of_the_environments_secrets(monkeypatch, capsys) -> None:
    """A warning that quotes an exception (MLflow's, a driver's) holding a URL with its password."""
    from idmctl.cli.output import err_console

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"postgresql://ml:{SECRET}@db/mlflow")
    err_console.print(f"warning: could not log to MLflow: connection to postgresql://ml:{SECRET}@db/mlflow failed",
                      markup=False)
    assert SECRET not in capsys.readouterr().err

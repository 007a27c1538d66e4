"""Every value that came from a user, a file or a log is printed as it is: text such as ``[/x]`` or
``[bold]`` in a description, a path or a failure's evidence is never read as Rich markup (it raised
MarkupError mid-command, once after a preflight row was recorded)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from sqlmodel import select

from ground.contract import ENV_HOME
from idmctl.record import session
from idmctl.record.models import Chain, Job, PreflightRun

MARKUP = "[/x] [bold]loud[/bold] [/]"


def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "markup.yaml"
    path.write_text("extends: latent_c_n4\n"
                    f"description: 'desc {MARKUP}'\n"
                    f"data:\n  cache_root: '/nas/{MARKUP}/cache'\n")
    return path


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_preflight_prints_markup_literally_and_records_one_run(cli, tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    result = cli("preflight", str(spec), "--cluster", "card", "--no-smoke")
    assert result.exit_code in (0, 1), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "[/x]" in result.output and "Traceback" not in result.output
    with session() as db:
        runs = db.exec(select(PreflightRun)).all()
    assert len(runs) == 1  # recorded once, and the table that followed printed


def test_submit_dry_run_prints_markup_literally(cli, tmp_path: Path, idmctl_home: Path) -> None:
    result = cli("submit", str(_spec(tmp_path)), "--cluster", "card", "--dry-run")
    assert result.exit_code in (0, 1), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert f"/nas/{MARKUP}/cache" in result.stdout  # the script shows the path as written
    assert not (idmctl_home / "runs").exists()


def test_exp_diff_prints_markup_literally(cli, tmp_path: Path) -> None:
    result = cli("exp", "diff", "latent_c_n4", str(_spec(tmp_path)))
    assert result.exit_code == 0, result.output
    assert "[/x]" in _flat(result.output) and "[bold]loud[/bold]" in _flat(result.output)


def test_failures_prints_log_evidence_literally(cli) -> None:
    now = datetime(2026, 11, 20, 9, 0, 0, tzinfo=timezone.utc)
    with session() as db:
        chain = Chain(experiment="latent_c_n4", spec_hash="h")
        db.add(chain)
        db.flush()
        db.add(Job(scheduler_id="77", chain_id=chain.id, experiment="latent_c_n4", routing_n=4, state="FAILED",
                   exit_code="1:0", gpus=1, qos="core-own", submitted_at=now, started_at=now, ended_at=now,
                   log_tail=f"RuntimeError: bad tensor {MARKUP}\n"))
        db.commit()
    table = cli("failures")
    assert table.exit_code == 0, table.output
    assert "[/x]" in _flat(table.output)
    markdown = cli("failures", "--markdown")
    assert markdown.exit_code == 0 and "[/x]" in markdown.output
    rows = json.loads(cli("failures", "--json").output)
    assert any("[/x]" in json.dumps(row) for row in rows)


def test_a_terminal_that_is_not_utf8_gets_escapes_not_a_traceback_after_the_record(tmp_path: Path) -> None:
    """preflight's table has → and ×; on an ASCII terminal it raised UnicodeEncodeError after the run was
    recorded. Now each command runs to its end: the row recorded once, the characters escaped."""
    import os
    import sqlite3
    import subprocess
    import sys

    home = tmp_path / "home"
    spec = _spec(tmp_path)
    env = {**os.environ, ENV_HOME: str(home), "PYTHONIOENCODING": "ascii", "LC_ALL": "C"}
    run = subprocess.run([sys.executable, "-m", "idmctl", "preflight", str(spec), "--cluster", "card", "--no-smoke"],
                         cwd=Path(__file__).resolve().parents[3], env=env, capture_output=True, timeout=120)
    out, err = run.stdout.decode("ascii"), run.stderr.decode("ascii")  # every byte is ASCII
    assert run.returncode in (0, 1) and "Traceback" not in err, err[-2000:]
    assert "\\u2192" in out and "[/x]" in out  # → escaped, the markup literal
    with sqlite3.connect(home / "idmctl.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM preflight_run").fetchone()[0] == 1

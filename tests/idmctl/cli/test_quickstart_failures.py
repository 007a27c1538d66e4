"""The quickstart never ends in a traceback: each failing step is one line saying what failed and what
to do; ``--debug`` shows the traceback (or, for the shell steps, their output)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ground.contract import ENV_CLUSTER, ENV_HOME

REPO = Path(__file__).resolve().parents[3]
JUNK = "E: Unable to locate package libegl1\n" * 5


def _clone_scripts(root: Path, system_deps: str, setup: str) -> Path:
    """scripts/quickstart.sh beside stub steps and a stub .venv/bin/idmctl that prints its arguments."""
    scripts = root / "scripts"
    scripts.mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "quickstart.sh", scripts / "quickstart.sh")
    for name, body in (("system_deps.sh", system_deps), ("setup.sh", setup)):
        (scripts / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (scripts / name).chmod(0o755)
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "idmctl").write_text('#!/usr/bin/env bash\necho "idmctl $* IDMCTL_HOME=$IDMCTL_HOME"\n')
    (venv_bin / "idmctl").chmod(0o755)
    return scripts / "quickstart.sh"


def _run(script: Path, *args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop(ENV_HOME, None)
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("failing", "stub", "step", "todo"), [
    ("system_deps", f"printf '{JUNK}' >&2; exit 100", "Debian packages failed (exit 100)", "as root"),
    ("setup", "echo 'ERROR: No matching distribution found for torch==2.13.0' >&2; exit 1",
     "Python environment failed (exit 1)", "package index"),
])
def test_a_failing_setup_step_is_one_line_with_what_to_do(tmp_path: Path, failing: str, stub: str, step: str,
                                                        todo: str) -> None:
    stubs = {"system_deps": "exit 0", "setup": "exit 0", failing: stub}
    script = _clone_scripts(tmp_path / "clone", stubs["system_deps"], stubs["setup"])
    done = _run(script, tmp=tmp_path)
    assert done.returncode == 1
    line, = done.stderr.strip().splitlines()
    assert line.startswith(f"quickstart: {step}: ") and todo in line and "--debug shows it" in line
    log = Path(line.rsplit("its output: ", 1)[1].split(";")[0])
    assert log.read_text().strip()  # the step's own output is kept, not shown
    assert "Traceback" not in done.stdout + done.stderr and "Unable to locate" not in done.stdout + done.stderr
    assert "idmctl quickstart" not in done.stdout  # nothing after the failing step ran

    shown = _run(script, "--debug", tmp=tmp_path)
    assert shown.returncode == 1
    assert shown.stderr.strip().splitlines()[-1].startswith(f"quickstart: {step}: ")
    assert ("Unable to locate" if failing == "system_deps" else "No matching distribution") in shown.stderr


def test_after_its_steps_the_script_hands_its_arguments_and_a_home_to_idmctl_quickstart(tmp_path: Path) -> None:
    script = _clone_scripts(tmp_path / "clone", "exit 0", "exit 0")
    done = _run(script, "--debug", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "quickstart: Debian packages ..." in done.stdout
    assert f"idmctl quickstart --debug IDMCTL_HOME={tmp_path / 'clone' / '.idmctl'}" in done.stdout


def test_a_failing_stage_is_one_line_and_debug_shows_the_traceback(cli, monkeypatch) -> None:
    from idmctl.cli import quickstart

    def broken_demos(resolved, result):  # type: ignore[no-untyped-def]
        raise RuntimeError("EGL: eglInitialize failed\nsecond line of the message")

    monkeypatch.setattr(quickstart, "doctor_stage", lambda result: None)
    monkeypatch.setattr(quickstart, "demos_stage", broken_demos)
    result = cli("quickstart")
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    last = result.output.strip().splitlines()[-1]
    assert last == ("quickstart stopped at [2/9] demos: RuntimeError: EGL: eglInitialize failed; what to do: "
                    "`idmctl doctor` checks rendering; the demo file is written atomically, so rerunning is safe "
                    "(`--debug` shows the traceback)")
    assert "Traceback" not in result.output and "second line" not in result.output

    for args in (("quickstart", "--debug"), ("--debug", "quickstart")):
        debug = cli(*args)
        assert isinstance(debug.exception, RuntimeError), args
        assert "quickstart stopped" not in debug.output


def test_a_bad_spec_names_the_stage_and_keeps_exit_2(cli, monkeypatch) -> None:
    from ground.errors import UserError
    from idmctl.cli import quickstart

    def bad_spec(result):  # type: ignore[no-untyped-def]
        raise UserError("unknown field 'lr'", file="experiments/quickstart.yaml", field="train")

    monkeypatch.setattr(quickstart, "doctor_stage", lambda result: None)
    monkeypatch.setattr(quickstart, "register_specs_stage", bad_spec)
    result = cli("quickstart")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "error: experiments/quickstart.yaml:train: quickstart stopped at [1/9] specs: unknown field 'lr' "
        "(`idmctl exp list` validates every spec and names the broken field)")


def test_a_machine_that_is_not_ready_stops_at_the_doctor_in_one_line(tmp_path: Path) -> None:
    """The real command in its own process: no traceback, the failing rows with their fixes, one last line."""
    env = {**os.environ, ENV_HOME: "/proc/idmctl-quickstart", ENV_CLUSTER: "no-such-cluster"}
    done = subprocess.run([sys.executable, "-m", "idmctl", "quickstart"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert "FAIL IDMCTL_HOME" in done.stdout and "— fix: set IDMCTL_HOME to a directory you can write" in done.stdout
    assert "FAIL slurm" in done.stdout
    assert done.stderr.strip().splitlines() == [
        "quickstart stopped: doctor found IDMCTL_HOME, slurm missing; "
        "what to do: fix the FAIL rows above (`idmctl doctor` shows the full table)"]
    assert "[1/9]" not in done.stdout

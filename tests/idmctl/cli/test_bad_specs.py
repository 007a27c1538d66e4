"""The malformed-spec corpus: each file gives one line naming file and field, exit 2, no DB write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ground.contract import ENV_HOME

CORPUS = sorted((Path(__file__).parents[2] / "data" / "bad_specs").glob("*.yaml"))


def _expected(path: Path) -> str:
    first = path.read_bytes().splitlines()[0].decode("utf-8")  # the rest may be non-UTF-8 on purpose
    assert first.startswith("# expect: "), f"{path.name} lacks its '# expect:' header"
    return first.removeprefix("# expect: ")


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 20


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_bad_spec_is_one_line_exit_2_no_write(path: Path, cli, idmctl_home: Path):
    result = cli("exp", "register", str(path))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {path.parent}"), lines[0]
    assert _expected(path) in lines[0], lines[0]
    assert "(" in lines[0] and lines[0].endswith(")"), "the line ends with a hint in parentheses"
    assert "Traceback" not in result.output
    assert not (idmctl_home / "idmctl.sqlite").exists()


def test_debug_flag_shows_the_traceback(tmp_path: Path):
    bad = CORPUS[0]
    env = {ENV_HOME: str(tmp_path), "PATH": "/usr/bin:/bin"}
    quiet = subprocess.run([sys.executable, "-m", "idmctl", "exp", "validate", str(bad)], capture_output=True, text=True, env=env)
    loud = subprocess.run([sys.executable, "-m", "idmctl", "--debug", "exp", "validate", str(bad)], capture_output=True, text=True, env=env)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    assert loud.returncode != 0 and "Traceback" in loud.stderr


def test_one_bad_spec_among_good_ones_writes_nothing(cli, idmctl_home: Path):
    result = cli("exp", "register", "quickstart", str(CORPUS[0]))
    assert result.exit_code == 2
    assert not (idmctl_home / "idmctl.sqlite").exists()

"""``idmctl controller install``/``remove`` own only the lines between idmctl's markers in the user's
scrontab; an unterminated block is refused with the fix and the table left as it was; limits and schedules
Slurm would read otherwise are refused at load; a ``scrontab`` that never answers is one line.

The local cluster runs with scrontab off (``ScronParameters`` is null in its slurm.conf, and enabling it
is an admin's change to the shared cluster), so the real ``scrontab -l`` there only says it is disabled.
These tests put a fake ``scrontab`` on PATH that keeps the table in a file, as the real one keeps it in
slurmctld: ``-l`` prints it (or "no crontab for <user>", exit 1, as Slurm's does), ``scrontab FILE``
stores FILE. What is tested is idmctl's table logic, which is the same whoever stores the table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ground.paths import clusters_dir
from idmctl.ops import scron
from idmctl.ops.scron import BEGIN, END

FAKE = """#!/bin/sh
if [ "$1" = "-l" ]; then
  if [ -f "$FAKE_SCRONTAB_TABLE" ]; then cat "$FAKE_SCRONTAB_TABLE"; exit 0; fi
  echo "scrontab: no crontab for $(id -un)" >&2; exit 1
fi
cp "$1" "$FAKE_SCRONTAB_TABLE"
"""
HANGS = """#!/bin/sh
sleep 600
"""
THEIRS = "# my own\n0 3 * * * /home/op/backup.sh\n\n@daily /home/op/other\n"


@pytest.fixture
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake scrontab's table file (absent: the user has none yet)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scrontab").write_text(FAKE)
    (bin_dir / "scrontab").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_SCRONTAB_TABLE", str(tmp_path / "table"))
    return tmp_path / "table"


def test_install_and_remove_touch_only_the_lines_between_idmctls_markers(cli, table: Path) -> None:
    table.write_text(THEIRS)
    first = cli("controller", "install", "--cluster", "local-slurm")
    assert first.exit_code == 0, first.output
    installed = table.read_text()
    assert installed.startswith(THEIRS) and installed.count(BEGIN) == 1 and installed.endswith(f"{END}\n")
    again = cli("controller", "install", "--cluster", "local-slurm")
    assert again.exit_code == 0 and table.read_text() == installed  # replaced in place, never twice
    table.write_text(installed + "*/5 * * * * /home/op/after.sh\n")
    assert cli("controller", "remove").exit_code == 0
    assert table.read_text() == THEIRS + "*/5 * * * * /home/op/after.sh\n"


def test_install_on_an_empty_table_and_remove_leave_nothing_behind(cli, table: Path) -> None:
    assert cli("controller", "install", "--cluster", "local-slurm").exit_code == 0
    assert table.read_text().startswith(BEGIN)
    assert cli("controller", "remove").exit_code == 0
    assert table.read_text() == ""


@pytest.mark.parametrize("damaged", [
    THEIRS + BEGIN + "\n#SCRON --time=0:05:00\n*/10 * * * * idmctl sync\n# my line after the lost end\n",
    BEGIN + "\n" + THEIRS + BEGIN + "\n" + END + "\n",
])
@pytest.mark.parametrize("command", [("controller", "install", "--cluster", "local-slurm"), ("controller", "remove")])
def test_an_unterminated_block_is_refused_with_the_fix_and_the_table_kept(cli, table: Path, damaged: str,
                                                                          command: tuple[str, ...]) -> None:
    table.write_text(damaged)
    result = cli(*command)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "begin line at line" in lines[0] and END in lines[0] and "scrontab -e" in lines[0]
    assert table.read_text() == damaged


def test_lines_that_only_look_like_markers_and_odd_characters_are_the_users(table: Path) -> None:
    odd = f"#{BEGIN}\n0 1 * * * echo '\x0cform feed'\r\n{END}\n"
    assert scron.without_block(odd) == odd
    assert scron.without_block(odd + scron.BEGIN + "  \n#SCRON x\n" + END + "\r\n") == odd


@pytest.mark.parametrize("field, value, said", [
    ("time_limit", "0", "at least 1 minute"),
    ("time_limit", "0:00:00", "at least 1 minute"),
    ("schedule", "61 * * * *", "cron minute 61 is outside 0-59"),
    ("schedule", "*/0 * * * *", "a step of 0 never fires"),
    ("schedule", "0 0 31 2-1 *", "runs backwards"),
    ("schedule", "0 0 * * MON", "cron day of week field"),
])
def test_a_limit_or_schedule_slurm_would_misread_is_refused_at_load(cli, table: Path, tmp_path: Path, field: str,
                                                                    value: str, said: str) -> None:
    data = yaml.safe_load((clusters_dir() / "local-slurm.yaml").read_text())
    data["controller"][field] = value
    profile = tmp_path / "bad.yaml"
    profile.write_text(yaml.safe_dump(data))
    result = cli("controller", "install", "--cluster", str(profile))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"controller.{field}" in lines[0] and said in lines[0], lines[0]
    assert not table.exists()


def test_a_scrontab_that_never_answers_ends_in_one_line_at_the_deadline(cli, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scrontab").write_text(HANGS)
    (bin_dir / "scrontab").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(scron, "SCRONTAB_DEADLINE_S", 1.0)
    result = cli("controller", "remove")
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "did not answer within 1 s" in lines[0] and "Traceback" not in result.output

"""scripts/suite_cpu.py: the CPU seconds of the processes a command starts, grouped by what they run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO / "scripts" / "suite_cpu.py")

sys.path.insert(0, str(REPO / "scripts"))
import suite_cpu  # noqa: E402 - a script, not a package: imported from its folder

sys.path.remove(str(REPO / "scripts"))


@pytest.mark.parametrize(("command", "expected"), [
    ("/r/.venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "pytest worker (the tests' own work)"),
    ("/r/.venv/bin/python -m trainers.train --run-dir /tmp/x", "python -m trainers.train"),
    ("/r/.venv/bin/python -m idmctl sync --chain 3", "idmctl sync"),
    ("/r/.venv/bin/python -m idmctl submit /tmp/s/specs/a.yaml --json", "idmctl submit"),
    ("/r/.venv/bin/python -m idmctl jobs show 4", "idmctl jobs"),
    ("/r/.venv/bin/python -m idmctl submit quickstart --force", "idmctl submit"),
    ("/r/.venv/bin/python -m idmctl --help", "idmctl"),
    ("python3 -c import torch", "python -c …"),
    ("/usr/bin/python3 /work/prof/mkrun.py /tmp/a", "python mkrun.py"),
    ("/bin/bash /tmp/slurm/spool/n1/job04869/slurm_script", "bash slurm_script"),
    ("slurmstepd: [4869.batch]", "slurmstepd"),
    ("", "(no command line)"),
])
def test_each_command_line_reports_under_what_it_runs(command: str, expected: str) -> None:
    assert suite_cpu.kind(command) == expected


def test_the_report_ranks_kinds_by_cpu_with_their_share_and_cost_per_process() -> None:
    rows = [{"pid": 1, "command": "python -m trainers.train --run-dir a", "cpu_s": 12.0},
            {"pid": 2, "command": "python -m trainers.train --run-dir b", "cpu_s": 14.0},
            {"pid": 3, "command": "python -m idmctl sync", "cpu_s": 2.0},
            {"pid": 4, "command": "fio --name x", "cpu_s": 2.0}]
    assert suite_cpu.report(rows, top=2) == [
        "CPU time of the processes the command started: 30 s over 4 processes", "",
        "   CPU s  share  procs  s/proc  kind",
        "    26.0  86.7%      2   13.00  python -m trainers.train",
        "     2.0   6.7%      1    2.00  idmctl sync",
        "     2.0   6.7%                 (1 more kinds)"]


def test_a_real_command_is_sampled_its_exit_code_passes_and_the_sample_reports_again(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    # A child that burns ~0.8 s of CPU, then the command exits 3.
    burn = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end: pass"
    command = f"{sys.executable} -c '{burn}'; exit 3"
    # Another process on the machine meanwhile (another test's, on a shared machine) is not the command's.
    # Its python starts 0.5 s in (after the sampler's first look), as a child of a shell that is not the command.
    bystander = subprocess.Popen(["bash", "-c", f"sleep 0.5; {sys.executable} -c '{burn}  # bystander'; true"])
    try:
        done = subprocess.run([sys.executable, SCRIPT, "run", str(out), "--", "bash", "-c", command],
                              capture_output=True, text=True, timeout=120)
    finally:
        bystander.wait(timeout=60)
    assert done.returncode == 3, done.stderr
    rows = json.loads(out.read_text())
    burned = [row for row in rows if suite_cpu.kind(row["command"]) == "python -c …"]
    assert not [row for row in rows if "bystander" in row["command"]], rows
    assert len(burned) == 1 and burned[0]["cpu_s"] >= 0.4, rows  # sampled every 0.2 s: the last slice may be lost
    assert "python -c …" in done.stderr and "CPU time of the processes the command started" in done.stderr
    again = subprocess.run([sys.executable, SCRIPT, "report", str(out)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout.splitlines()[0] == done.stderr.splitlines()[0]
    assert not list(tmp_path.glob(".cpu.json.tmp*"))


def test_a_slurm_job_the_command_ran_is_sampled_though_slurmd_started_it(tmp_path: Path, local_slurm: str) -> None:
    """A job's processes are children of slurmd (started long before the command), not of the command:
    the sampler counts the job's slurmstepd and what it runs, and still not a bystander."""
    out = tmp_path / "cpu.json"
    burn = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end: pass  # in the job"
    (tmp_path / "burn.py").write_text(burn)
    sbatch = ["sbatch", "--wait", "--qos", "core-own", "--mem", "200M", "-o", str(tmp_path / "job.out"),
              "--chdir", str(tmp_path), f"--wrap={sys.executable} {tmp_path / 'burn.py'}"]
    done = subprocess.run([sys.executable, SCRIPT, "run", str(out), "--", *sbatch], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    burned = [row for row in rows if row["command"].endswith("burn.py") and not row["command"].startswith("sbatch")]
    assert len(burned) == 1 and burned[0]["cpu_s"] >= 0.4, rows
    assert any(suite_cpu.kind(row["command"]) == "slurmstepd" for row in rows), rows


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "half.json").write_text('[{"pid": 1')
    for argv, expected in [
        (["report", str(tmp_path / "half.json")], f"suite_cpu: {tmp_path / 'half.json'}: not a saved sample"),
        (["report", str(tmp_path / "absent.json")], f"suite_cpu: {tmp_path / 'absent.json'}: not a saved sample"),
        (["run", str(tmp_path / "new.json"), "--"], "suite_cpu: run needs a command after --"),
    ]:
        done = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(expected), done.stderr
    assert not (tmp_path / "new.json").exists()

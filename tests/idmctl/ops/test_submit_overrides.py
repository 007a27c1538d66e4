"""Submit-time flags are checked on the job as submitted, on the real local Slurm.

A passing preflight of the spec on ``core-own`` must not let ``submit --qos sub`` send a long-staging
job to the preemptible tier (card A jobs 6054/6108/6158: 2.2 h stage-in, 1 h preempt cycle, preempted
three times). Nor ``--time`` past the QoS's max wall, ``--gres`` past its GPU cap, ``--mem`` past a
node. The same flags within bounds are accepted and the job runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sqlmodel import select

from idmctl.record.db import session
from idmctl.record.models import Chain, Job
from slurm_support import text_so_far, wait_until
from ground.contract import SPEC_FILE

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]


def _slow_nas_profile(directory: Path) -> Path:
    """local-slurm with a NAS so slow that staging the tiny cache outlasts `sub`'s 1-minute preempt
    cycle: the card's 6.6 TB at 0.9 GB/s vs a 1 h cycle, at the scale of this cluster."""
    profile = yaml.safe_load((REPO / "clusters" / "local-slurm.yaml").read_text())
    profile["name"] = "local-slurm-slow-nas"
    profile["storage"]["nas_read"] = "200B/s"
    path = directory / "local-slurm-slow-nas.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def _rows() -> tuple[int, int]:
    with session() as db:
        return len(db.exec(select(Job)).all()), len(db.exec(select(Chain)).all())


def _refused(cli, spec: Path, profile: Path, *flags: str) -> str:
    result = cli("submit", str(spec), "--cluster", str(profile), *flags)
    assert result.exit_code == 1, result.output
    assert "submit refused:" in result.stderr, result.stderr
    return result.stderr


def _row(stderr: str, check: str) -> str:
    """The table's row for ``check`` (its cells joined), from the refusal printed on stderr."""
    lines = [line for line in stderr.splitlines() if line.startswith("│")]
    start = next(i for i, line in enumerate(lines) if line.split("│")[1].strip() == check)
    cells = [lines[start]] + [line for line in lines[start + 1:]][:40]
    out = []
    for line in cells:
        first = line.split("│")[1].strip()
        if out and first:
            break
        out.append(" ".join(cell.strip() for cell in line.split("│")[2:4]))
    return " ".join(" ".join(out).split())  # rich wraps cells at any width: compare words, not columns


def _sync_until_final(cli, job_id: int, timeout_s: float) -> Job:
    from idmctl.core.job_state import is_terminal

    def ended() -> Job | None:
        assert cli("sync", "--no-retry").exit_code == 0
        with session() as db:
            job = db.get(Job, job_id)
        return job if job is not None and is_terminal(job.state) else None

    return wait_until(ended, timeout_s, f"job {job_id} to end")


def test_flags_are_checked_on_the_job_as_submitted(cli, tiny_cache, slurm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = _slow_nas_profile(slurm_home)
    spec = tiny_cache.spec_file(slurm_home / "specs", "staged_tiny", stage={"enabled": True, "dest": str(slurm_home / "scratch")},
                                resources={"qos": "core-own", "time_limit": "0:30:00", "mem": "2GB", "cpus": 1},
                                train={"effective_batch": 12})  # a multiple of batch 2 × any world size 1-3
    passed = cli("preflight", str(spec), "--cluster", str(profile), "--json")
    assert passed.exit_code == 0, passed.output
    report = json.loads(passed.stdout)
    assert report["unlocks_submit"] and report["smoke_flags"] == {}
    qos_row = next(c for c in report["checks"] if c["name"] == "qos")
    assert qos_row["status"] == "PASS" and qos_row["numbers"]["qos"] == "core-own"

    # --qos sub: the gate's key matches (qos does not change what the smoke measured), the qos check does not.
    dry = cli("submit", str(spec), "--cluster", str(profile), "--qos", "sub", "--dry-run")
    assert dry.exit_code == 0 and "submit would be refused: qos FAIL" in dry.stderr, dry.stderr
    assert "#SBATCH --qos=sub" in dry.stdout
    row = _row(_refused(cli, spec, profile, "--qos", "sub"), "qos")
    assert row.startswith("FAIL") and "preempt cycle 60.0 s" in row and "(from --qos sub)" in row, row
    # --time past sub's and core-own's max wall (1 day).
    row = _row(_refused(cli, spec, profile, "--time", "2-00:00:00"), "qos")
    assert "time_limit 2-00:00:00 > core-own max wall 1-00:00:00" in row and "(from --time 2-00:00:00)" in row, row
    # --gres past the QoS's GPU cap (2) — refused on the checks, before the gate asks for a --gres preflight.
    stderr = _refused(cli, spec, profile, "--gres", "gpu:3")
    assert "3 GPUs > core-own max 2" in _row(stderr, "qos") and "(from --gres gpu:3)" in _row(stderr, "qos")
    # --mem past a node's memory (4096 MiB).
    row = _row(_refused(cli, spec, profile, "--mem", "8GB"), "spec")
    assert "resources.mem 8GB > 4096MiB on a local-slurm-slow-nas node (from --mem 8GB)" in row, row
    assert _rows() == (0, 0), "a refused submit writes no rows"
    assert not (slurm_home / "runs").exists()

    # Flags within bounds: accepted, and the real trainer runs to the end with them.
    accepted = cli("submit", str(spec), "--cluster", str(profile), "--qos", "share", "--time", "0:20:00",
                   "--mem", "1500MB", "--json")
    assert accepted.exit_code == 0, accepted.output
    submitted = json.loads(accepted.stdout)
    with session() as db:
        job = db.get(Job, submitted["job"])
    options = json.loads(job.options_json)
    assert (options["qos"], options["time_limit"], options["mem"]) == ("share", "0:20:00", "1500MB")
    assert job.admitted["job"]["changed"] == ["--qos", "--time", "--mem"]
    assert job.admitted["admission"]["failed"] == [] and job.admitted["admission"]["preflight_id"] == report["run_id"]
    run_spec = json.loads((Path(submitted["script"]).parent / SPEC_FILE).read_text())
    assert run_spec["spec"]["resources"]["qos"] == "share"  # the trainer reads the job as it runs
    assert job.spec_hash == report["spec_hash"]  # rows keep the spec's own hash (the gate's key)
    done = _sync_until_final(cli, submitted["job"], timeout_s=300)
    assert (done.state, done.exit_code) == ("COMPLETED", "0:0"), text_so_far(Path(submitted["log"]))
    assert "done: step 8" in text_so_far(Path(submitted["log"]))

    # --gres and --entry change what the smoke measured: a pass without them does not cover them ...
    stderr = cli("submit", str(spec), "--cluster", str(profile), "--gres", "gpu:2", "--entry", "tests.jobs_entry").stderr
    assert "no preflight of staged_tiny with --entry tests.jobs_entry --gres gpu:2" in stderr, stderr
    # ... a preflight of that effective job does.
    again = cli("preflight", str(spec), "--cluster", str(profile), "--gres", "gpu:2", "--entry", "tests.jobs_entry",
                "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["smoke_flags"] == {"--gres": "gpu:2", "--entry": "tests.jobs_entry"}
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "ranks")
    accepted = cli("submit", str(spec), "--cluster", str(profile), "--gres", "gpu:2", "--entry", "tests.jobs_entry",
                   "--json")
    assert accepted.exit_code == 0, accepted.output
    submitted = json.loads(accepted.stdout)
    done = _sync_until_final(cli, submitted["job"], timeout_s=180)
    assert done.state == "COMPLETED", text_so_far(Path(submitted["log"]))
    run_dir = Path(submitted["script"]).parent
    assert sorted(p.name for p in run_dir.glob("rank-*.txt")) == ["rank-0.txt", "rank-1.txt"]  # gpu:2 → 2 ranks
    assert _rows() == (2, 2)

"""The node guard (trainers.node_guard): unit checks on real files, then real jobs on the local Slurm
cluster whose node has stale /dev/shm segments or a nearly full scratch, each a real small tmpfs."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlmodel import select

from ground import contract
from idmctl.ops.failures.classify import classify
from idmctl.record.db import session
from idmctl.record.models import Chain, Job, NodeExclusion
from slurm_support import text_so_far, wait_until
from trainers import node_guard

REPO = Path(__file__).resolve().parents[2]
KIB = 1024


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A real tmpfs of ``size`` (root: the Slurm test jobs and the suite run as root); unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def plant(directory: Path, name: str, size: int) -> Path:
    path = directory / name
    path.write_bytes(b"\x5a" * size)  # real pages: tmpfs counts what is written
    return path


def test_stale_segments_are_the_ones_no_live_process_holds(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    stale = [plant(shm, f"torch_4242_{i}", 8 * KIB) for i in range(2)]
    live = plant(shm, "psm_live", 4 * KIB)
    with open(live, "rb"):  # a live job's segment: this process has it open
        found = node_guard.stale_segments(shm)
    assert sorted(s.path for s in found) == sorted(stale)
    assert sum(s.bytes for s in found) == 16 * KIB


def test_guard_fails_with_the_marker_and_the_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(contract.ENV_SHM_DIR, str(tmp_path / "shm-{node}"))
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    (tmp_path / "shm-n7").mkdir()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi here: the count comes from the variable
    status = node_guard.main(["--phase", "stage", "--gpus", "2", "--cache-root", str(tmp_path / "absent")])
    out = capsys.readouterr()
    assert status == contract.EXIT_NODE_UNFIT
    assert "idmctl: node guard (stage) on n7: UNFIT gpus: 1 visible (CUDA_VISIBLE_DEVICES) < 2 requested" in out.out
    assert f"UNFIT cache: {tmp_path / 'absent'} missing or empty (mount absent?)" in out.out
    marker = out.err.strip()
    assert marker.startswith(f"{contract.FAILURE_MARKER} cause={contract.CAUSE_NODE_UNFIT} node=n7 phase=stage "
                             "check=gpus,cache gpus_visible=1 gpus_requested=2")
    found = classify("FAILED", exit_code=f"{contract.EXIT_NODE_UNFIT}:0", log_tail=out.out + marker, started=True)
    assert (found.cause, found.detail["node"], found.detail["check"]) == ("node_unfit", "n7", "gpus,cache")
    assert found.headline.startswith("idmctl: node guard (stage) on n7: UNFIT gpus: 1 visible")


def test_guard_passes_a_fit_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.ENV_SHM_DIR, str(tmp_path))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "ep0.safetensors").write_bytes(b"x")
    args = ["--phase", "stage", "--shm-need", "4096", "--cache-root", str(tmp_path / "cache"),
            "--stage-dest", str(tmp_path / "stage" / "copy"), "--stage-bytes", "4096"]
    assert node_guard.main(args) == 0


# -- real jobs on the local Slurm cluster --------------------------------------------------------

def _jobs_of_chain(chain_id: int) -> list[Job]:
    with session() as db:
        return list(db.exec(select(Job).where(Job.chain_id == chain_id).order_by(Job.attempt)))


def _exclusions() -> list[NodeExclusion]:
    with session() as db:
        return list(db.exec(select(NodeExclusion)))


@pytest.mark.slow
@pytest.mark.slurm
def test_stale_shm_makes_the_node_unfit_and_the_chain_completes_on_another(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_slurm: str) -> None:
    """Each node's /dev/shm stands as its own 1 MiB tmpfs holding 3 stale segments of a dead job (768 KiB)
    and one live segment (64 KiB, held open here): 192 KiB free, the loader needs 512 KiB. The first
    attempt ends node_unfit on the node it got; once the other node is cleaned, sync excludes the
    first node and resubmits, and the chain completes there."""
    from test_failure_replay import replay_spec, submit

    # 2 layers × 2 frames × 8×8 tokens × 128 ch × 4 B = 131,072 B/sample; 1 rank × 1 worker × prefetch 2
    # × batch 2 → 524,288 B of /dev/shm.
    spec = replay_spec(tmp_path, "shm_overflow", grid=(8, 8), channels=128,
                       loader={"num_workers": 1, "prefetch_factor": 2})
    with contextlib.ExitStack() as stack:
        shm = {node: stack.enter_context(tmpfs(tmp_path / f"shm-{node}")) for node in ("n1", "n2")}
        for node, directory in shm.items():
            for i in range(3):
                plant(directory, f"torch_9{i}_dead", 256 * KIB)
        live = stack.enter_context(open(plant(shm["n1"], "psm_live", 64 * KIB), "rb"))  # noqa: F841
        monkeypatch.setenv(contract.ENV_SHM_DIR, str(tmp_path / "shm-{node}"))
        monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:2:0.1")
        first = submit(cli, spec, "--entry", "tests.jobs_entry", "--retries", "1", "-J", "guard_shm")
        log = Path(first["log"])
        unfit = wait_until(lambda: re.search(r"node guard \(stage\) on (\S+): UNFIT shm", text_so_far(log)),
                           90, "the guard's verdict in the first attempt's log")
        bad = unfit.group(1)
        good = "n2" if bad == "n1" else "n1"
        for segment in shm[good].glob("torch_*"):
            segment.unlink()  # the admins cleaned the other node

        def chain_done() -> bool:
            assert cli("sync").exit_code == 0
            jobs = _jobs_of_chain(first["chain"])
            return len(jobs) == 2 and jobs[-1].state == "COMPLETED"

        wait_until(chain_done, 150, "the resubmitted attempt to complete", poll_s=2.0)

    failed, resumed = _jobs_of_chain(first["chain"])
    assert (failed.state, failed.exit_code, failed.node_list) == ("FAILED", f"{contract.EXIT_NODE_UNFIT}:0", bad)
    assert resumed.node_list == good
    assert f"#SBATCH --exclude={bad}" in Path(resumed.script_path or "").read_text()
    row = next(r for r in json.loads(cli("failures", "--json").output) if r["job"] == first["scheduler_id"])
    assert row["cause"] == "node_unfit"
    assert (row["detail"]["node"], row["detail"]["check"], row["detail"]["phase"]) == (bad, "shm", "stage")
    assert (row["detail"]["stale_segments"], row["detail"]["stale_bytes"]) == ("3", str(768 * KIB))
    assert int(row["detail"]["shm_free_bytes"]) < int(row["detail"]["shm_need_bytes"]) == 524_288
    assert row["evidence"].startswith(f"idmctl: node guard (stage) on {bad}: UNFIT shm: ")
    assert "3 stale segments of dead jobs hold 786,432 B" in row["evidence"]
    (exclusion,) = [e for e in _exclusions() if e.reason == f"node_unfit under job {first['scheduler_id']}"]
    until = exclusion.until if exclusion.until.tzinfo else exclusion.until.replace(tzinfo=timezone.utc)
    assert exclusion.node == bad
    assert timedelta(minutes=55) < until - datetime.now(timezone.utc) <= timedelta(hours=1)


@pytest.mark.slow
@pytest.mark.slurm
def test_nearly_full_scratch_makes_the_node_unfit_before_stage_in(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_slurm: str) -> None:
    """stage.dest on a 1 MiB tmpfs with 8 KiB left; the stage-in copies the tiny cache (tens of KiB).
    The submit host is the node here, so preflight's disk check sees the same full tmpfs and FAILs:
    --force stands for a submit host that cannot see the node's scratch."""
    from test_failure_replay import replay_spec, submit

    with tmpfs(tmp_path / "scratch") as scratch:
        plant(scratch, "other_job_copy", 1024 * KIB - 8 * KIB)
        spec = replay_spec(tmp_path, "shm_overflow", stage={"enabled": True, "dest": str(scratch / "stage")},
                           loader={"num_workers": 0})
        monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.1")
        job = submit(cli, spec, "--entry", "tests.jobs_entry", "--retries", "0", "-J", "guard_scratch")
        script = Path(job["script"]).read_text()
        assert "--stage-bytes" in script and f"--stage-dest {scratch / 'stage'}" in script

        def ended() -> bool:
            assert cli("sync").exit_code == 0
            return _jobs_of_chain(job["chain"])[0].state not in ("PENDING", "RUNNING", "SUBMITTING")

        wait_until(ended, 90, "the job on the full scratch to end", poll_s=2.0)
        log = text_so_far(Path(job["log"]))
    assert "stage-in on" not in log  # the guard ended it before the copy
    (row,) = _jobs_of_chain(job["chain"])
    failure = next(r for r in json.loads(cli("failures", "--json").output) if r["job"] == job["scheduler_id"])
    assert failure["cause"] == "node_unfit"
    assert failure["detail"]["check"] == "scratch"
    assert int(failure["detail"]["scratch_free_bytes"]) < int(failure["detail"]["stage_bytes"])
    assert failure["evidence"].startswith(f"idmctl: node guard (stage) on {row.node_list}: UNFIT scratch: ")
    with session() as db:
        assert db.get(Chain, job["chain"]).status == "FAILED"  # --retries 0: excluded, not resubmitted
    assert [e.node for e in _exclusions()] == [row.node_list]

"""Staged copies are keyed (ground/stage.py): a copy at ``stage.dest`` made for another layer set, another
cache or a rebuilt one is replaced, never reused; the same spec twice copies once. Real stage-ins of the
tiny cache through the local executor, real files, and the preflight's disk and qos checks on them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ground.contract import ENV_HOME, ENV_SHM_DIR, STAGE_MARKER, STAGE_PENDING
from ground.spec.loader import load_spec
from ground.stage import copy_state, model_identity, prepare, spec_identity, stage_key
from idmctl.ops.executors.local import LocalExecutor
from idmctl.gate import disk, qos
from idmctl.record.memo import tree_fingerprint
from idmctl.core.checks import Measurements, PreflightContext
from idmctl.gate.runner import staged_copy
from idmctl.core.profile import load_profile
from idmctl.record.db import session
from idmctl.record.models import Job
from trainers import node_guard

ROUTED = {"data": {"selected_layer_indices": [0, 2]}, "stage": {"layers": "routed"}}
"""The n4-routed analogue on the tiny 4-layer cache: 2 of 4 blocks staged."""
DENSE = {"data": {"selected_layer_indices": [0, 1, 2, 3]}, "stage": {"layers": "all"}}
"""The n12-dense analogue: every layer staged."""


def _spec(tiny_cache, directory: Path, name: str, dest: Path, variant: dict) -> Path:
    return tiny_cache.spec_file(directory, name, data=variant["data"],
                                stage={"enabled": True, "dest": str(dest), **variant["stage"]})


def _job(job_id: int) -> Job:
    with session() as db:
        job = db.get(Job, job_id)
        assert job is not None and job.log_path
        return job


def _run_job(cli, spec: Path, cluster: str) -> str:
    """Submit on ``cluster`` (the local executor or the local Slurm), wait for the end, return the job's log."""
    from idmctl.core.job_state import is_terminal
    from slurm_support import text_so_far, wait_until

    result = cli("submit", str(spec), "--entry", "tests.jobs_entry", "--force", "--reason", "stage key test",
                 "--json", "--cluster", cluster)
    assert result.exit_code == 0, result.output + result.stderr
    submitted = json.loads(result.stdout)
    if cluster == "local":
        LocalExecutor().wait(submitted["scheduler_id"], timeout_s=120)
    assert cli("sync", "--no-retry").exit_code == 0

    def ended() -> Job | None:
        assert cli("sync", "--no-retry").exit_code == 0
        job = _job(submitted["job"])
        return job if is_terminal(job.state) else None

    job = wait_until(ended, 120, f"job {submitted['scheduler_id']} on {cluster} to end", poll_s=1.0)
    log = text_so_far(Path(submitted["log"]))
    assert job.state == "COMPLETED", log
    return log


def _stage_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("idmctl: stage-in")]


def _marker(dest: Path) -> dict:
    return json.loads((dest / STAGE_MARKER).read_text())


@pytest.fixture(params=["local", pytest.param("local-slurm", marks=pytest.mark.slurm)])
def cluster(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """The executor and a directory of the test's own: Slurm jobs may outlive pytest's tmp_path pruning
    by other sessions on this shared host (as in test_slurm_jobs)."""
    own = Path(tempfile.mkdtemp(prefix="idmctl-stage-key-"))
    if request.param == "local-slurm":
        request.getfixturevalue("local_slurm")
        monkeypatch.setenv(ENV_HOME, str(own / "home"))
    try:
        yield request.param, own
    finally:
        shutil.rmtree(own, ignore_errors=True)


def test_n4_routed_then_n12_on_one_dest_copies_again_and_the_same_spec_twice_copies_once(
        cli, tiny_cache, cluster: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")
    where, tmp_path = cluster
    dest = tmp_path / "scratch" / "stage"
    routed = _spec(tiny_cache, tmp_path / "specs", "n4_routed", dest, ROUTED)
    dense = _spec(tiny_cache, tmp_path / "specs", "n12_dense", dest, DENSE)
    source = Path(str(tiny_cache.data["cache_root"]))
    names = sorted(p.name for p in source.iterdir())

    first = _stage_lines(_run_job(cli, routed, where))
    assert any("blocks 0,2 of" in line for line in first) and first[-1].startswith("idmctl: stage-in done"), first
    assert _marker(dest)["layers"] == "blocks 0,2"
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == names

    again = _stage_lines(_run_job(cli, routed, where))
    assert len(again) == 1 and again[0].startswith("idmctl: stage-in skipped on ") and "blocks 0,2" in again[0], again

    # The dense job must not read the routed copy (2 of 4 layers): it is removed and copied whole.
    replaced = _stage_lines(_run_job(cli, dense, where))
    assert any("replaces the copy at" in line and "the copy there was blocks 0,2" in line for line in replaced), replaced
    assert replaced[-1].startswith("idmctl: stage-in done"), replaced
    assert _marker(dest)["layers"] == "all"
    for name in names:  # cp -a of every file: the bytes of the source, not the routed conversion
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    assert _stage_lines(_run_job(cli, dense, where))[0].startswith("idmctl: stage-in skipped on ")

    back = _stage_lines(_run_job(cli, routed, where))
    assert any("replaces the copy at" in line and "the copy there was all of" in line for line in back), back
    assert _marker(dest)["layers"] == "blocks 0,2" and not (dest / STAGE_PENDING).exists()


def _context(spec: Path, profile: str) -> PreflightContext:
    resolved = load_spec(str(spec))
    prof = load_profile(profile)[0]
    root = Path(resolved.spec.data.cache_root)
    size, files, _ = tree_fingerprint(root)
    measured = Measurements(cache_present=True, cache_bytes=size, cache_file_count=files,
                            scratch_free_bytes=10 * 2**30, staged_copy=staged_copy(resolved, prof))
    return PreflightContext(resolved, prof, measured)


def test_disk_and_qos_count_the_stage_in_unless_the_copy_there_has_this_key(tiny_cache, tmp_path: Path) -> None:
    dest = tmp_path / "stage"
    routed = _spec(tiny_cache, tmp_path, "n4_routed", dest, ROUTED)
    dense = _spec(tiny_cache, tmp_path, "n12_dense", dest, DENSE)
    # Nothing staged yet: both count their stage-in.
    assert _context(routed, "local").measurements.staged_copy is None
    assert disk.check(_context(routed, "local")).numbers["reused"] is False

    resolved = load_spec(str(routed))
    layers, model = spec_identity("routed", resolved.spec.data)
    source = Path(resolved.spec.data.cache_root)
    assert prepare(source, dest, layers, model)[0] == "fresh"
    (dest / STAGE_PENDING).rename(dest / STAGE_MARKER)  # a finished routed copy (its files do not matter here)

    same = _context(routed, "local")
    assert same.measurements.staged_copy is not None and same.measurements.staged_copy["files_match"]
    result = disk.check(same)
    assert result.numbers["reused"] is True and result.summary.startswith("already staged, nothing to copy: ")
    other = _context(dense, "local")
    result = disk.check(other)
    assert result.numbers["reused"] is False and "is of another key" in result.summary and "replaced" in result.summary
    # A what-if judges the altered spec against the same measurements: staging every layer is another key.
    whatif = PreflightContext(other.resolved, same.profile, same.measurements)
    assert disk.check(whatif).numbers["reused"] is False

    # On the preemptible tier the stage-in time is charged again for the other key, not for the same one.
    def on_sub(ctx: PreflightContext) -> PreflightContext:
        spec = ctx.spec.model_copy(update={"resources": ctx.spec.resources.model_copy(update={"qos": "sub"})})
        resolved = type(ctx.resolved)(ctx.resolved.name, ctx.resolved.path, spec, ctx.resolved.chain)
        return PreflightContext(resolved, ctx.profile, ctx.measurements)

    local_slurm = lambda spec: _context(spec, "local-slurm")  # noqa: E731  (its `sub` has a 1 min cycle)
    assert qos.check(on_sub(local_slurm(routed))).numbers["stage_s"] == 0
    assert qos.check(on_sub(local_slurm(dense))).numbers["stage_s"] > 0
    # A cluster node's disk is not this machine's: the card always counts the copy.
    assert staged_copy(resolved, load_profile("card")[0]) is None


def test_a_rebuilt_cache_changes_the_key(tiny_cache, tmp_path: Path) -> None:
    source = tmp_path / "cache"
    source.mkdir()
    (source / "ep0.safetensors").write_bytes(b"x" * 100)
    dest = tmp_path / "dest"
    resolved = load_spec(str(tiny_cache.spec_path))
    model = model_identity(resolved.spec.data)
    assert prepare(source, dest, "all", model)[0] == "fresh"
    (dest / STAGE_PENDING).rename(dest / STAGE_MARKER)
    assert copy_state(source, dest, "all", model) == "reuse"
    (source / "ep0.safetensors").write_bytes(b"y" * 101)  # rebuilt: another size
    assert copy_state(source, dest, "all", model) == "replace"
    # Another model behind the same files is another key too.
    other = model_identity(resolved.spec.data.model_copy(update={"vae_id": "AutoencoderKLWan:other"}))
    assert stage_key(source, "all", other)["digest"] != stage_key(source, "all", model)["digest"]


def test_a_copy_cut_short_resumes_only_for_its_own_key_and_foreign_files_are_never_removed(tmp_path: Path) -> None:
    source = tmp_path / "cache"
    source.mkdir()
    (source / "ep0.safetensors").write_bytes(b"x" * 10)
    dest = tmp_path / "dest"
    assert prepare(source, dest, "blocks 0,2", "m")[0] == "fresh"
    (dest / "ep0.safetensors").write_bytes(b"partial")
    assert prepare(source, dest, "blocks 0,2", "m")[0] == "resume"
    assert (dest / "ep0.safetensors").read_bytes() == b"partial"
    plan, words = prepare(source, dest, "all", "m")
    assert plan == "replace" and "the copy there was blocks 0,2" in words
    assert not (dest / "ep0.safetensors").exists()

    # A date-only marker of older job scripts is no key: replaced.
    (dest / STAGE_MARKER).write_text("2026-11-30T10:00:00+00:00\n")
    (dest / "old.safetensors").write_bytes(b"old")
    assert prepare(source, dest, "all", "m")[0] == "replace" and not (dest / "old.safetensors").exists()

    # A stage.dest pointing at a directory of someone's files: refused, one line, nothing removed.
    foreign = tmp_path / "home_dir"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    done = subprocess.run([sys.executable, "-m", "ground.stage", "prepare", "--source", str(source), "--dest",
                           str(foreign), "--layers", "all", "--model", "m"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "holds files no stage-in wrote" in done.stderr and (foreign / "notes.txt").read_text() == "mine"


def test_node_guard_counts_a_copy_of_another_key_as_space_and_skips_only_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real 2 MiB tmpfs (nothing else writes there): a 1 MiB copy of another key fills half of it;
    stage-in removes it first, so a 1.5 MiB copy fits, and the guard says so."""
    from test_node_guard import plant, tmpfs

    source = tmp_path / "cache"
    source.mkdir()
    (source / "ep0.safetensors").write_bytes(b"x" * 4096)
    with tmpfs(tmp_path / "scratch", "2m") as scratch:
        dest = scratch / "stage"
        assert prepare(source, dest, "blocks 0,2", "m")[0] == "fresh"
        plant(dest, "ep0.safetensors", 2**20)
        (dest / STAGE_PENDING).rename(dest / STAGE_MARKER)
        need = 3 * 2**19  # 1.5 MiB: more than the ~1 MiB free, less than free + the old copy
        assert node_guard._free(dest) < need
        mine = node_guard.check_scratch(dest, need, stage_key(source, "blocks 0,2", "m"))
        assert mine.ok and "already staged" in mine.line
        theirs = node_guard.check_scratch(dest, need, stage_key(source, "all", "m"))
        assert theirs.ok and theirs.fields["replaced_copy_bytes"] >= 2**20, theirs.line
        assert "of an earlier copy there (stage-in replaces or resumes it) ≥" in theirs.line
        assert not node_guard.check_scratch(dest, 4 * 2**20, stage_key(source, "all", "m")).ok
        monkeypatch.setenv(ENV_SHM_DIR, str(tmp_path))
        args = ["--phase", "stage", "--cache-root", str(source), "--stage-dest", str(dest),
                "--stage-bytes", str(need), "--stage-layers", "all", "--stage-model", "m"]
        assert node_guard.main(args) == 0
        args[args.index("--stage-bytes") + 1] = str(4 * 2**20)
        assert node_guard.main(args) != 0

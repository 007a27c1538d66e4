"""Checkpoints are whole or ignored: SIGKILLs during real saves, then the real resume path.

The kill loop forks a child from this process (torch already imported) that saves in a loop with
``trainers.checkpoint.save_checkpoint`` through a real single-process Fabric, SIGKILLs it after a
random delay (``random.Random(KILL_SEED)``), sweeps as the trainer does and resumes with
``trainers.checkpoint.resume`` under a deadline. Flipped bytes, truncations, a manifest that is not JSON
and a name that points nowhere are made by hand in real checkpoints; the trainer itself (``python -m
trainers.train``, as jobs run it) is killed inside a checkpoint write and resumed in the slow test.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from ground.contract import EVENTS_FILE, SPEC_FILE
from ground.paths import REPO_ROOT, sweep_dead_temp_files, temp_files
from ground.run_events import CHECKPOINT_CORRUPT, CHECKPOINT_UNLOADABLE, CHECKPOINT_UNVERIFIED, parse_event_line
from trainers.checkpoint import (CORRUPT_DIR, MANIFEST_FILE, STATE_FILE, Retention, checkpoint_dir, checkpoint_path,
                                 complete_checkpoints, kept, prune, read_manifest, resume, save_checkpoint)

torch.set_num_threads(1)
KILL_SEED = 31
"""The kill delays are ``random.Random(KILL_SEED).uniform(...)``: the same 50 delays every run."""
KILLS = 50
SPEC_HASH = "a" * 64


@pytest.fixture(scope="module")
def fabric():
    from lightning_fabric import Fabric

    return Fabric(accelerator="cpu", devices=1, precision="32-true")


def tiny_state(fabric) -> dict[str, Any]:
    model = torch.nn.Linear(128, 128)  # 16,512 parameters: a save is ~0.2 MB with AdamW's two moments
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 128)).sum().backward()
    optimizer.step()  # the moments exist: the optimizer state is part of what is written
    model, optimizer = fabric.setup(model, optimizer)
    return {"model": model, "optimizer": optimizer, "step": 0, "best": {}}


def stamp(state: dict[str, Any], step: int) -> None:
    """Weights that say which step they are: resume is checked by value, not by the file's name."""
    with torch.no_grad():
        for param in state["model"].parameters():
            param.fill_(float(step))
    state["step"] = step


def stamped_step(state: dict[str, Any]) -> float:
    values = torch.cat([p.detach().reshape(-1) for p in state["model"].parameters()])
    assert torch.all(values == values[0]), "weights of two steps mixed"
    return float(values[0])


def save(fabric, run_dir: Path, state: dict[str, Any], step: int, retention: Retention = Retention(),
         metrics: dict[str, float] | None = None) -> Path:
    stamp(state, step)
    return save_checkpoint(fabric, run_dir, step, state, spec_hash=SPEC_HASH, code_version="0123456789abcdef",
                           metrics=metrics, retention=retention)


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    def expired(_signum: int, _frame: Any) -> None:
        raise TimeoutError(f"{what} took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / EVENTS_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry for entry in map(json.loads, lines) if entry["event"] == name]


def forked_saver(fabric, run_dir: Path, state: dict[str, Any], first_step: int, steps: int | None = None) -> tuple[int, int]:
    """Fork a child that saves ``first_step``, the step after and so on (forever, or ``steps`` saves), and
    says so through a pipe: one byte ``S`` as it starts, then each step's number once its save returned.
    Returns the pid and the pipe's read end. The child never returns into pytest."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.write(write_end, b"S")
            step = first_step
            while steps is None or step < first_step + steps:
                save(fabric, run_dir, state, step)
                os.write(write_end, step.to_bytes(4, "little"))
                step += 1
        finally:
            os._exit(0 if steps is not None else 1)
    os.close(write_end)
    return pid, read_end


def read_started(read_end: int, what: str, timeout_s: float = 30.0) -> None:
    ready, _, _ = select.select([read_end], [], [], timeout_s)
    assert ready and os.read(read_end, 1) == b"S", f"{what} did not start within {timeout_s:.0f} s"


def reported_steps(read_end: int) -> list[int]:
    """The steps whose save returned in the child, read once the child is gone (the pipe is at its end)."""
    data = b""
    while chunk := os.read(read_end, 4096):
        data += chunk
    os.close(read_end)
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data) - len(data) % 4, 4)]


@pytest.mark.slow
def test_fifty_sigkills_during_saves_always_resume_from_the_newest_whole_checkpoint(fabric, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer, reader = tiny_state(fabric), tiny_state(fabric)
    save(fabric, run_dir, writer, 1)
    # One save's time as a forked child takes it (its first writes fault in copied pages; the parent's own
    # save is faster, and kills sized from it landed before most children had published anything).
    calibrate = tmp_path / "calibrate"
    calibrate.mkdir()
    pid, read_end = forked_saver(fabric, calibrate, tiny_state(fabric), 1, steps=3)
    read_started(read_end, "the calibrating saver")
    started = time.perf_counter()
    assert os.waitpid(pid, 0)[1] == 0 and reported_steps(read_end) == [1, 2, 3]
    save_s = (time.perf_counter() - started) / 3
    rng = random.Random(KILL_SEED)
    next_step, mid_write, after_a_save, resumed_steps = 2, 0, 0, []
    for kill in range(KILLS):
        pid, read_end = forked_saver(fabric, run_dir, writer, next_step)
        read_started(read_end, f"saver {kill + 1}")
        # Up to ~4 saves' time from the child's start: kills land in the state write, the fsyncs, the
        # manifest, the rename, the pruning of old checkpoints and the event append, and about one in four
        # before the first save returned.
        time.sleep(rng.uniform(0, 4 * save_s))
        os.kill(pid, signal.SIGKILL)
        assert os.waitpid(pid, 0)[1] == signal.SIGKILL
        returned = reported_steps(read_end)
        after_a_save += bool(returned)
        mid_write += bool(temp_files(checkpoint_dir(run_dir)))
        sweep_dead_temp_files(checkpoint_dir(run_dir))  # what the trainer does before it resumes
        newest = complete_checkpoints(run_dir)[-1][0]
        assert newest >= max(returned, default=next_step - 1), f"kill {kill + 1}: a save that returned was lost"
        with deadline(30, f"resume after kill {kill + 1}"):
            resumed = resume(fabric, run_dir, reader, spec_hash=SPEC_HASH)
        assert resumed.path == checkpoint_path(run_dir, newest), f"kill {kill + 1}"
        assert reader["step"] == newest and stamped_step(reader) == newest, f"kill {kill + 1}"
        resumed_steps.append(newest)
        next_step = newest + 1
    print(f"{KILLS} kills, one forked save {save_s * 1e3:.1f} ms, {mid_write} inside a save's temp directory, "
          f"{after_a_save} after a save returned, resumed steps {resumed_steps[0]}..{resumed_steps[-1]}")
    assert not (checkpoint_dir(run_dir) / CORRUPT_DIR).exists(), "a kill left a published checkpoint that is not whole"
    assert events(run_dir, CHECKPOINT_CORRUPT) == [] and temp_files(checkpoint_dir(run_dir)) == []
    assert mid_write >= KILLS // 4, f"only {mid_write} of {KILLS} kills landed inside a save's temp directory"
    assert after_a_save >= KILLS // 4, f"only {after_a_save} of {KILLS} kills came after a save had returned"
    assert resumed_steps == sorted(resumed_steps)  # the chain never went back


def test_a_flipped_byte_and_a_truncation_fall_back_with_events_naming_the_file(fabric, tmp_path: Path,
                                                                             capfd: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = tiny_state(fabric)
    for step in (1, 2, 3):
        save(fabric, run_dir, state, step, Retention(keep_last=3))
    newest = checkpoint_path(run_dir, 3) / STATE_FILE
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of the tensor bytes: torch.load would not notice
    newest.write_bytes(bytes(data))
    reader = tiny_state(fabric)
    assert resume(fabric, run_dir, reader, spec_hash=SPEC_HASH).path == checkpoint_path(run_dir, 2)
    assert stamped_step(reader) == 2
    [flipped] = events(run_dir, CHECKPOINT_CORRUPT)
    assert (flipped["step"], flipped["file"], flipped["reason"]) == (3, f"checkpoints/step-00000003.ckpt/{STATE_FILE}",
                                                                     "sha256")
    assert flipped["expected"] == read_manifest(run_dir / flipped["moved_to"])["files"][0]["sha256"] != flipped["found"]
    assert (run_dir / flipped["moved_to"]).parent.name == CORRUPT_DIR

    truncated = checkpoint_path(run_dir, 2) / STATE_FILE
    size = truncated.stat().st_size
    with open(truncated, "r+b") as handle:
        handle.truncate(size - 100)
    reader = tiny_state(fabric)
    assert resume(fabric, run_dir, reader, spec_hash=SPEC_HASH).path == checkpoint_path(run_dir, 1)
    assert stamped_step(reader) == 1
    cut = events(run_dir, CHECKPOINT_CORRUPT)[-1]
    assert (cut["step"], cut["file"], cut["reason"], cut["expected"], cut["found"]) == (
        2, f"checkpoints/step-00000002.ckpt/{STATE_FILE}", "size", f"{size} B", f"{size - 100} B")
    # The job log has the same evidence, one IDMCTL_EVENT line each; moved aside, neither is listed again.
    logged = [fields for line in capfd.readouterr().err.splitlines() if (fields := parse_event_line(line))]
    assert [(f["event"], f["step"], f["reason"]) for f in logged] == [(CHECKPOINT_CORRUPT, "3", "sha256"),
                                                                      (CHECKPOINT_CORRUPT, "2", "size")]
    assert [step for step, _ in complete_checkpoints(run_dir)] == [1]
    assert sorted(p.name for p in (checkpoint_dir(run_dir) / CORRUPT_DIR).iterdir()) == [
        "step-00000002.ckpt", "step-00000003.ckpt"]


@pytest.mark.parametrize("damage", ["manifest_not_json", "manifest_missing", "points_nowhere", "file_missing"])
def test_a_damaged_newest_checkpoint_is_an_event_and_a_fallback_never_a_traceback(fabric, tmp_path: Path,
                                                                                  damage: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = tiny_state(fabric)
    for step in (4, 8):
        save(fabric, run_dir, state, step)
    newest = checkpoint_path(run_dir, 8)
    if damage == "manifest_not_json":
        (newest / MANIFEST_FILE).write_text('{"files": [{"path": "state.ckpt", "by')
    elif damage == "manifest_missing":
        (newest / MANIFEST_FILE).unlink()
    elif damage == "file_missing":
        (newest / STATE_FILE).unlink()
    else:  # a name that points nowhere: a dangling symlink where the newest checkpoint was
        import shutil

        shutil.rmtree(newest)
        newest.symlink_to(tmp_path / "gone")
    reader = tiny_state(fabric)
    assert resume(fabric, run_dir, reader, spec_hash=SPEC_HASH).path == checkpoint_path(run_dir, 4)
    assert stamped_step(reader) == 4
    [event] = events(run_dir, CHECKPOINT_CORRUPT)
    assert event["step"] == 8 and event["reason"] == {"points_nowhere": "not_published"}.get(damage, damage)
    assert event["file"].startswith("checkpoints/step-00000008.ckpt")


def test_a_checkpoint_that_verifies_but_does_not_load_is_refused_and_the_one_before_loads(fabric,
                                                                                         tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save(fabric, run_dir, tiny_state(fabric), 1)
    other = torch.nn.Linear(128, 64)  # another shape: bytes as written, but not this model's
    with torch.no_grad():
        other.weight.fill_(2.0)
    model, optimizer = fabric.setup(other, torch.optim.AdamW(other.parameters()))
    wrong = {"model": model, "optimizer": optimizer, "step": 2, "best": {}}
    save_checkpoint(fabric, run_dir, 2, wrong, spec_hash=SPEC_HASH)
    reader = tiny_state(fabric)
    resumed = resume(fabric, run_dir, reader, spec_hash=SPEC_HASH)
    assert resumed.path == checkpoint_path(run_dir, 1) and stamped_step(reader) == 1
    [event] = events(run_dir, CHECKPOINT_UNLOADABLE)
    assert event["step"] == 2 and "size mismatch" in event["found"]


def test_a_single_file_checkpoint_from_before_manifests_still_resumes_unverified(fabric, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    writer = tiny_state(fabric)
    stamp(writer, 6)
    legacy = checkpoint_path(run_dir, 6)
    legacy.parent.mkdir(parents=True)
    fabric.save(legacy, writer)  # what the trainer wrote before: step-N.ckpt as one file
    reader = tiny_state(fabric)
    assert resume(fabric, run_dir, reader, spec_hash=SPEC_HASH).path == legacy and stamped_step(reader) == 6
    [event] = events(run_dir, CHECKPOINT_UNVERIFIED)
    assert event["step"] == 6 and event["file"] == "checkpoints/step-00000006.ckpt"


def test_retention_keeps_the_last_k_and_the_best_by_the_goals_direction(fabric, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = tiny_state(fabric)
    errors = {1: 30.0, 2: 12.0, 3: 20.0, 4: 25.0, 5: 40.0}
    lower = Retention(keep_last=2, metric="eef_mm_2ep", lower_is_better=True)
    for step, error in errors.items():
        save(fabric, run_dir, state, step, lower, metrics={"eef_mm_2ep": error})
    assert [step for step, _ in complete_checkpoints(run_dir)] == [2, 4, 5]  # last 2, and 12 mm at step 2
    higher = Retention(keep_last=1, metric="eef_mm_2ep", lower_is_better=False)
    assert sorted(p.name for p in kept(complete_checkpoints(run_dir), higher)) == ["step-00000005.ckpt"]
    prune(run_dir, Retention(keep_last=1))
    assert [step for step, _ in complete_checkpoints(run_dir)] == [5]


def test_retention_of_a_spec_follows_its_goal() -> None:
    from ground.spec.schema import ExperimentSpec
    from ground.spec.loader import load_spec

    spec = load_spec("quickstart").spec
    assert Retention.of(spec) == Retention(2, spec.goal_parsed.metric if spec.goal else spec.eval.metric, True)
    document = spec.model_dump(mode="json")
    document["goal"] = "eef_mm_2ep >= 3"
    document["train"].update(keep_last=4)
    assert Retention.of(ExperimentSpec.model_validate(document)) == Retention(4, "eef_mm_2ep", False)
    document["train"].update(keep_best=False)
    assert Retention.of(ExperimentSpec.model_validate(document)) == Retention(4, None, True)


@pytest.mark.slow
def test_the_trainer_killed_in_a_checkpoint_write_resumes_past_a_flipped_and_a_truncated_one(tiny_cache,
                                                                                            tmp_path: Path) -> None:
    """``python -m trainers.train`` SIGKILLed inside the write of step 4 (its state is fsynced, no manifest
    yet); step 3 then gets a flipped byte and step 2 a truncation. The rerun refuses both with events naming
    the files, resumes from step 1 and completes."""
    from test_temp_sweep import KILL_IN_FSYNC_OF
    from test_train import prepare_run, run_trainer, trainer_env

    run_dir = prepare_run(tiny_cache, tmp_path, "killed_mid_save",
                          train={"steps": 5, "checkpoint_every": 1, "log_every": 1, "keep_last": 3})
    body = (f"import runpy; sys.argv = ['trainers.train', '--run-dir', {str(run_dir)!r}]\n"
            "runpy.run_module('trainers.train', run_name='__main__')\n")
    killed = subprocess.run([sys.executable, "-c", KILL_IN_FSYNC_OF + body, ".step-00000004.ckpt.tmp"],
                            cwd=REPO_ROOT, capture_output=True, text=True, env=trainer_env(IDMCTL_ATTEMPT="1"),
                            timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [step for step, _ in complete_checkpoints(run_dir)][-3:] == [1, 2, 3]
    assert [p.name for p in temp_files(checkpoint_dir(run_dir))] == [".step-00000004.ckpt.tmp"]
    flip = checkpoint_path(run_dir, 3) / STATE_FILE
    data = bytearray(flip.read_bytes())
    data[-200] ^= 0xFF
    flip.write_bytes(bytes(data))
    with open(checkpoint_path(run_dir, 2) / STATE_FILE, "r+b") as handle:
        handle.truncate(1000)

    rerun = run_trainer(run_dir, IDMCTL_ATTEMPT="2")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resumed from step-00000001.ckpt at step 1" in rerun.stdout
    logged = [fields for line in rerun.stderr.splitlines() if (fields := parse_event_line(line))]
    assert [(f["event"], f["file"], f["reason"]) for f in logged] == [
        (CHECKPOINT_CORRUPT, f"checkpoints/step-00000003.ckpt/{STATE_FILE}", "sha256"),
        (CHECKPOINT_CORRUPT, f"checkpoints/step-00000002.ckpt/{STATE_FILE}", "size")]
    assert temp_files(checkpoint_dir(run_dir)) == []
    assert [step for step, _ in complete_checkpoints(run_dir)][-3:] == [3, 4, 5]
    manifest = read_manifest(checkpoint_path(run_dir, 5))
    assert manifest["step"] == 5 and manifest["spec_hash"] == json.loads((run_dir / SPEC_FILE).read_text())["hash"]
    assert len(manifest["code_version"]) == 16 and manifest["metrics"]


def test_the_disk_check_counts_the_kept_checkpoints_at_the_smokes_size() -> None:
    from ground.spec.loader import load_spec
    from idmctl.gate import disk
    from idmctl.core.checks import Measurements, PreflightContext, SmokeMeasurement, Status
    from idmctl.core.profile import load_profile

    resolved, profile = load_spec("quickstart"), load_profile("local")[0]
    smoke = SmokeMeasurement(ok=True, checkpoint_s=0.5, checkpoint_bytes=3 * 10**9)
    fits = disk.check(PreflightContext(resolved, profile, Measurements(smoke=smoke, runs_free_bytes=20 * 10**9)))
    assert fits.numbers["checkpoints_bytes"] == 4 * 3 * 10**9  # 2 last + 1 best + 1 being written
    assert "checkpoints (2 last + 1 best + 1 being written) × 3.0 GB = 12.0 GB vs 20.0 GB free" in fits.summary
    assert fits.status is not Status.FAIL
    full = disk.check(PreflightContext(resolved, profile, Measurements(smoke=smoke, runs_free_bytes=10 * 10**9)))
    assert full.status is Status.FAIL and "ENOSPC at a checkpoint" in full.summary and "train.keep_last" in full.fix
    unsized = disk.check(PreflightContext(resolved, profile, Measurements(runs_free_bytes=10)))
    assert "not sized: no smoke measured one" in unsized.summary and unsized.numbers["checkpoint_bytes"] is None


def test_retention_fields_leave_every_shipped_spec_hash_as_it_was() -> None:
    from ground.spec.loader import canonical_spec, list_experiments, load_experiments, load_spec

    for path in list_experiments():
        for resolved in load_experiments(str(path)):  # a sweep: each variant
            train = canonical_spec(resolved.spec)["train"]
            assert "keep_last" not in train and "keep_best" not in train, resolved.name
    spec = load_spec("quickstart").spec
    changed = spec.model_copy(update={"train": spec.train.model_copy(update={"keep_last": 3, "keep_best": False})})
    assert {k: canonical_spec(changed)["train"][k] for k in ("keep_last", "keep_best")} == {"keep_last": 3,
                                                                                          "keep_best": False}

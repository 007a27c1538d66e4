"""``ground.stage.users``: which jobs use a staged copy, read from the flocks their scripts hold."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from ground.stage import prepare, users, users_dir


def _hold(path: Path) -> subprocess.Popen:
    """A job script's hold on its file: ``flock -s`` on an fd kept open by a live process (util-linux flock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(["bash", "-c", f'exec 8>>"{path}" && flock -s 8 && echo held && exec sleep 60'],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_users_are_live_holders_naming_a_copy_and_ended_jobs_are_pruned(tmp_path: Path) -> None:
    dest = tmp_path / "idm"
    folder = users_dir(dest)
    reading, waiting = _hold(folder / "101"), _hold(folder / "102")
    try:
        (folder / "101").write_text("staged\tall of /cache\n")  # 102 holds its file, its stage-in not done yet
        (folder / "99").write_text("staged\tall of /cache\n")  # a job that ended: no process holds its file
        assert users(dest) == ["101"]
        assert users(dest, me="101") == []
        assert sorted(p.name for p in folder.iterdir()) == ["101", "102"]
    finally:
        for holder in (reading, waiting):
            holder.kill()
            holder.wait()
    assert users(dest) == [] and not any(folder.iterdir())


def test_a_replace_waits_for_the_reader_and_then_names_it(tmp_path: Path) -> None:
    source_a, source_b, dest = tmp_path / "a", tmp_path / "b", tmp_path / "idm"
    for source in (source_a, source_b):
        source.mkdir()
        (source / "ep0.safetensors").write_bytes(source.name.encode() * 10)
    assert prepare(source_a, dest, "all", "m", me="7")[0] == "fresh"
    (dest / "ep0.safetensors").write_bytes(b"a" * 10)
    from ground.stage import commit

    commit(dest)
    holder = _hold(users_dir(dest) / "7")
    try:
        started = time.monotonic()
        with pytest.raises(SystemExit, match=r"is in use by job 7 \(reading the copy of all of .*/a .*not replaced "
                                             r"after waiting 1 s"):
            prepare(source_b, dest, "all", "m", me="8", wait_s=1)
        assert time.monotonic() - started >= 1
        assert (dest / "ep0.safetensors").read_bytes() == b"a" * 10
    finally:
        holder.kill()
        holder.wait()
    assert prepare(source_b, dest, "all", "m", me="8", wait_s=1)[0] == "replace"
    assert (users_dir(dest) / "8").read_text().startswith("replace\t")

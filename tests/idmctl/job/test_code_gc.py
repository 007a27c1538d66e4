"""``idmctl gc`` owns only what submit wrote: real snapshot stores made by ``ground.code_snapshot``, real
job rows in the test's store. A folder without a manifest, a file in the object store not named like an
object, and a snapshot any field of an unfinished job names (old fields, new fields, a record lacking a
field) all stay; a store that is a file is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ground import code_snapshot as snap
from ground.paths import home
from idmctl.job.code_gc import collect

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}


def _repo(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("WIDTH = 4\n")
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "first")):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env={**os.environ, **GIT_ENV},
                       timeout=60)
    return root


def _snapshot(repo: Path, store: Path, width: int) -> tuple[Path, str]:
    (repo / "pkg" / "model.py").write_text(f"WIDTH = {width}\n" * 50)
    tree = snap.tree(repo)
    return snap.materialize(tree, store), tree.version


def _job(state: str, chain_status: str = "DONE", **columns) -> None:
    from idmctl.record.db import session
    from idmctl.record.models import Chain, Job

    with session() as db:
        chain = Chain(experiment="x", spec_hash="h", retries_budget=0, status=chain_status)
        db.add(chain)
        db.flush()
        db.add(Job(chain_id=chain.id, attempt=1, experiment="x", spec_hash="h", code_version="0", executor="slurm",
                   state=state, created_at=datetime.now(timezone.utc), **columns))


def test_gc_removes_only_snapshots_and_objects_it_wrote_and_none_a_live_job_names(tmp_path: Path,
                                                                              store_backend: str) -> None:
    """On the embedded SQLite store and on the real PostgreSQL (its JSON columns come back decoded)."""
    repo = _repo(tmp_path / "repo")
    store = tmp_path / "store"
    by_controller, _ = _snapshot(repo, store, 1)
    by_version, version = _snapshot(repo, store, 2)
    lacking, _ = _snapshot(repo, store, 3)
    unused, _ = _snapshot(repo, store, 4)
    ended, _ = _snapshot(repo, store, 5)
    # A running job whose code record lacks env_digest (JobCode.from_record gives None for it) and whose
    # controller record names a snapshot of its own; a pending one naming its snapshot by version only.
    _job("RUNNING", code={"directory": str(lacking), "version": "x"},
         controller={"scheduler_id": "9", "code": {"version": "y", "directory": str(by_controller)}})
    _job("PENDING", code={"version": version})
    _job("COMPLETED", code={"directory": str(ended), "version": "z", "store": str(store), "env_digest": "e"})
    # What idmctl did not write: a folder without a manifest (named like a snapshot, and not), a symlink to
    # a snapshot, a file at the top of snapshots/, files in objects/ not named like objects.
    notes = store / snap.SNAPSHOTS_DIR / "my-notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("mine")
    hexless = store / snap.SNAPSHOTS_DIR / ("ab" * 8)
    hexless.mkdir()
    (store / snap.SNAPSHOTS_DIR / ("cd" * 8)).symlink_to(unused)
    (store / snap.OBJECTS_DIR / "README").write_text("mine")
    some = next(p for p in (store / snap.OBJECTS_DIR).iterdir() if p.is_dir())
    (some / "notes.txt").write_text("mine")
    (store / snap.OBJECTS_DIR / "zz").mkdir()
    unused_objects = {str(p) for p in unused.rglob("*") if p.is_file() and p.name != snap.MANIFEST}
    assert unused_objects

    done = collect(store)
    assert sorted(done.kept) == sorted([by_controller.name, by_version.name, lacking.name])
    assert sorted(done.removed) == sorted([unused.name, ended.name])
    assert sorted(done.foreign) == sorted([f"{snap.SNAPSHOTS_DIR}/my-notes", f"{snap.SNAPSHOTS_DIR}/{'ab' * 8}",
                                           f"{snap.SNAPSHOTS_DIR}/{'cd' * 8}", f"{snap.OBJECTS_DIR}/README",
                                           f"{snap.OBJECTS_DIR}/{some.name}/notes.txt", f"{snap.OBJECTS_DIR}/zz"])
    assert (notes / "keep.txt").read_text() == "mine" and hexless.is_dir()
    assert (store / snap.OBJECTS_DIR / "README").exists() and (some / "notes.txt").exists()
    assert not unused.exists() and not ended.exists()
    for kept in (by_controller, by_version, lacking):
        snap.verify_snapshot(kept, json.loads((kept / snap.MANIFEST).read_text())["version"])
    assert collect(store).removed == []  # a second pass finds nothing more of its own


def test_gc_refuses_a_store_that_is_a_file_in_one_line(cli, tmp_path: Path) -> None:
    store = home() / "code"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text("a file, not a store")
    result = cli("gc")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.stderr
    assert str(store) in lines[0] and "not a folder" in lines[0] and "code_store" in lines[0]
    assert store.read_text() == "a file, not a store"


def test_gc_on_a_store_with_only_what_it_did_not_write_removes_nothing(cli, tmp_path: Path) -> None:
    store = home() / "code"
    (store / snap.SNAPSHOTS_DIR / "0123456789abcdef").mkdir(parents=True)
    (store / snap.OBJECTS_DIR / "ab").mkdir(parents=True)
    (store / snap.OBJECTS_DIR / "ab" / ("c" * 62 + ".txt")).write_text("mine")
    result = cli("gc")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{store}: removed 0 snapshot(s), 0 B of file contents; kept 0 in use",
        f"  left 2 entries idmctl did not write: {snap.SNAPSHOTS_DIR}/0123456789abcdef, "
        f"{snap.OBJECTS_DIR}/ab/{'c' * 62}.txt"]
    assert (store / snap.SNAPSHOTS_DIR / "0123456789abcdef").is_dir()


@pytest.mark.parametrize("where", [snap.SNAPSHOTS_DIR, snap.OBJECTS_DIR])
def test_gc_refuses_a_store_whose_parts_are_files(tmp_path: Path, where: str) -> None:
    from ground.errors import UserError

    store = tmp_path / "store"
    store.mkdir()
    (store / where).write_text("x")
    with pytest.raises(UserError, match="not a folder"):
        collect(store)
    assert (store / where).read_text() == "x"

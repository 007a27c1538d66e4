"""The code a job runs (ground.code_snapshot): the tree's digest is the code version, a snapshot is
immutable and content-addressed, and a job refuses code or an environment other than what was admitted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ground import code_snapshot as snap
from ground import contract

REPO = Path(__file__).resolve().parents[2]
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}


def _git(root: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                            env={**os.environ, **GIT_ENV}, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small git repository shaped like a code root: a package, an ignored folder, one commit."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("WIDTH = 4\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("outputs/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "first")
    return root


def test_the_same_tree_gives_the_same_version_and_a_clean_tree_is_stable(repo: Path) -> None:
    first, second = snap.tree(repo), snap.tree(repo)
    assert first.version == second.version and len(first.version) == snap.VERSION_LENGTH
    assert first.commit == _git(repo, "rev-parse", "--short", "HEAD").strip()
    assert [f.path for f in first.files] == [".gitignore", "pkg/__init__.py", "pkg/model.py", "run.sh"]
    assert {f.path: f.kind for f in first.files}["run.sh"] == "x"


def test_an_untracked_module_changes_the_version_an_ignored_file_does_not(repo: Path) -> None:
    before = snap.tree(repo).version
    (repo / "outputs").mkdir()
    (repo / "outputs" / "log.txt").write_text("ignored by git")
    assert snap.tree(repo).version == before
    (repo / "pkg" / "helper.py").write_text("def f():\n    return 1\n")  # new, never `git add`ed
    with_untracked = snap.tree(repo).version
    assert with_untracked != before
    (repo / "pkg" / "helper.py").unlink()
    assert snap.tree(repo).version == before
    (repo / "pkg" / "model.py").write_text("WIDTH = 5\n")  # a tracked file modified, uncommitted
    assert snap.tree(repo).version not in (before, with_untracked)
    (repo / "run.sh").chmod(0o644)
    (repo / "pkg" / "model.py").write_text("WIDTH = 4\n")
    assert snap.tree(repo).version != before, "the executable bit is part of what runs"


def test_outside_git_the_walk_digests_the_same_files(repo: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(repo, plain, ignore=shutil.ignore_patterns(".git"))
    (plain / "pkg" / "__pycache__").mkdir()
    (plain / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    walked = snap.tree(plain)
    assert walked.commit is None
    assert walked.version == snap.tree(repo).version  # same paths, modes and contents: same code


def test_snapshots_share_unchanged_files_and_are_read_only(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = snap.materialize(snap.tree(repo), store)
    assert (first / "pkg" / "model.py").read_text() == "WIDTH = 4\n"
    # Modes, not os.access: the suite may run as root, who may write anything.
    assert (first / "run.sh").stat().st_mode & 0o777 == 0o555
    assert (first / "pkg" / "model.py").stat().st_mode & 0o777 == 0o444
    assert snap.materialize(snap.tree(repo), store) == first  # idempotent
    (repo / "pkg" / "model.py").write_text("WIDTH = 6\n")
    second = snap.materialize(snap.tree(repo), store)
    assert second != first and (second / "pkg" / "model.py").read_text() == "WIDTH = 6\n"
    assert (first / "pkg" / "model.py").read_text() == "WIDTH = 4\n"  # the first snapshot did not move
    assert os.stat(first / "run.sh").st_ino == os.stat(second / "run.sh").st_ino  # one object, two links
    # The folder is named by the whole tree; the manifest also keeps the code version (what runs).
    assert snap.read_manifest(second)["digest"][:snap.VERSION_LENGTH] == second.name
    assert snap.read_manifest(second)["version"] == snap.tree(repo).version
    assert not [p for p in (store / snap.SNAPSHOTS_DIR).iterdir() if p.name.startswith(".")], "no temp folder left"


def test_an_edited_snapshot_is_refused_with_the_file_named(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    frozen = snap.tree(repo)
    directory = snap.materialize(frozen, store)
    snap.verify_snapshot(directory, frozen.version)
    target = directory / "pkg" / "model.py"
    target.unlink()  # the hard link is read-only; replacing it is what an editor's save does
    target.write_text("raise SystemExit('edited')\n")
    (directory / "pkg" / "extra.py").write_text("")
    with pytest.raises(snap.SnapshotError) as caught:
        snap.verify_snapshot(directory, frozen.version)
    message = str(caught.value)
    assert message.startswith(f"{contract.FAILURE_MARKER} cause={contract.CAUSE_SNAPSHOT_MODIFIED} ")
    assert "edited pkg/model.py" in message and "added pkg/extra.py" in message
    with pytest.raises(snap.SnapshotError, match="not the admitted 0000"):
        snap.verify_snapshot(snap.materialize(snap.tree(repo), tmp_path / "other"), "0000")


def test_modules_imported_from_outside_the_snapshot_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process imported ``ground`` from the work tree: inside a job that is the live tree an
    editable install pulls back in, and the trainer's start-up check names it."""
    frozen = snap.tree(REPO)
    directory = snap.materialize(frozen, tmp_path / "store")
    monkeypatch.setenv(contract.ENV_SNAPSHOT, str(directory))
    monkeypatch.setenv(contract.ENV_CODE_VERSION, frozen.version)
    with pytest.raises(snap.SnapshotError) as caught:
        snap.verify_running(check_environment=False)
    assert str(caught.value).startswith(f"{contract.FAILURE_MARKER} cause={contract.CAUSE_SNAPSHOT_MODIFIED} modules "
                                        f"were imported from outside the snapshot {directory}")
    assert f"ground.code_snapshot from {REPO / 'ground' / 'code_snapshot.py'}" in snap.stray_modules(directory)
    assert snap.refuse_unadmitted_code() == contract.EXIT_CODE_MISMATCH
    # Run from the snapshot itself, the same check passes: every module of its packages is its own.
    verified = subprocess.run([sys.executable, "-m", "ground.code_snapshot", "verify"], cwd=directory,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, contract.ENV_SNAPSHOT: str(directory),
                                   contract.ENV_CODE_VERSION: frozen.version})
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"idmctl: code {frozen.version} verified" in verified.stdout


def test_a_changed_environment_names_the_packages_that_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "site"
    extra.mkdir()
    monkeypatch.syspath_prepend(str(extra))
    store = tmp_path / "store"
    digest = snap.record_environment(store)
    assert snap.record_environment(store) == digest  # the install stamp held: reused, not listed again
    snap.verify_environment(digest, store)
    info = extra / "fakepkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
    with pytest.raises(snap.SnapshotError) as caught:
        snap.verify_environment(digest, store)
    assert f"cause={contract.CAUSE_ENV_CHANGED}" in str(caught.value) and "+ fakepkg 1.0" in str(caught.value)
    assert snap.record_environment(store) != digest  # the stamp moved with the new dist-info folder


def test_environment_changes_read_as_a_diff() -> None:
    before = {"python": "3.11.2", "prefix": "/v", "packages": {"torch": "2.13.0", "h5py": "3.16.0"}}
    after = {"python": "3.11.2", "prefix": "/v", "packages": {"torch": "2.14.0", "hypothesis": "6.1"}}
    assert snap.environment_changes(before, after) == ["- h5py 3.16.0", "+ hypothesis 6.1", "torch 2.13.0 → 2.14.0"]


def test_gc_keeps_what_an_unfinished_chain_uses_and_frees_the_rest(repo: Path, tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from idmctl.job.code import JobCode, usage
    from idmctl.job.code_gc import collect
    from idmctl.record.db import session
    from idmctl.record.models import Chain, Job

    store = tmp_path / "store"
    admitted = snap.tree(repo).version
    used = snap.materialize(snap.tree(repo), store)
    (repo / "pkg" / "model.py").write_text("WIDTH = 8\n" * 1000)
    unused = snap.materialize(snap.tree(repo), store)
    assert usage(store).snapshots == 2
    with session() as db:
        chain = Chain(experiment="x", spec_hash="h", retries_budget=0)
        db.add(chain)
        db.flush()
        code = JobCode(admitted, str(used), str(store), "e")
        db.add(Job(chain_id=chain.id, attempt=1, experiment="x", spec_hash="h", code_version=admitted, executor="slurm",
                   state="PENDING", code=code.as_dict(), created_at=datetime.now(timezone.utc)))
    preview = collect(store, dry_run=True)
    assert (preview.kept, preview.removed, preview.freed_bytes) == ([used.name], [unused.name], len("WIDTH = 8\n") * 1000)
    assert unused.exists()
    done = collect(store)
    assert done.removed == [unused.name] and not unused.exists() and used.exists()
    snap.verify_snapshot(used, admitted)  # nothing the kept snapshot links to was removed
    assert usage(store).snapshots == 1


@pytest.mark.slow
def test_resume_runs_the_chains_snapshot_and_code_current_moves_it_through_the_gate(
        cli, tiny_cache, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the local executor, in a copy of the project whose tree changes between attempts."""
    import tempfile

    from snapshot_support import chain_rows, idmctl, make_project, submitted, sync_as_attempts_end

    home = Path(tempfile.mkdtemp(prefix="idmctl-resume-test-"))
    try:
        project = make_project(home)
        spec = str(tiny_cache.spec_file(home / "specs", "tiny_resume"))
        env = {contract.ENV_CLUSTER: "local", "IDMCTL_TEST_BEHAVIOR": "steps:2:0.05"}
        base = ("--entry", "tests.jobs_entry", "--json")
        first = submitted(idmctl(project, home, "submit", spec, *base, "--force", "--reason", "r", **env))
        assert sync_as_attempts_end(project, home, first["chain"], 120) == "COMPLETED"
        admitted = chain_rows(home, first["chain"])[0]["code_version"]
        entry = project / "tests" / "jobs_entry.py"
        entry.write_text(entry.read_text() + "\n# changed after the chain ran\n")
        moved_on = snap.tree(project).version
        assert moved_on != admitted

        again = submitted(idmctl(project, home, "submit", spec, *base, "--resume", str(first["chain"]),
                                 "--force", "--reason", "r", **env))
        assert sync_as_attempts_end(project, home, first["chain"], 120) == "COMPLETED"
        refused = idmctl(project, home, "submit", spec, "--entry", "tests.jobs_entry", "--resume",
                         str(first["chain"]), "--code", "current", **env)
        assert refused.returncode == 1 and "preflight required" in refused.stderr, refused.stderr
        moved = submitted(idmctl(project, home, "submit", spec, *base, "--resume", str(first["chain"]),
                                 "--code", "current", "--force", "--reason", "moved on purpose", **env))
        assert sync_as_attempts_end(project, home, first["chain"], 120) == "COMPLETED"
        attempts = chain_rows(home, first["chain"])
        assert [(a["attempt"], a["state"], a["code_version"]) for a in attempts] == [
            (1, "COMPLETED", admitted), (2, "COMPLETED", admitted), (3, "COMPLETED", moved_on)]
        assert again["chain"] == moved["chain"] == first["chain"]
        assert "changed after the chain ran" not in (Path(json.loads(attempts[1]["code"])["directory"])
                                                     / "tests" / "jobs_entry.py").read_text()

        # Refusals of the command line itself, which no edit of the copy's tree bears on: the suite's CLI
        # in-process (a CLI process of the copy costs seconds each), on the copy's store.
        monkeypatch.setenv(contract.ENV_HOME, str(home))
        monkeypatch.setenv(contract.ENV_CLUSTER, "local")
        for args, field in ((("--code", "current"), "--code"), (("--resume", "99"), "--resume"),
                            (("--hold",), "--hold"), (("--resume", str(first["chain"]), "--code", "live"), "--code")):
            bad = cli("submit", spec, "--force", "--reason", "r", *args)
            lines = bad.stderr.strip().splitlines()
            assert bad.exit_code == 2 and len(lines) == 1 and field in lines[0], bad.stderr
        assert len(chain_rows(home, first["chain"])) == 3  # nothing recorded by the refusals
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_an_untracked_module_locks_submit_until_the_code_is_preflighted_again(tiny_cache) -> None:
    """In a copy of the project: a pass recorded for the tree unlocks submit, also after the README and
    another experiment's spec are edited (documentation and specs are not what runs); a new, never
    `git add`ed module the entry could import makes it another code version, and the same pass no longer does."""
    import subprocess
    import sys
    import tempfile

    from snapshot_support import idmctl, make_project

    home = Path(tempfile.mkdtemp(prefix="idmctl-untracked-test-"))
    try:
        project = make_project(home)
        spec = str(tiny_cache.spec_file(home / "specs", "tiny_untracked"))
        record = (f"from ground.spec.loader import load_spec; from idmctl.core.profile import load_profile; "
                  f"from idmctl.record.preflights import code_version, record_run; r = load_spec({spec!r}); "
                  f"p, h = load_profile('local'); print(record_run(r, p.name, h, code_version(), [], with_smoke=True, "
                  f"seconds=0.1, job={{'smoke_flags': {{'--entry': 'tests.jobs_entry'}}}}).code_version)")
        recorded = subprocess.run([sys.executable, "-c", record], cwd=project, capture_output=True, text=True, timeout=120,
                                  env={**os.environ, contract.ENV_HOME: str(home)})
        assert recorded.returncode == 0, recorded.stderr
        assert recorded.stdout.strip() == snap.tree(project).version
        (project / "README.md").write_text((project / "README.md").read_text() + "\nA line of documentation.\n")
        other = next((project / "experiments").glob("*.yaml"))
        other.write_text(other.read_text() + "\n# another experiment's edit\n")
        env = {contract.ENV_CLUSTER: "local", "IDMCTL_TEST_BEHAVIOR": "steps:1:0.01"}
        unlocked = idmctl(project, home, "submit", spec, "--entry", "tests.jobs_entry", **env)
        assert unlocked.returncode == 0, unlocked.stderr
        (project / "trainers" / "new_helper.py").write_text("def helper():\n    return 1\n")
        locked = idmctl(project, home, "submit", spec, "--entry", "tests.jobs_entry", **env)
        assert locked.returncode == 1 and "preflight required: code changed since preflight #1" in locked.stderr, \
            locked.stderr
    finally:
        shutil.rmtree(home, ignore_errors=True)

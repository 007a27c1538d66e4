"""The code version means the code: the gate's key covers what runs and the Python
environment, not documentation or experiment specs; the snapshot still freezes the whole tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ground import code_snapshot as snap
from ground import contract

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for rel, text in {"pkg/__init__.py": "", "pkg/model.py": "WIDTH = 4\n", "README.md": "# team\n",
                      "docs/guide.txt": "how to\n", "experiments/a.yaml": "name: a\n", "configs/train.yaml": "lr: 1\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "first"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env={**os.environ, **GIT_ENV})
    return root


def test_docs_and_specs_leave_the_version_code_moves_it_and_the_snapshot_freezes_everything(tmp_path: Path) -> None:
    """Through submit's gate: tests/ground/test_code_snapshot.py's untracked-module test edits the README and
    another spec of a project copy and submits unlocked."""
    repo = _repo(tmp_path)
    before = snap.tree(repo)
    for rel, text in (("README.md", "# team, edited\n"), ("docs/guide.txt", "how to, v2\n"),
                      ("experiments/a.yaml", "name: a\nsteps: 5\n"), ("experiments/b.yaml", "name: b\n")):
        (repo / rel).write_text(text)
        assert snap.tree(repo).version == before.version, f"editing {rel} relocked the code"
    edited = snap.tree(repo)
    assert edited.snapshot_id != before.snapshot_id  # ... yet it is another tree, frozen whole
    store = tmp_path / "store"
    folder = snap.materialize(edited, store)
    assert (folder / "README.md").read_text() == "# team, edited\n" and (folder / "experiments" / "b.yaml").exists()
    snap.verify_snapshot(folder, before.version)
    # A config the team's code reads is code; so is the model.
    (repo / "configs" / "train.yaml").write_text("lr: 2\n")
    configured = snap.tree(repo).version
    assert configured != before.version
    (repo / "pkg" / "model.py").write_text("WIDTH = 5\n")
    assert snap.tree(repo).version not in (before.version, configured)


def test_the_environment_is_part_of_the_version(tmp_path: Path) -> None:
    """Another interpreter environment, same files: another version (a fresh process, so the digest is its own)."""
    repo = _repo(tmp_path)
    here = snap.tree(repo).version
    other = tmp_path / "site"
    (other / "extra_pkg-9.9.dist-info").mkdir(parents=True)
    (other / "extra_pkg-9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-pkg\nVersion: 9.9\n")
    probe = f"from ground import code_snapshot as s; from pathlib import Path; print(s.tree(Path({str(repo)!r})).version)"
    same = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, contract.ENV_HOME: str(tmp_path / "home")})
    moved = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                           env={**os.environ, contract.ENV_HOME: str(tmp_path / "home"), "PYTHONPATH": str(other)})
    assert same.returncode == 0 and moved.returncode == 0, same.stderr + moved.stderr
    assert same.stdout.strip() == here and moved.stdout.strip() != here

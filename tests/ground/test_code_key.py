"""The code version means the code: the gate's key covers what runs and the Python
environment, not documentation or experiment specs; the snapshot still freezes the whole tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
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


def test_a_readme_edit_keeps_submit_unlocked_and_a_model_edit_locks_it(tiny_cache) -> None:
    """In a copy of the project: the pass recorded for the code unlocks submit after the README and another
    experiment's spec are edited; editing ``trainers/model.py`` (what the spec runs) locks it."""
    from snapshot_support import idmctl, make_project

    home = Path(tempfile.mkdtemp(prefix="idmctl-code-key-test-"))
    try:
        project = make_project(home)
        spec = str(tiny_cache.spec_file(home / "specs", "tiny_code_key"))
        record = (f"from ground.spec.loader import load_spec; from idmctl.core.profile import load_profile; "
                  f"from idmctl.record.preflights import code_version, record_run; r = load_spec({spec!r}); "
                  f"p, h = load_profile('local'); print(record_run(r, p.name, h, code_version(), [], with_smoke=True, "
                  f"seconds=0.1, job={{'smoke_flags': {{'--entry': 'tests.jobs_entry'}}}}).code_version)")
        recorded = subprocess.run([sys.executable, "-c", record], cwd=project, capture_output=True, text=True, timeout=120,
                                  env={**os.environ, contract.ENV_HOME: str(home)})
        assert recorded.returncode == 0, recorded.stderr
        (project / "README.md").write_text((project / "README.md").read_text() + "\nA line of documentation.\n")
        other = next((project / "experiments").glob("*.yaml"))
        other.write_text(other.read_text() + "\n# another experiment's edit\n")
        env = {contract.ENV_CLUSTER: "local", "IDMCTL_TEST_BEHAVIOR": "steps:1:0.01"}
        unlocked = idmctl(project, home, "submit", spec, "--entry", "tests.jobs_entry", **env)
        assert unlocked.returncode == 0, unlocked.stderr
        model = project / "trainers" / "model.py"
        model.write_text(model.read_text() + "\n# an edit of the model\n")
        locked = idmctl(project, home, "submit", spec, "--entry", "tests.jobs_entry", **env)
        assert locked.returncode == 1 and "preflight required: code changed since preflight #1" in locked.stderr, \
            locked.stderr
    finally:
        shutil.rmtree(home, ignore_errors=True)

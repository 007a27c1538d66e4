"""Git in a code root runs without the root's own fsmonitor and hooks and without the caller's ``GIT_*``
variables, and a module the spec's classes import that the snapshot would leave out (hidden by the root's
``.gitignore``) fails the static preflight. Each root is a real git repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ground import code_snapshot as snap

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **GIT_ENV})


def _repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "first"]):
        assert _git(root, *args).returncode == 0
    return root


def test_the_roots_fsmonitor_and_hooks_never_run_and_the_callers_git_variables_are_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _repo(tmp_path / "team", {"pkg/__init__.py": "", "pkg/model.py": "WIDTH = 4\n"})
    ran = tmp_path / "fsmonitor_ran"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("post-index-change", "post-checkout", "pre-commit"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {ran}.{hook}\n")
        (hooks / hook).chmod(0o755)
    assert _git(root, "config", "core.fsmonitor", f"touch {ran}; false").returncode == 0
    assert _git(root, "config", "core.hooksPath", str(hooks)).returncode == 0
    # The input is real: git itself, as a user runs it, does run the root's fsmonitor.
    _git(root, "ls-files", "--cached", "--others", "--exclude-standard")
    assert ran.exists()
    ran.unlink()
    # The caller's environment points git at another repository; idmctl's listing ignores it.
    other = _repo(tmp_path / "other", {"elsewhere.py": ""})
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    listed = snap.tree(root)
    assert [f.path for f in listed.files] == ["pkg/__init__.py", "pkg/model.py"]
    assert listed.commit is not None
    assert not ran.exists() and not list(tmp_path.glob("fsmonitor_ran.*")), "a command of the root's .git/config ran"


@pytest.fixture
def hidden(tmp_path: Path) -> Iterator[Path]:
    """A team repository whose .gitignore hides a package its dataset module imports."""
    root = _repo(tmp_path / "teamrepo", {
        ".gitignore": "hidpkg/vendor/\n",
        "hidpkg/__init__.py": "",
        "hidpkg/data.py": "from hidpkg.vendor.helpers import WINDOW\n\n\nclass Data:\n"
                          "    def __init__(self, split, window=WINDOW):\n        self.window = window\n",
    })
    (root / "hidpkg" / "vendor").mkdir()
    (root / "hidpkg" / "vendor" / "__init__.py").write_text("")
    (root / "hidpkg" / "vendor" / "helpers.py").write_text("WINDOW = 2\n")
    yield root
    for name in [m for m in sys.modules if m == "hidpkg" or m.startswith("hidpkg.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p != str(root.resolve())]


def _spec(tiny_cache, directory: Path, team: Path) -> Path:
    path = tiny_cache.spec_file(directory, "hidden_spec")
    document = yaml.safe_load(path.read_text())
    document["data"]["dataset"] = {"class_path": "hidpkg.data.Data", "init_args": {}}
    document["code"] = {"roots": [str(team)]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_a_package_the_gitignore_hides_from_the_snapshot_fails_the_static_preflight(
        cli, tiny_cache, tmp_path: Path, hidden: Path, idmctl_home: Path) -> None:
    assert "hidpkg/vendor/helpers.py" not in {f.path for f in snap.tree(hidden).files}
    result = cli("preflight", str(_spec(tiny_cache, tmp_path, hidden)), "--no-smoke", "--json")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    (check,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "introspection"]
    assert check["status"] == "FAIL", check
    assert (f"module hidpkg.vendor.helpers ({hidden.resolve() / 'hidpkg' / 'vendor' / 'helpers.py'}) is imported by the "
            "spec's classes, but the code snapshot leaves it out (ignored by .gitignore:1:hidpkg/vendor/): the job would "
            "raise ModuleNotFoundError") in check["summary"], check["summary"]
    assert "module hidpkg.data " not in check["summary"]  # tracked: in the snapshot
    # Tracked with `git add -f`, it is in the snapshot, and the same preflight passes introspection.
    assert _git(hidden, "add", "-f", "hidpkg/vendor").returncode == 0
    result = cli("preflight", str(_spec(tiny_cache, tmp_path, hidden)), "--no-smoke", "--json")
    (check,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "introspection"]
    assert check["status"] == "PASS", check

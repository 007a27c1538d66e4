"""Class paths and entries of the team's own code: resolved only inside ``code.roots``; every bad one is
one line naming the spec field (exit 2 for a spec error, a check FAIL for a run-time one), never a
traceback and never a recorded pass. A root outside the project counts in the code version and lands
in the snapshot under ``_roots/``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ground import code_snapshot as snap
from ground.class_path import spec_roots
from ground.code_snapshot import code_version
from ground.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Path]:
    """A repository outside the project: a package with two look-alike classes, a broken module, a script.
    The CLI runs in this process: the package is forgotten afterwards, as a new process would not know it."""
    root = tmp_path / "teamrepo"
    (root / "teampkg").mkdir(parents=True)
    (root / "teampkg" / "__init__.py").write_text("")
    (root / "teampkg" / "data.py").write_text(
        "class Raw:\n    def __init__(self, split, layers=None):\n        pass\n\n\n"
        "class Multi:\n    def __init__(self, split, window=2):\n        pass\n\n\nNOT_A_CLASS = 3\n")
    (root / "teampkg" / "broken.py").write_text("import json\nraise RuntimeError('half-finished edit')\n")
    (root / "run.sh").write_text("#!/bin/sh\nexit 0\n")  # not executable
    yield root
    for name in [m for m in sys.modules if m == "teampkg" or m.startswith("teampkg.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p != str(root.resolve())]


def _spec(tiny_cache, directory: Path, team: Path, dataset: object, **code: object) -> Path:
    path = tiny_cache.spec_file(directory, "team_spec")
    document = yaml.safe_load(path.read_text())
    document["data"]["dataset"] = dataset
    document["code"] = {"roots": [str(team)], **code}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _one_line(result) -> str:  # type: ignore[no-untyped-def]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output + result.stderr
    return lines[0]


def _introspection(cli, spec: Path) -> dict:  # type: ignore[no-untyped-def]
    result = cli("preflight", str(spec), "--no-smoke", "--json")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    (check,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "introspection"]
    return check


def test_the_sibling_class_that_takes_the_kwarg_is_named(cli, tiny_cache, tmp_path: Path, team: Path) -> None:
    spec = _spec(tiny_cache, tmp_path, team, {"class_path": "teampkg.data.Multi", "init_args": {"layers": [0, 2]}})
    check = _introspection(cli, spec)
    assert check["status"] == "FAIL"
    assert ("`layers` is accepted by Raw (" in check["summary"] and "data.py:1), not by Multi (" in check["summary"]
            and "the class this spec builds" in check["summary"]), check["summary"]
    spec = _spec(tiny_cache, tmp_path, team, {"class_path": "teampkg.data.Multi", "init_args": {"windw": 3}})
    assert "`windw`: did you mean `window` of Multi" in _introspection(cli, spec)["summary"]
    spec = _spec(tiny_cache, tmp_path, team, {"class_path": "teampkg.data.Multi", "init_args": {"window": 3}})
    passed = cli("preflight", str(spec), "--no-smoke", "--json")
    (check,) = [c for c in json.loads(passed.stdout)["checks"] if c["name"] == "introspection"]
    assert check["status"] == "PASS" and "Multi" in check["summary"], check


@pytest.mark.parametrize(("class_path", "expected"), [
    ("teampkg.nothere.Multi", "data.dataset.class_path: module 'teampkg.nothere' of 'teampkg.nothere.Multi' does not import"),
    ("teampkg.data.Mult", "data.dataset.class_path: teampkg.data has no 'Mult'"),
    ("teampkg.data.NOT_A_CLASS", "data.dataset.class_path: 'teampkg.data.NOT_A_CLASS' is a int, not a class"),
    ("json.decoder.JSONDecoder", "data.dataset.class_path: 'json.decoder.JSONDecoder' imports from"),
    ("teampkg.broken.Anything", "importing teampkg.broken.Anything raised"),
])
def test_a_class_path_that_cannot_be_used_fails_introspection_naming_the_field(
        cli, tiny_cache, tmp_path: Path, team: Path, class_path: str, expected: str) -> None:
    spec = _spec(tiny_cache, tmp_path, team, {"class_path": class_path, "init_args": {}})
    check = _introspection(cli, spec)
    assert check["status"] == "FAIL" and expected in check["summary"], check["summary"]
    if "broken" in class_path:
        assert "broken.py:2 → RuntimeError: half-finished edit" in check["summary"]
    if class_path.startswith("json"):
        assert "outside the code roots" in check["summary"] and "add that repository to code.roots" in check["fix"]


@pytest.mark.parametrize(("dataset", "code", "field"), [
    ({"class_path": "teampkg.data.Multi", "init_args": [1, 2]}, {}, "data.dataset"),
    ({"class_path": "teampkg data;Multi"}, {}, "data.dataset"),
    ("hidden_multilayer", {"entry": "bash missing.sh"}, "code.entry"),
    ("hidden_multilayer", {"entry": "./run.sh"}, "code.entry"),
    ("hidden_multilayer", {"entry": "teampkg.nomodule"}, "code.entry"),
    ("hidden_multilayer", {"entry": "bash run.sh; rm -rf /"}, "code.entry"),
    ("hidden_multilayer", {"roots": ["/nonexistent/team"]}, "code.roots"),
])
def test_bad_class_paths_and_entries_are_one_line_exit_2_and_record_nothing(
        cli, tiny_cache, tmp_path: Path, team: Path, dataset: object, code: dict, field: str, idmctl_home: Path) -> None:
    spec = _spec(tiny_cache, tmp_path, team, dataset, **code)
    if "roots" in code:
        document = yaml.safe_load(spec.read_text())
        document["code"]["roots"] = code["roots"]
        spec.write_text(yaml.safe_dump(document))
    for command in (("preflight", str(spec), "--no-smoke"), ("submit", str(spec), "--dry-run")):
        result = cli(*command)
        assert result.exit_code == 2, (command, result.output, result.stderr)
        assert field in _one_line(result), result.stderr
    assert not (idmctl_home / "runs").exists()
    assert not list((idmctl_home / "code" / "snapshots").glob("*")) if (idmctl_home / "code").exists() else True


@pytest.mark.parametrize("root", ["/", "~", "LOOP"])
def test_a_root_that_is_the_whole_machine_or_a_symlink_loop_is_refused_before_any_hashing(
        cli, tiny_cache, tmp_path: Path, team: Path, root: str, idmctl_home: Path) -> None:
    """``code.roots: ['/']`` hashed the whole machine for a minute before failing; a loop raised."""
    if root == "LOOP":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        root = str(tmp_path / "a")
    spec = _spec(tiny_cache, tmp_path, team, "hidden_multilayer")
    document = yaml.safe_load(spec.read_text())
    document["code"]["roots"] = [root]
    spec.write_text(yaml.safe_dump(document))
    for command in (("preflight", str(spec), "--no-smoke"), ("submit", str(spec), "--dry-run")):
        result = cli(*command)
        line = _one_line(result)
        assert result.exit_code == 2 and "code.roots" in line and repr(root) in line, line
    assert not (idmctl_home / "runs").exists()


def test_a_root_outside_the_project_is_in_the_code_version_and_the_snapshot(tiny_cache, tmp_path: Path, team: Path) -> None:
    spec = load_spec(str(_spec(tiny_cache, tmp_path, team, "hidden_multilayer"))).spec
    assert spec_roots(spec) == [team.resolve()]
    with_team = code_version(spec)
    assert with_team != code_version()  # the project alone
    (team / "teampkg" / "data.py").write_text((team / "teampkg" / "data.py").read_text() + "\n# edited\n")
    assert code_version(spec) != with_team
    tree = snap.code_tree(spec_roots(spec))
    directory = snap.materialize(tree, tmp_path / "store")
    (copy,) = tree.import_dirs(directory, spec_roots(spec))
    assert copy.parent.name == snap.EXTERNAL_DIR and (copy / "teampkg" / "data.py").read_text().endswith("# edited\n")
    assert (directory / "ground" / "code_snapshot.py").exists()  # the project beside it
    assert os.path.samefile(tree.source(f"{copy.parent.name}/{copy.name}/teampkg/data.py"), team / "teampkg" / "data.py")

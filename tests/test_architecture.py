"""Which way the house is built: the ground under both planes, the data plane on it, the control plane
on top. Every import statement in the project's packages is read (top level and inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("ground", "cache", "trainers", "idmctl")
MAY_IMPORT = {
    "ground": {"ground"},
    "cache": {"ground", "cache"},
    "trainers": {"ground", "cache", "trainers"},
    "idmctl": {"ground", "cache", "trainers", "idmctl"},
}


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level project package) for every import of one of the project's packages."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name.split(".")[0]) for name in names if name.split(".")[0] in PROJECT_PACKAGES]
    return found


def test_imports_point_one_way() -> None:
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((REPO / package).rglob("*.py")):
            for line, target in project_imports(path):
                if target not in allowed:
                    wrong.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert not wrong, "imports against the house's direction:\n" + "\n".join(wrong)


def test_the_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    """The walk finds imports inside functions too, so a lazy import cannot slip past."""
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from idmctl.record import session\n    import cache.hidden\n")
    assert project_imports(module) == [(4, "idmctl"), (5, "cache")]


def test_the_ground_imports_nothing_heavy() -> None:
    """Both planes import the ground first thing; it must stay free of torch, mlflow and lightning."""
    import subprocess
    import sys

    code = ("import sys, ground, ground.contract, ground.errors, ground.paths, ground.units, ground.tracking, "
            "ground.run_dir, ground.geometry, ground.spec\n"
            "print(sorted(m for m in ('torch', 'mlflow', 'lightning_fabric', 'diffusers', 'idmctl', 'cache', 'trainers')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.strip() == "[]"

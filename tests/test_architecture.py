"""Which way the house is built: the ground under both planes, the data plane on it, the control plane
on top. Every import statement in the project's packages is read (top level and inside functions)."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from pathlib import Path
from typing import Any

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


# The control plane's floors, lowest first: a module may import its own floor and the floors below it.
FLOORS = ("core", "record", "plan", "job", "gate", "ops", "track", "cli")
FLOOR_ROLES = {
    "core": "vocabulary: the cluster profile, check results, the executor protocol",
    "record": "the store: SQL, migrations, spec versions, preflight results, the preflight memo",
    "plan": "arithmetic on spec + profile + measurements: limits, budget, what-if, ETA, efficiency",
    "job": "the job as it will run: the effective job, its code snapshot, its script",
    "gate": "the mandatory preflight: one module per check, the runner, admission",
    "ops": "running jobs: executors, submit, sync, retry, failures, ledger, doctor",
    "track": "MLflow: compare, runs view, plots, the UI server",
    "cli": "typer: commands that parse, call the library and print",
}
PRINT_CALLS = {("sys", "stdout", "write"), ("sys", "stderr", "write")}


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) for every import, ``from a.b import c`` giving ``a.b.c`` (c may be a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def floor_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "idmctl" and parts[1] in FLOORS else None


def module_graph(package: Path) -> dict[str, set[str]]:
    """Which of the package's modules each of its modules imports (top level and inside functions)."""
    root = package.parent
    modules = {module_name(path, root): path for path in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, target in imported_modules(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):  # a package's own __init__ runs first anyway
                graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_every_control_plane_module_sits_on_a_floor() -> None:
    entry_points = {REPO / "idmctl" / "__init__.py", REPO / "idmctl" / "__main__.py"}
    loose = [str(path.relative_to(REPO)) for path in sorted((REPO / "idmctl").rglob("*.py"))
             if path not in entry_points and floor_of(module_name(path)) is None]
    assert not loose, f"modules outside the floors {FLOORS}: {loose}"
    assert set(FLOOR_ROLES) == set(FLOORS)


def floor_violations(package: Path) -> list[str]:
    wrong = []
    for path in sorted(package.rglob("*.py")):
        floor = floor_of(module_name(path, package.parent))
        if floor is None:
            continue
        for line, target in imported_modules(path):
            target_floor = floor_of(target)
            if target_floor is not None and FLOORS.index(target_floor) > FLOORS.index(floor):
                wrong.append(f"{path.relative_to(package.parent)}:{line} ({floor}) imports {target} ({target_floor})")
    return wrong


def test_floors_import_only_downward() -> None:
    wrong = floor_violations(REPO / "idmctl")
    assert not wrong, f"imports against the floors' order {' <- '.join(FLOORS)}:\n" + "\n".join(wrong)


def test_the_floor_checker_sees_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "idmctl" / "plan").mkdir(parents=True)
    (tmp_path / "idmctl" / "plan" / "m.py").write_text("from idmctl.core.checks import Status\n\n"
                                                       "def f():\n    from idmctl.gate.runner import gather\n")
    assert floor_violations(tmp_path / "idmctl") == ["idmctl/plan/m.py:4 (plan) imports idmctl.gate.runner.gather (gate)"]


def test_no_import_cycles_between_modules() -> None:
    cycles = import_cycles(module_graph(REPO / "idmctl"))
    assert not cycles, "modules that import each other (directly or round a circle):\n" + "\n".join(map(str, cycles))


def test_no_import_cycles_in_the_ground_or_the_data_plane() -> None:
    """The same for the shared ground and the data plane: ground.contract once imported four modules that
    import it, and the spec loader, its overrides and its sweeps imported one another."""
    cycles = [cycle for package in ("ground", "cache", "trainers") for cycle in import_cycles(module_graph(REPO / package))]
    assert not cycles, "modules that import each other (directly or round a circle):\n" + "\n".join(map(str, cycles))


def test_the_cycle_checker_sees_a_planted_circle(tmp_path: Path) -> None:
    package = tmp_path / "idmctl" / "gate"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from idmctl.gate import b\n")
    (package / "b.py").write_text("def f():\n    from idmctl.gate.c import g\n")  # a lazy import closes it too
    (package / "c.py").write_text("import idmctl.gate.a\n")
    (package / "d.py").write_text("from idmctl.gate.a import x\n")  # imports the circle, is not in it
    assert import_cycles(module_graph(tmp_path / "idmctl")) == [["idmctl.gate.a", "idmctl.gate.b", "idmctl.gate.c"]]


def test_only_the_cli_imports_typer() -> None:
    wrong = [f"{path.relative_to(REPO)}:{line}" for package in PROJECT_PACKAGES for path in sorted((REPO / package).rglob("*.py"))
             if not path.is_relative_to(REPO / "idmctl" / "cli")
             for line, name in imported_modules(path) if name.split(".")[0] in ("typer", "click")]
    assert not wrong, f"typer outside idmctl/cli/: {wrong}"


def printing_calls(path: Path) -> list[int]:
    """Lines that write to the terminal: print(), sys.stdout/stderr.write, a rich console's print."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "print":
            lines.append(node.lineno)
        elif isinstance(func, ast.Attribute):
            chain = [func.attr]
            value = func.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                chain.append(value.id)
            if tuple(reversed(chain)) in PRINT_CALLS or func.attr == "print" and "console" in chain[-1]:
                lines.append(node.lineno)
    return lines


def test_library_floors_do_not_print() -> None:
    """Only the command line talks to the terminal; the library returns what it found (or logs a warning)."""
    wrong = [f"{path.relative_to(REPO)}:{line}" for path in sorted((REPO / "idmctl").rglob("*.py"))
             if floor_of(module_name(path)) not in (None, "cli") for line in printing_calls(path)]
    assert not wrong, f"library floors that print: {wrong}"


def test_the_print_checker_sees_every_way_to_print(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('import sys\ncode = "print(1)"\nprint(2)\nsys.stderr.write("x")\nerr_console.print("y")\n'
                      'def f():\n    from rich.console import Console\n    Console().print("z")\n')
    assert printing_calls(module) == [3, 4, 5]


CITATION = re.compile(r"\bissue \d+|§\s*\d|slurm-notes|\bgotcha \d+", re.IGNORECASE)
"""Names of documents a clone of the repository does not have: a comment says what happened instead."""
CITATION_ROOTS = ("ground", "cache", "trainers", "idmctl", "scripts", "bench", "tests")


def comment_citations(path: Path) -> list[int]:
    """Lines of comments and docstrings (a shell script's ``#`` lines) that cite an issue, a § or the notes."""
    text = path.read_text()
    if path.suffix != ".py":
        return [number for number, line in enumerate(text.splitlines(), start=1)
                if "#" in line and CITATION.search(line[line.index("#"):])]
    found = [token.start[0] for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT and CITATION.search(token.string)]
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and CITATION.search(doc):
                found.append(node.body[0].lineno)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) \
                and CITATION.search(node.value.value):  # an attribute's docstring, under its assignment
            found.append(node.lineno)
    return sorted(set(found))


def test_comments_say_what_happened_not_where_it_was_filed() -> None:
    paths = [path for root in CITATION_ROOTS for path in sorted((REPO / root).rglob("*"))
             if path.suffix in (".py", ".sh") and "__pycache__" not in path.parts]
    wrong = [f"{path.relative_to(REPO)}:{line}" for path in paths for line in comment_citations(path)]
    assert not wrong, f"comments that cite an issue, a § or the Slurm notes (say what happened instead): {wrong}"


def test_the_citation_checker_reads_comments_and_docstrings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Module (issue 19 §3)."""\nX = 1  # gotcha 6\nY = 2\n"""Y: slurm-notes 4."""\n\n'
                      'def f():\n    """Fine."""\n    return "issue 15 in a string the code uses"\n')
    assert comment_citations(module) == [1, 2, 4]
    script = tmp_path / "s.sh"
    script.write_text('echo "issue 3"\nrm -f x  # gotcha 7\n')
    assert comment_citations(script) == [2]


UNEXPLAINED_LAZY_IMPORTS = 24
"""In-function imports of the project's own modules with no comment saying why (counted when the floors
were laid). Lower it as they move to the top of their module or get their reason; never raise it."""


def lazy_project_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, explained) for each import of a project module inside a function; explained when its line
    or the line above carries a comment (``# heavy: ...``, ``# here: ...``)."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(name.split(".")[0] in PROJECT_PACKAGES for name in names):
                here, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
                found.append((node.lineno, "#" in here or above.strip().startswith("#")))
    return sorted(set(found))


def test_no_new_unexplained_lazy_imports() -> None:
    """A lazy import hides a dependency; it stays only for start-up time (a heavy library behind it) or a
    circle it breaks, and says which."""
    unexplained = [f"{path.relative_to(REPO)}:{line}" for path in sorted((REPO / "idmctl").rglob("*.py"))
                   for line, explained in lazy_project_imports(path) if not explained]
    assert len(unexplained) <= UNEXPLAINED_LAZY_IMPORTS, (
        f"{len(unexplained)} in-function project imports without a reason (at most {UNEXPLAINED_LAZY_IMPORTS}): import "
        f"at the top of the module, or say why on the line (# heavy: torch, # start-up: ...). Newest files: {unexplained[-10:]}")


def test_the_lazy_import_counter_reads_the_reason(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import ground.units\n\ndef f():\n    from idmctl.record import session\n"
                      "    from idmctl.plan.limits import limits_for  # heavy: the store's ORM\n"
                      "    # here: submit never needs it\n    import cache.hidden\n    import json\n")
    assert lazy_project_imports(module) == [(4, False), (5, True), (7, True)]


SQL_HOME = REPO / "idmctl" / "record"
SQL_LIBRARIES = ("sqlalchemy", "sqlmodel", "sqlite3", "psycopg", "alembic")
RAW_SQL = re.compile(r"^\s*(SELECT|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+(TABLE|INDEX)|"
                     r"ALTER\s+TABLE|PRAGMA)\b", re.IGNORECASE)
def sql_spoken(path: Path) -> list[str]:
    """``line: what`` for each import of a database library (top level, inside functions, under
    TYPE_CHECKING) and each string that is a SQL statement (an f-string's literal parts too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        found += [f"{node.lineno}: imports {name}" for name in names if name.split(".")[0] in SQL_LIBRARIES]
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and RAW_SQL.match(head.value):
                found.append(f"{node.lineno}: SQL {head.value.strip()[:40]!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and RAW_SQL.match(node.value):
            found.append(f"{node.lineno}: SQL {node.value.strip()[:40]!r}")
    return sorted(set(found), key=lambda entry: int(entry.split(":")[0]))


def test_only_the_record_floor_speaks_sql() -> None:
    """Storage has one home: a change to a table touches ``idmctl/record/`` and nothing else. Everything
    else asks a query function there (which keeps the sqlite3 fast path and the ORM behind one name)."""
    speaking = {str(path.relative_to(REPO)): spoken for path in sorted((REPO / "idmctl").rglob("*.py"))
                if not path.is_relative_to(SQL_HOME) and (spoken := sql_spoken(path))}
    assert not speaking, "SQL outside idmctl/record/ (add a query function there and call it):\n" + "\n".join(
        f"{path}:{entry}" for path, spoken in speaking.items() for entry in spoken)


def _store_figures() -> Any:
    spec = importlib.util.spec_from_file_location("store_figures", REPO / "scripts" / "dev" / "store_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NOT_THE_JOB_STORE = {"ground/mlflow_store.py": "opens MLflow's own SQLite tracking store (seeding, locking its first open)",
                     "ground/sqlite_template.py": "copies an empty-schema SQLite template file for a new store"}
"""Shared modules that speak SQLite to files that are not the job store. They stay in ``ground/``: the data
plane (the trainer's tracking spool) opens MLflow's store through them and may not import the control
plane's ``idmctl/record/``."""


def test_only_the_record_floor_and_named_files_speak_sql_in_the_shared_ground_and_the_data_plane() -> None:
    """The same rule for ``ground/``, ``cache/`` and ``trainers/``: no database library, except where a module
    names the SQLite file it opens and that file is not the job store. (Imports only: no SQL runs without
    one, and these packages' prose says "select" of layers and blocks.)"""
    speaking = {rel: spoken for package in ("ground", "cache", "trainers")
                for path in sorted((REPO / package).rglob("*.py"))
                if (rel := str(path.relative_to(REPO))) not in NOT_THE_JOB_STORE
                and (spoken := [entry for entry in sql_spoken(path) if ": imports " in entry])}
    assert not speaking, "SQL outside idmctl/record/ (the job store's home):\n" + "\n".join(
        f"{path}:{entry}" for path, spoken in speaking.items() for entry in spoken)
    assert all(sql_spoken(REPO / path) for path in NOT_THE_JOB_STORE), "an exemption no longer needed: remove it"


def test_outside_the_record_floor_no_new_module_holds_orm_rows_or_sessions() -> None:
    holding = {str(path.relative_to(REPO)) for path in sorted((REPO / "idmctl").rglob("*.py"))
               if not path.is_relative_to(SQL_HOME) and any(name.startswith((
                   "idmctl.record.models", "idmctl.record.db", "idmctl.record.session"))
                   for _, name in imported_modules(path))}
    assert not holding, ("read records and write transitions through idmctl.record.store "
                         f"(JobStore), not ORM rows or sessions: {sorted(holding)}")


def test_record_signatures_gain_no_any_and_the_records_load_no_sql_library() -> None:
    figures = _store_figures().figures(REPO)
    typed_any = figures["public record functions with Any in their signature"]
    assert not typed_any, f"type these with records (idmctl.record.records) or precise types, not Any: {typed_any}"
    for face in ("records.py", "store.py", "moves.py"):  # the CLI imports them: no SQL library behind them
        assert not sql_spoken(SQL_HOME / face) and not any(
            name.split(".")[0] in SQL_LIBRARIES for _, name in imported_modules(SQL_HOME / face)), face


def test_the_sql_checker_sees_imports_and_statements(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('from typing import TYPE_CHECKING\nimport select\nif TYPE_CHECKING:\n    from sqlmodel import Session\n\n'
                      'def f(db, table):\n    import sqlite3\n    db.execute(f"SELECT id FROM {table}")\n'
                      '    db.execute("  update job set state = ?", ("X",))\n    return "selected jobs", select.select\n')
    assert sql_spoken(module) == ["4: imports sqlmodel", "7: imports sqlite3", "8: SQL 'SELECT id FROM'",
                                  "9: SQL 'update job set state = ?'"]

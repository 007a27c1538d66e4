"""How far the job's record is from the rest of the house: the store's figures for one source tree.

    .venv/bin/python scripts/dev/store_figures.py [TREE] [--list]

TREE is a checkout's root (default: this one); run it on two trees (``git worktree add /tmp/before REV``)
to compare them the same way. It reads the sources with ``ast`` and imports nothing of them. Counted under
``idmctl/``, outside ``idmctl/record/`` unless said otherwise:

- **ORM importers**: modules importing ``idmctl.record.models`` (they hold ORM rows).
- **SQL importers**: modules importing ``sqlmodel``, ``sqlalchemy`` or ``sqlite3`` (at any depth, any
  ``import``/``from`` form), or ``idmctl.record.db`` (the database module).
- **session blocks**: ``with`` statements one of whose items calls a function named ``session``
  (``with session() as db:``, ``with store_db.session():``).
- **dict reads of job columns**: a subscript ``X["c"]`` or a call ``X.get("c", …)`` whose key ``c`` is a
  column of the ``job`` table (the fields of ``class Job`` in ``idmctl/record/models.py``, read by ``ast``)
  and whose receiver ``X`` is a name, or an attribute ending in a name, that holds a job's row by this
  code's own naming: ``job``, ``row``, ``old``, ``old_values``, ``latest``, ``j``. A run's dict
  (``run["state"]``) or a report's is not a job's row and is not counted.
- **Any in record signatures**: public functions and methods (no leading ``_``) of ``idmctl/record/``
  whose parameter or return annotations name ``Any``.
- **state literals**: string constants spelled exactly as a job state (``core.job_state.JobState``'s
  values, read by ``ast``) or a chain status (ACTIVE, COMPLETED, FAILED, CANCELLED), anywhere under
  ``idmctl/`` except the enums' own modules (``idmctl/core/job_state.py``, ``idmctl/record/records.py``);
  docstrings are not counted.
- **sync() lines**: ``def sync`` in ``idmctl/ops/sync.py``, from its ``def`` line to its last line, and
  the same without its docstring and blank lines.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

SQL_LIBRARIES = ("sqlmodel", "sqlalchemy", "sqlite3")
ROW_NAMES = frozenset({"job", "row", "old", "old_values", "latest", "j"})
CHAIN_STATUSES = frozenset({"ACTIVE", "COMPLETED", "FAILED", "CANCELLED"})
ENUM_HOMES = ("idmctl/core/job_state.py", "idmctl/record/records.py")


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _class_fields(tree: ast.Module, name: str) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {item.target.id for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
    return set()


def _job_states(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "JobState":
            return {item.value.value for item in node.body if isinstance(item, ast.Assign)
                    and isinstance(item.value, ast.Constant) and isinstance(item.value.value, str)}
    return set()


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the constant nodes that are docstrings or bare string statements (attribute docs)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.add(id(node.value))
    return found


def _names_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a quoted annotation
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return "Any" in annotation.value
    return any(isinstance(n, ast.Name) and n.id == "Any" or isinstance(n, ast.Attribute) and n.attr == "Any"
               for n in ast.walk(annotation))


def _public_functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            found.append(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            found += [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and not item.name.startswith("_")]
    return found


def figures(root: Path) -> dict[str, list[str]]:
    """Each figure's places (``path:line what``); the figure is the length of its list (sync's are lines)."""
    package = root / "idmctl"
    job_columns = _class_fields(_parse(package / "record/models.py"), "Job")
    states = _job_states(_parse(package / "core/job_state.py")) | CHAIN_STATUSES
    found: dict[str, list[str]] = {key: [] for key in (
        "modules importing record.models (outside record/)", "modules importing a SQL library or record.db (outside record/)",
        "session blocks (outside record/)", "dict reads of job columns (outside record/)",
        "public record functions with Any in their signature", "state literals outside the enums",
        "sync() lines (def to end)", "sync() lines (no docstring, no blanks)")}
    keys = list(found)
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        tree = _parse(path)
        inside_record = relative.startswith("idmctl/record/")
        if not inside_record:
            imported = _imports(tree)
            models = [line for line, name in imported if name.startswith("idmctl.record.models")]
            if models:
                found[keys[0]].append(f"{relative}:{models[0]}")
            sql = [(line, name) for line, name in imported if name.split(".")[0] in SQL_LIBRARIES
                   or name.startswith("idmctl.record.db")]
            if sql:
                found[keys[1]].append(f"{relative}:{sql[0][0]} {sql[0][1]}")
            for node in ast.walk(tree):
                if isinstance(node, (ast.With, ast.AsyncWith)):
                    for item in node.items:
                        call = item.context_expr
                        if isinstance(call, ast.Call) and _receiver(call.func) == "session":
                            found[keys[2]].append(f"{relative}:{node.lineno}")
                elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                    key = node.slice.value
                    if isinstance(key, str) and key in job_columns and _receiver(node.value) in ROW_NAMES:
                        found[keys[3]].append(f"{relative}:{node.lineno} {_receiver(node.value)}[{key!r}]")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                      and node.args and isinstance(node.args[0], ast.Constant)):
                    key = node.args[0].value
                    if isinstance(key, str) and key in job_columns and _receiver(node.func.value) in ROW_NAMES:
                        found[keys[3]].append(f"{relative}:{node.lineno} {_receiver(node.func.value)}.get({key!r})")
        else:
            for function in _public_functions(tree):
                arguments = function.args
                annotated = [a.annotation for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
                annotated += [a.annotation for a in (arguments.vararg, arguments.kwarg) if a is not None]
                if any(_names_any(a) for a in annotated) or _names_any(function.returns):
                    found[keys[4]].append(f"{relative}:{function.lineno} {function.name}")
        if relative not in ENUM_HOMES:
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in states
                        and id(node) not in docs):
                    found[keys[5]].append(f"{relative}:{node.lineno} {node.value!r}")
    sync_tree = _parse(package / "ops/sync.py")
    for node in sync_tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "sync":
            lines = (package / "ops/sync.py").read_text().splitlines()[node.lineno - 1:node.end_lineno]
            found[keys[6]] = [f"idmctl/ops/sync.py:{node.lineno}"] * len(lines)
            first = node.body[0]
            doc_lines = set()
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                doc_lines = set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
            code = [n for n, text in enumerate(lines, start=node.lineno) if text.strip() and n not in doc_lines]
            found[keys[7]] = [f"idmctl/ops/sync.py:{n}" for n in code]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", default=str(Path(__file__).resolve().parents[2]), help="a checkout's root")
    parser.add_argument("--list", action="store_true", help="list each figure's places")
    args = parser.parse_args(argv)
    found = figures(Path(args.tree))
    width = max(len(key) for key in found)
    for key, places in found.items():
        print(f"{key:<{width}}  {len(places):>4}")
        if args.list and not key.startswith("sync()"):
            for place in places:
                print(f"    {place}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

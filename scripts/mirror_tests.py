#!/usr/bin/env python3
"""Move the flat ``tests/test_*.py`` into a tree that mirrors the packages, with ``git mv``.

    .venv/bin/python scripts/mirror_tests.py --dry-run   # the plan: each move and why, each rewrite
    .venv/bin/python scripts/mirror_tests.py             # do it (a clean work tree is required)

Where a test goes is derived from what it imports:
- ``tests/ground/``, ``tests/cache/``, ``tests/trainers/``, ``tests/bench/``, and ``tests/idmctl/<floor>/``
  for the control plane's floors (core … cli, the order tests/test_architecture.py enforces);
- a test whose name is a module it imports (test_sync.py importing idmctl.ops.sync) goes beside that
  module's package;
- otherwise each package scores the uses of the names the test imports from it (``cli(...)``, the CLI
  fixture, counts for idmctl/cli); the highest score wins, a tie goes to the higher floor (a test of ops
  imports core and record to set up, rarely the other way round);
- a test that imports no project package (or only reads the repository: the architecture and naming
  rules) stays in ``tests/``.
The support modules (conftest.py, slurm_support.py, net_support.py, pg_support.py, snapshot_support.py,
hidden_quick_spec.py, the job entries ``tests.jobs_entry`` / ``tests.replay_shm_entry``), ``tests/data``
and ``tests/golden`` stay where they are: job scripts import ``tests.jobs_entry`` by that name.

What the move rewrites:
- in a moved test, every ``Path(__file__)[.resolve()].parent…`` so that it names the same folder as before
  (``.parents[N]``): the repository root, ``tests/``, ``tests/data``, ``tests/golden``;
- ``pyproject.toml`` gets ``pythonpath = ["tests"]``, so the support modules import by their plain names
  from any depth (today they import because the tests sit in the folder pytest puts on sys.path);
- every mention of a moved file (``tests/test_x.py``, with or without ``::test``) in the repository's
  tracked text files: code comments, runbook.md, README.md, BENCHMARKS.md, scripts.
No folder gets an ``__init__.py``: with pytest's default import mode a ``tests/idmctl/__init__.py`` would
make the tests' folder an ``idmctl`` package shadowing the real one. Test file names stay unique, which
that import mode needs (checked before anything moves).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"


def _architecture():
    """The floors and packages as tests/test_architecture.py declares them (their one home)."""
    spec = importlib.util.spec_from_file_location("_architecture_rules", TESTS / "test_architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_RULES = _architecture()
FLOORS: tuple[str, ...] = _RULES.FLOORS
# Lowest first: a tie between two packages goes to the later one. bench stands on all of them.
HOMES: tuple[str, ...] = (*(p for p in _RULES.PROJECT_PACKAGES if p != "idmctl"),
                          *(f"idmctl/{floor}" for floor in FLOORS), "bench")
TOP_PACKAGES = {home.split("/")[0] for home in HOMES}
# The CLI fixture of tests/conftest.py: each call drives idmctl/cli.
CLI_FIXTURES = {"cli"}
# The architecture and naming rules read the whole repository: they test no one package.
REPOSITORY_WIDE = {"test_architecture.py", "test_contract_names.py", "test_hint_commands.py"}
# Where what a test imports does not say what it is about (the derivation's answer in the comment).
PLACED = {
    "test_tracking_lock.py": ("ground", "its child process imports ground.tracking (derived: imports nothing)"),
    "test_peak_memory.py": ("trainers", "its child process imports trainers.train (derived: imports nothing)"),
    "test_compare_training.py": ("idmctl/track", "compares real trainings with idmctl.track.compare "
                                                 "(derived: ground, from its contract names)"),
    "test_team_repo_gate.py": ("idmctl/gate", "the gate on the team's repository (derived: ground, one import)"),
    "test_crash_loop.py": ("idmctl/ops", "the crash-loop rule of ops/failures (derived: record, from its store fixtures)"),
    "test_jobs_listing.py": ("idmctl/ops", "ops/listing's job table (derived: record, from its store fixtures)"),
    "test_ledger.py": ("idmctl/ops", "ops/ledger (derived: record, from its store fixtures)"),
    "test_submit_overrides.py": ("idmctl/ops", "submit's flags over the spec (derived: record, from its store reads)"),
    "test_decide.py": ("idmctl/track", "idmctl.track.goal_decisions (derived: cli, the command it drives)"),
    "test_eval_jobs.py": ("idmctl/ops", "ops/eval_jobs (derived: cli, the command it drives)"),
    "test_notify_decide.py": ("idmctl/ops", "ops/notify on decide's verdicts (derived: cli, the command it drives)"),
}
FILE_PATH = re.compile(r"Path\(__file__\)(?P<resolve>\.resolve\(\))?(?P<parents>(?:\.parent\b)+)")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".tmpl", ".cfg", ".ini", ""}


@dataclass
class Move:
    source: Path
    home: str  # "" for tests/ itself
    reason: str
    rewrites: list[str] = field(default_factory=list)

    @property
    def target(self) -> Path:
        return (TESTS / self.home / self.source.name) if self.home else self.source

    @property
    def depth(self) -> int:
        return len(Path(self.home).parts) if self.home else 0


def module_home(module: str) -> str | None:
    """The home (package or idmctl floor) of a dotted module name, or None outside the project."""
    parts = module.split(".")
    if parts[0] not in TOP_PACKAGES:
        return None
    if parts[0] == "idmctl":
        return f"idmctl/{parts[1]}" if len(parts) > 1 and parts[1] in FLOORS else None
    return parts[0]


def is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_names(tree: ast.Module) -> tuple[dict[str, str], list[str]]:
    """(local name → module it came from, every project module imported), from every import in the file."""
    bound: dict[str, str] = {}
    modules: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if module_home(alias.name) is not None:
                    modules.append(alias.name)
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and module_home(node.module):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                source = full if is_module(full) else node.module
                modules.append(source)
                bound[alias.asname or alias.name] = source
    return bound, modules


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def usage_scores(tree: ast.Module, bound: dict[str, str]) -> Counter[str]:
    """Per home, how often the test uses a name imported from it (``pkg.mod.f`` counts for pkg.mod's home)."""
    scores: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            dotted = _dotted(node)
            head = dotted.split(".")[0] if dotted else None
            if head in bound and module_home(bound[head]) and bound[head] == head:
                # `import idmctl.ops.sync` then `idmctl.ops.sync.run(...)`: the longest module prefix
                parts = dotted.split(".")
                for cut in range(len(parts), 0, -1):
                    if is_module(".".join(parts[:cut])):
                        home = module_home(".".join(parts[:cut]))
                        if home:
                            scores[home] += 1
                        break
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in bound and bound[node.id] != node.id:
                scores[module_home(bound[node.id])] += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CLI_FIXTURES \
                and node.func.id not in bound:
            scores["idmctl/cli"] += 1
    return scores


def project_modules() -> dict[str, list[str]]:
    """Module and package name → the dotted modules of the project that carry it."""
    found: dict[str, list[str]] = {}
    for top in sorted(TOP_PACKAGES):
        for path in sorted((REPO / top).rglob("*.py")):
            dotted = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            if module_home(dotted):
                found.setdefault(dotted.split(".")[-1], []).append(dotted)
    return found


PROJECT_MODULES = project_modules()


def stem_names(stem: str) -> list[str]:
    """test_sync_failure_order → sync_failure_order, sync_failure, failure_order, sync, failure, order."""
    words = stem.split("_")
    return ["_".join(words[i:i + n]) for n in range(len(words), 0, -1) for i in range(len(words) - n + 1)]


def named_module(stem: str, modules: list[str], scores: Counter[str]) -> tuple[str, str] | None:
    """The home a test is named after, longest part of its name first: a module it imports whose name is
    that part (two such modules: the home it uses more; a project word for a floor, WORD_HOMES, first), or the
    one project module of that name, which a test may drive through the CLI without importing it (only
    where the test uses that home at least a third as much as its most used one)."""
    imported = sorted(set(modules))
    names = stem_names(stem)
    for length in sorted({len(n.split("_")) for n in names}, reverse=True):
        same_length = [n for n in names if len(n.split("_")) == length]
        words = [n for n in same_length if n in WORD_HOMES]
        if words:
            return WORD_HOMES[words[0]], f"'{words[0]}' in its name: {WORD_HOMES[words[0]]}"
        hits = sorted({m for n in same_length for m in imported if m.split(".")[-1] == n})
        if hits:
            best = max(hits, key=lambda m: scores[module_home(m)])
            return module_home(best), f"named after {best}, which it imports"
    most = max(scores.values(), default=0)
    for name in names:
        candidates = PROJECT_MODULES.get(name, [])
        if len(candidates) == 1 and 3 * scores[module_home(candidates[0])] >= most:
            return module_home(candidates[0]), f"named after {candidates[0]}"
    return None


# Words of the project's vocabulary that name a floor rather than a module.
WORD_HOMES = {"preflight": "idmctl/gate", "slurm": "idmctl/ops", "ui": "idmctl/track", "cli": "idmctl/cli",
              "sweep": "ground", "bench": "bench"}
# Imported everywhere for its names (ENV_*, CAUSE_*): says nothing about what a test is about.
NAMES_ONLY = {"ground.contract"}


def place(path: Path) -> Move:
    if path.name in REPOSITORY_WIDE:
        return Move(path, "", "reads the whole repository")
    if path.name in PLACED:
        return Move(path, *PLACED[path.name])
    tree = ast.parse(path.read_text(), filename=str(path))
    bound, modules = imported_names(tree)
    bound = {name: module for name, module in bound.items() if module not in NAMES_ONLY}
    scores = usage_scores(tree, bound)
    named = named_module(path.stem.removeprefix("test_"), modules, scores)
    if named:
        return Move(path, *named)
    if not scores:
        return Move(path, "", "imports no project package")
    rank = {home: i for i, home in enumerate(HOMES)}
    home = max(scores, key=lambda h: (scores[h], rank[h]))
    shown = ", ".join(f"{h} {n}" for h, n in scores.most_common(3))
    return Move(path, home, f"uses {shown}")


def rewrite_file_paths(text: str, depth: int, notes: list[str]) -> str:
    """``Path(__file__)…parent×k`` names the same folder from ``depth`` folders further down."""
    if depth == 0:
        return text

    def moved(match: re.Match) -> str:
        k = match.group("parents").count(".parent") + depth
        new = f"Path(__file__){match.group('resolve') or ''}.parents[{k - 1}]"
        notes.append(f"{match.group(0)} → {new}")
        return new

    text = FILE_PATH.sub(moved, text)
    for line_no, line in enumerate(text.splitlines(), 1):
        if "__file__" in line and "Path(__file__)" not in line:
            notes.append(f"line {line_no} uses __file__ in a way this script does not rewrite: {line.strip()}")
    return text


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    paths = [REPO / name for name in names.split("\0") if name]
    return [p for p in paths if p.is_file() and not p.is_symlink() and p.suffix in TEXT_SUFFIXES
            and "golden" not in p.relative_to(REPO).parts[:2]]


def mention_pattern(moves: list[Move]) -> re.Pattern:
    names = "|".join(re.escape(m.source.name) for m in moves if m.home)
    return re.compile(rf"(?<![\w/])tests/(?P<name>{names})\b")


def plan(paths: list[Path] | None = None) -> list[Move]:
    paths = paths or sorted(TESTS.glob("test_*.py"))
    moves = [place(p) for p in paths]
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    clashes = [name for name, n in names.items() if n > 1]
    if clashes:
        raise SystemExit(f"mirror_tests: test file names must stay unique, these repeat: {', '.join(clashes)}")
    return moves


def pyproject_with_pythonpath(text: str) -> str:
    if re.search(r"^pythonpath\s*=", text, re.MULTILINE):
        return text
    return re.sub(r'^(testpaths = \["tests"\]\n)', r'\1# the support modules (slurm_support, net_support, …) import by name from tests/<package>/…\n'
                  r'pythonpath = ["tests"]\n', text, count=1, flags=re.MULTILINE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    args = parser.parse_args(argv)
    moves = plan()
    by_name = {m.source.name: m for m in moves if m.home}
    new_texts: dict[Path, str] = {}
    for move in moves:
        text = move.source.read_text()
        rewritten = rewrite_file_paths(text, move.depth, move.rewrites)
        if rewritten != text:
            new_texts[move.target] = rewritten
    mentions = mention_pattern(moves)
    mention_counts: Counter[str] = Counter()
    for path in tracked_text_files():
        if path.suffix == ".py" and path.parent == TESTS and path.name in by_name:
            current_path, text = by_name[path.name].target, new_texts.get(by_name[path.name].target, path.read_text())
        else:
            current_path, text = path, new_texts.get(path, path.read_text(errors="replace"))
        changed = mentions.sub(lambda m: by_name[m.group("name")].target.relative_to(REPO).as_posix(), text)
        if changed != text:
            mention_counts[current_path.relative_to(REPO).as_posix()] += len(mentions.findall(text))
            new_texts[current_path] = changed
    pyproject = REPO / "pyproject.toml"
    new_texts[pyproject] = pyproject_with_pythonpath(new_texts.get(pyproject, pyproject.read_text()))

    homes = Counter(m.home or "(tests/)" for m in moves)
    print(f"mirror_tests: {len(moves)} test files: " + ", ".join(f"{h} {n}" for h, n in sorted(homes.items())))
    for move in moves:
        where = move.target.relative_to(REPO).as_posix()
        print(f"  {move.source.relative_to(REPO).as_posix():42} → {where:52} ({move.reason})")
        for note in move.rewrites:
            print(f"      {note}")
    print(f"mentions of moved files rewritten in {len(mention_counts)} files: "
          + ", ".join(f"{p} ({n})" for p, n in sorted(mention_counts.items())))
    print('pyproject.toml: pythonpath = ["tests"] under [tool.pytest.ini_options]')
    if args.dry_run:
        return 0
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout
    if dirty.strip():
        print("mirror_tests: the work tree has uncommitted changes; commit or stash them first", file=sys.stderr)
        return 2
    for move in moves:
        if move.home:
            move.target.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "mv", str(move.source), str(move.target)], cwd=REPO, check=True)
    for path, text in new_texts.items():
        if path.read_text(errors="replace") != text:
            temp = path.with_name(path.name + ".mirror-tmp")
            temp.write_text(text)
            shutil.copymode(path, temp)  # an executable script stays executable (system_deps.sh, bench/gpu.sh)
            temp.replace(path)
    print("mirror_tests: moved; review `git status`, then run the suite")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The job↔trainer contract and the MLflow keys are named once (ground/contract.py, ground/tracking.py).

Every string and integer constant in the project's code is read (not comments or docstrings): a
literal spelling of a contract value outside the ground is a second definition waiting to drift.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ground import contract, tracking
from ground.spec.loader import load_spec
from idmctl.ops.failures.classify import cause_names

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("idmctl", "cache", "trainers", "bench", "tests")
HOMES = {REPO / "ground" / "contract.py", REPO / "ground" / "tracking.py", Path(__file__).resolve()}
ENV_VALUES = {getattr(contract, name) for name in dir(contract) if name.startswith("ENV_")}
FILE_VALUES = {contract.SPEC_FILE, contract.FAILURE_FILE, contract.STAGE_MARKER, contract.STAGE_PENDING, contract.MLFLOW_RUN_ID_FILE,
               contract.PROGRESS_FILE, contract.EVENTS_FILE}
EXIT_VALUES = {contract.EXIT_NAN, contract.EXIT_REQUEUE} - {0, 1, 2, 3}  # small codes are everywhere (argv, counts)
SHELL_EXPORT = re.compile(r"\bexport (IDMCTL_[A-Z_]+)=")
"""A job script line that sets a contract variable (prose such as "default $IDMCTL_CLUSTER" is fine)."""
TAG_VALUES = {getattr(tracking, name) for name in dir(tracking) if name.startswith("TAG_")}
"""MLflow tags exist only in MLflow; the ``P_`` params are spec field paths, spelled in the spec code too."""


def _literals(path: Path) -> list[tuple[int, object, bool]]:
    """(line, value, names a path) of every constant that is not a docstring; a constant names a path
    when it is joined with ``/`` or passed to ``with_name``/``joinpath`` (a JSON key or a database
    column may share a run-dir file's name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    paths = {id(node.right) for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)}
    paths |= {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("with_name", "joinpath") for arg in node.args}
    return [(node.lineno, node.value, id(node) in paths) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and id(node) not in docstrings and not isinstance(node.value, bool)]


def leftovers(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for line, value, is_path in _literals(path):
        where = f"{path.relative_to(root)}:{line}"
        if isinstance(value, int) and value in EXIT_VALUES:
            found.append(f"{where}: exit status {value}")
        if not isinstance(value, str):
            continue
        if value in ENV_VALUES or value == contract.FAILURE_MARKER:
            found.append(f"{where}: {value!r}")
        elif value in FILE_VALUES and is_path:
            found.append(f"{where}: run-dir file {value!r}")
        elif value in TAG_VALUES:
            found.append(f"{where}: MLflow key {value!r}")
        for match in SHELL_EXPORT.finditer(value):
            if match.group(1) in ENV_VALUES:
                found.append(f"{where}: {match.group(1)} in shell text")
    return found


def test_no_contract_value_is_spelled_outside_the_ground() -> None:
    found = [hit for package in SCANNED for path in sorted((REPO / package).rglob("*.py"))
             if path not in HOMES for hit in leftovers(path)]
    assert not found, "use the names in ground/contract.py / ground/tracking.py:\n" + "\n".join(found)


def test_the_scan_sees_each_kind_of_leftover(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text('"""IDMCTL_HOME in a docstring is prose."""\n'
                      'import os\nos.environ["IDMCTL_HOME"]\nx = 75\ny = {"mlflow_run_id": 1}\n'
                      'z = run_dir / "mlflow_run_id"\nw = \'export IDMCTL_CACHE_ROOT="$D"\'\nhelp = "default $IDMCTL_CLUSTER"\n')
    hits = sorted(hit.split(": ", 1)[1] for hit in leftovers(module, tmp_path))
    assert hits == sorted(["'IDMCTL_HOME'", "exit status 75", "run-dir file 'mlflow_run_id'",
                           "IDMCTL_CACHE_ROOT in shell text"])


def test_the_params_compare_reads_are_keys_the_trainer_logs() -> None:
    """The trainer logs ``flatten(canonical spec)``; a renamed spec field must fail here, not empty a column."""
    logged = tracking.flatten(load_spec("latent_c_n4").canonical)
    assert [key for key in tracking.READ_PARAMS if key not in logged] == []


def test_the_trainer_reports_a_cause_the_taxonomy_knows() -> None:
    assert contract.CAUSE_NAN_LOSS in cause_names()
    for cause in (contract.CAUSE_DISK_FULL, contract.CAUSE_MISSING_WEIGHTS, contract.CAUSE_PT_NORM_MISSING):
        assert cause in cause_names()  # the build job's markers
    assert tracking.EEF_METRIC.match(tracking.eef_metric(24)) and tracking.EEF_METRIC.match(
        tracking.eef_metric(5, simulator=True)).group(1) == "sim_"

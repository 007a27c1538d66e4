"""A property-based fuzzer of the CLI contract (hypothesis): spec documents made from a valid spec and
mutated (wrong types, huge and tiny numbers, NaN/inf, control and look-alike characters, Rich markup,
long strings, deep nesting, unknown and misspelt keys, sweeps), and command lines for the commands and
options that finish in-process without starting servers, jobs or encoders.

The contract checked on every example: exit 0, 1 or 2; on exit 2 exactly one line on stderr that
names the file and field (specs) or the flag (command lines); no traceback; on exit 2 nothing written
to the store or a run directory; no credential from the environment in any output.

Deterministic: a fixed seed and a bounded example count (the whole file runs in well under two minutes
on one core). A failing example is kept in ``.hypothesis/fuzz`` (gitignored) and replayed first on the
next run, before the seeded ones.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from typer.testing import CliRunner

from ground.contract import ENV_HOME

REPO = Path(__file__).resolve().parents[2]
# One worker runs the whole file, so that the closing report sees both fuzzers' counts: spread over two
# workers (as they were once the Slurm tests left their one group), it skipped, and its check that each
# fuzzer reached both exits went unasserted.
pytestmark = pytest.mark.xdist_group("fuzz_contract")
DATABASE = DirectoryBasedExampleDatabase(str(REPO / ".hypothesis" / "fuzz"))
SPEC_EXAMPLES = 300
CLI_EXAMPLES = 400
SECRET = "Fz9SecretWx"
SECRET_URL = f"postgresql://fuzzer:{SECRET}@127.0.0.1:1/team"
"""In the environment (not IDMCTL_DB_URL: the commands would then use that store) during every example."""

COUNTED: dict[str, int] = {"spec": 0, "cli": 0}
"""Examples each fuzzer ran (printed at the end of the module)."""
EXITS: dict[str, dict[int, int]] = {"spec": {}, "cli": {}}
"""Exit codes seen per fuzzer: both must reach commands that succeed or fail a check, not only bad input."""


# --- the hostile values -------------------------------------------------------------------------

LOOKALIKE = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "p": "\u0440", "c": "\u0441", "i": "\u0456"}
INVISIBLE = ["\u200b", "\u202e", "\ufeff", "\x00", "\x1b[31m", "\r", "\t", "\x7f"]
MARKUP = ["[/x]", "[bold]", "[/]", "[link=http://x]y[/link]", "[[/]]"]

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**20, 10**400, -(10**25)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-320, 5e-324, 1e308, -1e308, float("nan"), float("inf"), -float("inf"), 3.0e3]),
)
texts = st.one_of(
    st.text(max_size=20),
    st.sampled_from(MARKUP + INVISIBLE + ["", " ", "~", "$HOME/x", "../../etc", "a" * 5000, "9" * 400, "1e400",
                                          "nan", "UNLIMITED", "0:00", "-5", "1e23d", "1e30GB", "core-own; rm -rf /"]),
    st.builds(lambda a, b: a + b, st.sampled_from(MARKUP + INVISIBLE), st.text(max_size=8)),
)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


hostile = st.one_of(
    numbers, texts, st.booleans(), st.none(),
    st.lists(st.one_of(numbers, texts), max_size=4),
    st.dictionaries(texts, numbers, max_size=3),
    st.sampled_from([nested(70), nested(200), list(range(200)), {"a": {"b": {"c": {"d": 1}}}}]),
)


# --- spec documents -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_documents() -> list[dict[str, Any]]:
    """Valid specs, resolved and written out whole (no extends), between them every section of the
    schema: latent_c_n4 (the hidden cache) and latent_rgbpt_smoke (the latent cache)."""
    from ground.spec import load_spec

    return [load_spec(name).spec.model_dump(mode="json") for name in ("latent_c_n4", "latent_rgbpt_smoke")]


def _leaves(document: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(document, dict):
        for key, value in document.items():
            yield (*prefix, key)
            yield from _leaves(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document[:3]):
            yield (*prefix, index)
            yield from _leaves(value, (*prefix, index))


def _set(document: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        document = document[part]
    document[path[-1]] = value


def _rename(document: Any, path: tuple[Any, ...], how: int) -> None:
    """The key at ``path`` spelt with a look-alike letter, an invisible character, a typo, or markup."""
    for part in path[:-1]:
        document = document[part]
    key = path[-1]
    if not isinstance(document, dict) or not isinstance(key, str):
        return
    if how == 0:
        new = "".join(LOOKALIKE.get(c, c) for c in key[:2]) + key[2:]
    elif how == 1:
        new = key[:1] + INVISIBLE[len(key) % len(INVISIBLE)] + key[1:]
    elif how == 2:
        new = key[:-1] if len(key) > 1 else key + "x"
    else:
        new = f"{key}[/x]"
    if new != key:
        document[new] = document.pop(key)


@st.composite
def spec_documents(draw: st.DrawFn, base: dict[str, Any]) -> tuple[Any, str]:
    """(document, what was done to it)."""
    import copy

    document = copy.deepcopy(base)
    paths = list(_leaves(document))
    done = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        kind = draw(st.sampled_from(["value", "value", "value", "rename", "drop", "extra", "sweep", "top"]))
        path = draw(st.sampled_from(paths))
        try:
            if kind == "value":
                _set(document, path, draw(hostile))
            elif kind == "rename":
                _rename(document, path, draw(st.integers(min_value=0, max_value=3)))
            elif kind == "drop" and len(path) > 0:
                parent = document
                for part in path[:-1]:
                    parent = parent[part]
                if isinstance(parent, dict):
                    parent.pop(path[-1], None)
            elif kind == "extra":
                document[draw(st.sampled_from(["extends", "sweep", "data", "zz", "description"]))] = draw(hostile)
            elif kind == "sweep":
                axes = {".".join(map(str, draw(st.sampled_from(paths)))): draw(st.lists(hostile, max_size=30))
                        for _ in range(draw(st.integers(min_value=0, max_value=3)))}
                document["sweep"] = {draw(st.sampled_from(["grid", "zip", "names", "grid"])): axes}
            elif kind == "top":
                document = draw(hostile)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation changed the shape under this path: nothing to do
        done.append(f"{kind} {'.'.join(map(str, path))}")
        if kind == "top":
            break
    return document, "; ".join(done)


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzzed_specs")


# --- the contract -------------------------------------------------------------------------------

def _store_state(home: Path) -> Any:
    store = home / "idmctl.sqlite"
    if not store.exists():
        return None
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            return list(db.iterdump())
    except sqlite3.DatabaseError:
        return hashlib.sha256(store.read_bytes()).hexdigest()


def _run_dirs(home: Path) -> list[str]:
    runs = home / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


@contextmanager
def _secret_in_environment() -> Iterator[None]:
    os.environ["IDMCTL_FUZZ_TEAM_URL"] = SECRET_URL
    try:
        yield
    finally:
        os.environ.pop("IDMCTL_FUZZ_TEAM_URL", None)


WHERE = re.compile(r"^error: (?P<where>.+?): ")
"""A bad-input line starts with where the problem is: the file and field, the flag, or ``command line``."""


def check_contract(args: list[str], names: str | None = None) -> int:
    """Run ``idmctl ARGS`` in-process and assert the contract; ``names``: what a bad-input line must name
    (by default any file, field or flag before the first colon)."""
    from idmctl.cli.app import app

    home = Path(os.environ[ENV_HOME])
    if not (home / "idmctl.sqlite").exists():  # made (and migrated) here: a read that creates it writes no rows
        from idmctl.record.db import open_store

        open_store()
    before, runs_before = _store_state(home), _run_dirs(home)
    with _secret_in_environment():
        result = CliRunner().invoke(app, args)
    shown = f"idmctl {' '.join(a[:80] for a in args)}\n--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-2000:]}"
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, f"{shown}\n--- raised {result.exception!r}"
    assert result.exit_code in (0, 1, 2), f"exit {result.exit_code}: {shown}"
    assert "Traceback" not in result.output, shown
    assert SECRET not in result.output, shown
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), shown
        where = WHERE.match(lines[0])
        assert where and where.group("where").strip(), f"the line names no file, field or flag: {shown}"
        if names is not None:
            assert names in lines[0], f"the line does not name {names!r}: {shown}"
        assert _store_state(home) == before, f"the store changed on exit 2: {shown}"
        assert _run_dirs(home) == runs_before, f"a run directory was made on exit 2: {shown}"
    return result.exit_code


SPEC_COMMANDS = (["exp", "validate"], ["exp", "show"], ["preflight", "--no-smoke", "--cluster", "card"],
                 ["submit", "--dry-run", "--cluster", "card"])


@settings(database=DATABASE, max_examples=SPEC_EXAMPLES, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@seed(20261201)
@given(data=st.data())
def test_spec_documents_keep_the_contract(data: st.DataObject, base_documents: list[dict[str, Any]],
                                         spec_dir: Path) -> None:
    document, done = data.draw(spec_documents(data.draw(st.sampled_from(base_documents), label="base")),
                               label="document")
    path = spec_dir / "fuzzed.yaml"
    try:
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, RecursionError):
        return  # not a document YAML can write; the corpus has the unwritable kinds as bytes
    path.write_text(text, encoding="utf-8")
    COUNTED["spec"] += 1
    command = data.draw(st.sampled_from(SPEC_COMMANDS), label="command")
    code = check_contract(_spec_args(command, path), names=str(path))
    EXITS["spec"][code] = EXITS["spec"].get(code, 0) + 1


def _spec_args(command: list[str], path: Path) -> list[str]:
    if command[0] == "exp":
        return [*command, str(path)]
    return [command[0], str(path), *command[1:]]


# --- command lines ------------------------------------------------------------------------------

SAFE_COMMANDS = {
    # command path: arguments it needs first (EXP stands for an experiment, JOB for a job id)
    ("exp", "list"): [], ("exp", "show"): ["EXP"], ("exp", "validate"): ["EXP"], ("exp", "diff"): ["EXP", "EXP"],
    ("exp", "register"): ["EXP"], ("preflight",): ["EXP", "--no-smoke"], ("submit",): ["EXP", "--dry-run"],
    ("jobs",): [], ("jobs", "show"): ["JOB"], ("failures",): [], ("failures", "fix"): ["JOB"], ("ledger",): [],
    ("cache", "inspect"): ["EXP"], ("cache", "status"): ["EXP"], ("cancel",): ["JOB"], ("sync",): [],
}
"""Commands that end in-process in well under a second. Left out: those that start servers (ui), jobs
(submit without --dry-run, train, quickstart), encoders or simulators (cache build*, convert, data),
or wait (watch), and doctor (its own tests; it runs a renderer child); each has its own bad-input
tests."""
NEVER = {"--force", "--debug"}
"""--force submits without a preflight even beside --dry-run's plan; --debug lets tracebacks through."""


def _options(path: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(flag, takes a value) for every option of a command, read from the command tree itself."""
    import typer

    from idmctl.cli.app import app

    command: Any = typer.main.get_command(app)
    for part in path:
        command = command.commands[part]
    found = []
    for param in command.params:
        if param.param_type_name == "option" and param.opts[0] not in NEVER:
            found.append((param.opts[0], not param.is_flag))
    return found


experiments = st.one_of(st.sampled_from(["quickstart", "latent_c_n4", "latent_c_phase2", "latent_rgbpt_smoke",
                                         "latent_c_phase2.n4_d4", "base_latent_c"]), texts)
job_ids = st.one_of(st.sampled_from(["1", "0", "-1", "99999999999999999999999", "6054", "x"]), texts)
what_ifs = st.builds(lambda field, value: f"{field}={value}",
                     st.sampled_from(["loader.repeats", "train.lr", "model.depth", "data.cache_files",
                                      "resources.signal_lead", "resources.mem", "zz.top", "train"]),
                     st.one_of(texts, numbers.map(str)))
option_values = st.one_of(texts, numbers.map(str), st.sampled_from(["4", "1GB", "1:00:00", "core-own", "gpu:2",
                                                                   "n1,n2", "7d", "2026-11-01", "cause", "card"]))


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    path = draw(st.sampled_from(sorted(SAFE_COMMANDS)))
    args = list(path)
    for need in SAFE_COMMANDS[path]:
        args.append(draw(experiments) if need == "EXP" else draw(job_ids) if need == "JOB" else need)
    options = _options(path)
    for flag, takes_value in draw(st.lists(st.sampled_from(options), max_size=4)) if options else []:
        args.append(flag)
        if takes_value:
            args.append(draw(what_ifs if flag == "--what-if" else option_values))
    if path == ("preflight",) and "--cluster" not in args:
        args += ["--cluster", "card"]
    return args


@settings(database=DATABASE, max_examples=CLI_EXAMPLES, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@seed(20261202)
@given(args=command_lines())
def test_command_lines_keep_the_contract(args: list[str]) -> None:
    COUNTED["cli"] += 1
    code = check_contract(args)
    EXITS["cli"][code] = EXITS["cli"].get(code, 0) + 1


def test_zz_report_how_many_examples_ran(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs last in this module: both fuzzers ran, and how many examples each tried."""
    if not all(COUNTED.values()):
        pytest.skip("run with the fuzzers (this file whole)")
    with capsys.disabled():
        print(f"\nfuzzer: {COUNTED['spec']} spec documents (exits {dict(sorted(EXITS['spec'].items()))}), "
              f"{COUNTED['cli']} command lines (exits {dict(sorted(EXITS['cli'].items()))})")
    assert COUNTED["spec"] >= SPEC_EXAMPLES // 2 and COUNTED["cli"] >= CLI_EXAMPLES // 2
    for fuzzer, exits in EXITS.items():
        assert exits.get(2) and exits.get(0, 0) + exits.get(1, 0), f"{fuzzer} reached only one side: {exits}"

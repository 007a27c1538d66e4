"""The bad-input corpus: every spec file in tests/data/bad_specs and every case in
tests/data/bad_inputs/cases.yaml (flags, cluster files, stores, caches, Click usage) must give one
line on stderr, exit 2, no traceback, and leave the store exactly as it was.

In-process (the `cli` fixture's CliRunner) so the ~140 cases run in seconds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from ground.contract import ENV_HOME

import pytest
import yaml

DATA = Path(__file__).parents[2] / "data"
SPEC_FILES = sorted((DATA / "bad_specs").glob("*.yaml"))
CASES = yaml.safe_load((DATA / "bad_inputs" / "cases.yaml").read_text())
MIN_CASES = 100


def test_the_corpus_has_at_least_100_cases() -> None:
    assert len(SPEC_FILES) + len(CASES) >= MIN_CASES, (len(SPEC_FILES), len(CASES))
    assert len({case["id"] for case in CASES}) == len(CASES), "case ids are unique"


@pytest.fixture(scope="module")
def populated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a registered spec, made once and copied into each case's IDMCTL_HOME."""
    import os

    from typer.testing import CliRunner

    from idmctl.cli.app import app
    from idmctl.record.db import _engine_for

    home = tmp_path_factory.mktemp("template_home")
    old = os.environ.get(ENV_HOME)
    os.environ[ENV_HOME] = str(home)
    try:
        result = CliRunner().invoke(app, ["exp", "register", "quickstart"])
        assert result.exit_code == 0, result.output
        _engine_for(str(home / "idmctl.sqlite")).dispose()
        with sqlite3.connect(home / "idmctl.sqlite") as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        os.environ[ENV_HOME] = old or ""
    return home / "idmctl.sqlite"


def _store_state(home: Path) -> object:
    """What "unchanged" compares: the logical content of a readable store, else the bytes of what is there."""
    store = home / "idmctl.sqlite"
    if home.is_file():
        return ("home is a file", hashlib.sha256(home.read_bytes()).hexdigest())
    if store.is_dir():
        return ("store is a directory", sorted(p.name for p in store.iterdir()))
    if not store.exists():
        return None
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            return ("rows", list(db.iterdump()))
    except sqlite3.DatabaseError:
        return ("bytes", hashlib.sha256(store.read_bytes()).hexdigest())


def _assert_contract(result, expect: str, where: str) -> None:  # type: ignore[no-untyped-def]
    assert "Traceback" not in result.output, f"{where}: {result.output[-1500:]}"
    assert result.exception is None or isinstance(result.exception, SystemExit), f"{where}: {result.exception!r}"
    assert result.exit_code == 2, f"{where}: exit {result.exit_code}: {result.output[-800:]}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"{where}: {len(lines)} lines: {result.stderr[-800:]}"
    assert lines[0].startswith("error: ") and lines[0].endswith(")"), f"{where}: {lines[0]}"
    assert expect in lines[0], f"{where}: {expect!r} not in {lines[0]!r}"


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_bad_spec_file(path: Path, cli, idmctl_home: Path, populated_store: Path) -> None:
    idmctl_home.mkdir(parents=True, exist_ok=True)
    shutil.copy(populated_store, idmctl_home / "idmctl.sqlite")
    before = _store_state(idmctl_home)
    expect = path.read_bytes().splitlines()[0].decode().removeprefix("# expect: ")
    for command in (["exp", "validate"], ["exp", "register"], ["submit", "--dry-run"]):
        result = cli(*command[:1 + (command[0] == "exp")], str(path), *command[1 + (command[0] == "exp"):])
        _assert_contract(result, expect, f"{' '.join(command)} {path.name}")
    assert _store_state(idmctl_home) == before


# --- state the cases need -------------------------------------------------------------------------

def _write_cluster_files(tmp: Path, home: Path) -> None:
    shipped = (Path(__file__).parents[3] / "clusters" / "local.yaml").read_text()
    (tmp / "latin1.yaml").write_bytes(shipped.encode() + b"\n# caf\xe9\n")
    (tmp / "dup.yaml").write_text(shipped + "\nscheduler: slurm\n")
    bomb = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]'] + [
        f"{n}: &{n} [" + ",".join([f"*{p}"] * 10) + "]" for p, n in zip("abcde", "bcdef")]
    (tmp / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    (tmp / "broken.yaml").write_text("scheduler: [local\n")
    (tmp / "badfield.yaml").write_text(shipped.replace("scheduler: local", "scheduler: pbs"))


def _store_random_bytes(tmp: Path, home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "idmctl.sqlite").write_bytes(hashlib.sha512(b"noise").digest() * 64)


def _store_truncated(tmp: Path, home: Path) -> None:
    data = (home / "idmctl.sqlite").read_bytes()
    (home / "idmctl.sqlite").write_bytes(data[: len(data) // 3])


def _store_newer(tmp: Path, home: Path) -> None:
    with sqlite3.connect(home / "idmctl.sqlite") as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")


def _store_directory(tmp: Path, home: Path) -> None:
    (home / "idmctl.sqlite").unlink()
    (home / "idmctl.sqlite").mkdir()


def _home_regular_file(tmp: Path, home: Path) -> None:
    shutil.rmtree(home)
    home.write_text("not a directory\n")


def _cluster_dir_yaml(tmp: Path, home: Path) -> None:
    (tmp / "dir.yaml").mkdir()


def _cache_file(home: Path, header: object) -> None:
    """A safetensors file for demo_0 of the quickstart cache whose JSON header is ``header``."""
    root = home / "quickstart" / "hidden_cache"
    root.mkdir(parents=True, exist_ok=True)
    text = json.dumps(header).encode()
    (root / "demo_0.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 64)


def _cache_no_layers(tmp: Path, home: Path) -> None:
    from cache.hidden import FORMAT_TAG

    _cache_file(home, {"__metadata__": {"format": json.dumps(FORMAT_TAG), "frames": "8"}})


def _cache_list_header(tmp: Path, home: Path) -> None:
    _cache_file(home, [1, 2, 3])


def _big_spec(tmp: Path, home: Path) -> None:
    """A 1 MB spec with one unknown key took 15.8 s to reject; the size cap answers before parsing."""
    (tmp / "big.yaml").write_text("extends: base_latent_c\ndescription: '" + "x" * 1_000_000 + "'\nbogus: 1\n")


def _deep_spec(tmp: Path, home: Path) -> None:
    (tmp / "deep.yaml").write_text("extends: base_latent_c\ndescription: " + "[" * 100_000 + "]" * 100_000 + "\n")


def _home_read_only(tmp: Path, home: Path) -> None:
    """Read-only for root too: the immutable attribute (chmod does not stop root). Undone after the case."""
    subprocess.run(["chattr", "+i", str(home)], check=True)


def _home_read_only_empty(tmp: Path, home: Path) -> None:
    (home / "idmctl.sqlite").unlink()
    _home_read_only(tmp, home)


SETUPS: dict[str, Callable[[Path, Path], None]] = {
    "big_spec": _big_spec, "deep_spec": _deep_spec, "home_read_only": _home_read_only,
    "home_read_only_empty": _home_read_only_empty,
    "cluster_files": _write_cluster_files, "store_random_bytes": _store_random_bytes,
    "store_truncated": _store_truncated, "store_newer": _store_newer, "store_directory": _store_directory,
    "home_regular_file": _home_regular_file, "cluster_dir_yaml": _cluster_dir_yaml,
    "cache_no_layers": _cache_no_layers, "cache_list_header": _cache_list_header,
}


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_bad_command_line_or_state(case: dict, cli, idmctl_home: Path, tmp_path: Path, populated_store: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    idmctl_home.mkdir(parents=True, exist_ok=True)
    shutil.copy(populated_store, idmctl_home / "idmctl.sqlite")
    try:
        if "setup" in case:
            SETUPS[case["setup"]](tmp_path, idmctl_home)
        for key, value in case.get("env", {}).items():
            monkeypatch.setenv(key, value.format(tmp=tmp_path))
        before = _store_state(idmctl_home)
        result = cli(*(arg.format(tmp=tmp_path) for arg in case["args"]))
        _assert_contract(result, case["expect"], case["id"])
        assert _store_state(idmctl_home) == before, f"{case['id']}: the store changed"
    finally:
        if case.get("setup", "").startswith("home_read_only"):
            subprocess.run(["chattr", "-i", str(idmctl_home)], check=True)


def test_hdf5_demo_without_num_samples_is_a_user_error(tmp_path: Path) -> None:
    """`cache build-hidden` and the dataset read num_samples per demo: a KeyError traceback before."""
    import h5py
    import numpy as np

    from cache.episodes import EpisodeFile
    from ground.errors import UserError

    path = tmp_path / "demos.hdf5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("data/demo_0/actions", data=np.zeros((5, 7), np.float32))
    with pytest.raises(UserError) as caught:
        EpisodeFile(path).num_samples("demo_0")
    assert caught.value.line() == (f"error: {path}:data/demo_0: demo has no num_samples attribute "
                                   "(robomimic files set data/<demo>.attrs['num_samples'] = len(actions))")

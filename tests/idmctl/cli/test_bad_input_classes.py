"""Inputs that are not what they claim, and messages that must help: one real input of each kind.

(The numeric domains, sweeps and key spellings are cases of tests/idmctl/cli/test_bad_input_corpus.py.)"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from ground.contract import ENV_DB_URL
from ground.errors import MAX_LINE, UserError
from ground.spec.loader import MAX_EXTENDS


def _one_line(result, *needles: str) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("kind", ["file", "loop"])
def test_a_cache_root_that_is_a_file_or_a_symlink_loop_is_named_as_such(cli, tmp_path: Path, kind: str) -> None:
    root = tmp_path / "cache_root"
    if kind == "file":
        root.write_text("not a directory\n")
    else:
        root.symlink_to(root)
    spec = tmp_path / "s.yaml"
    spec.write_text(f"extends: latent_c_n4\ndata: {{cache_root: '{root}'}}\n")
    result = cli("preflight", str(spec), "--cluster", "card", "--no-smoke", "--json")
    assert result.exit_code == 1, result.output
    import json

    cache = next(r for r in json.loads(result.stdout)["checks"] if r["name"] == "cache")
    expected = "is a regular file, not a directory" if kind == "file" else "is a symlink loop"
    assert cache["status"] == "FAIL" and expected in cache["summary"] and "does not exist" not in cache["summary"]
    inspect = cli("cache", "inspect", str(spec))
    assert inspect.exit_code == 0 and expected in inspect.output


def test_convert_out_that_is_a_file_is_one_line(cli, tiny_cache, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("a file\n")
    spec = tiny_cache.spec_file(tmp_path)
    _one_line(cli("cache", "convert", str(spec), "--out", str(out)), "--out", "is a regular file, not a directory")
    assert out.read_text() == "a file\n"


def test_a_damaged_job_record_is_one_line(cli) -> None:
    from ground.paths import db_path
    from idmctl.record import session
    from idmctl.record.fast import close_all
    from idmctl.record.models import Job

    with session() as db:
        damaged_options = Job(scheduler_id="1", experiment="quickstart", state="COMPLETED", options_json='{"mem": "1')
        damaged_column = Job(scheduler_id="2", experiment="quickstart", state="COMPLETED")
        db.add_all([damaged_options, damaged_column])
        db.commit()
        options_id, column_id = damaged_options.id, damaged_column.id
    close_all()
    with sqlite3.connect(db_path()) as raw:  # a hand edit: the ORM writes only valid JSON into a JSON column
        raw.execute("UPDATE job SET efficiency = ? WHERE id = ?", ('{"cpu', column_id))
    line = _one_line(cli("jobs", "show", str(options_id)), f"job {options_id}: its stored record is damaged")
    assert "options_json is not JSON" in line and "restore the store" in line
    line = _one_line(cli("jobs", "show", str(column_id)), f"job {column_id}: its stored record is damaged")
    assert "efficiency is not JSON" in line and "restore the store" in line
    # The commands that classify before they read (through the store's face: a JSONDecodeError traceback
    # before) say the same in one line, naming the job and a damaged column.
    with sqlite3.connect(db_path()) as raw:
        raw.execute("UPDATE job SET state = 'FAILED', started_at = '2026-12-01 00:00:00', ended_at = "
                    "'2026-12-01 01:00:00', runs = ? WHERE id = ?", ('[{"state', column_id))
    for command in (("failures",), ("ledger",)):
        line = _one_line(cli(*command), f"job {column_id}: its stored record is damaged (efficiency is not JSON")
        assert "restore the store" in line, (command, line)


def test_an_extends_chain_too_long_is_reported_as_such(cli, tmp_path: Path) -> None:
    (tmp_path / "s0.yaml").write_text("extends: latent_c_n4\n")
    for i in range(1, MAX_EXTENDS + 8):
        (tmp_path / f"s{i}.yaml").write_text(f"extends: s{i - 1}\n")
    top = tmp_path / f"s{MAX_EXTENDS + 7}.yaml"
    _one_line(cli("exp", "validate", str(top)), f"extends chain longer than {MAX_EXTENDS} files", "extends")


def test_an_extends_cycle_is_named(cli, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b\n")
    (tmp_path / "b.yaml").write_text("extends: a\n")
    _one_line(cli("exp", "validate", str(tmp_path / "a.yaml")), "extends cycle: a -> b -> a")


def test_an_error_line_is_capped_and_keeps_its_ends() -> None:
    line = UserError("x" * 90_000, file="spec.yaml", field="a.b", hint="the fix").line()
    assert len(line) <= MAX_LINE and line.startswith("error: spec.yaml:a.b: ") and line.endswith("(the fix)")
    assert " cut]…" in line


def test_an_enormous_value_gives_a_short_line(cli, tmp_path: Path) -> None:
    spec = tmp_path / "long.yaml"
    spec.write_text("extends: latent_c_n4\nresources: {qos: '" + "q;" * 40_000 + "'}\n")
    line = _one_line(cli("exp", "validate", str(spec)), "resources.qos")
    assert len(line) <= MAX_LINE


def test_invisible_characters_in_a_message_are_escaped(cli, tmp_path: Path) -> None:
    spec = tmp_path / "bidi.yaml"
    spec.write_text("extends: latent_c_n4\nloader:\n  \"num_\u202eworkers\": 2\n", encoding="utf-8")
    line = _one_line(cli("exp", "validate", str(spec)), "loader.num_\\u202eworkers", "did you mean 'num_workers'?")
    assert "\u202e" not in line


def test_doctor_checks_the_sqlite_store_it_is_told_to_use(cli, idmctl_home: Path) -> None:
    """Without IDMCTL_DB_URL the row is the SQLite file in IDMCTL_HOME (damaged: FAIL naming it)."""
    idmctl_home.mkdir(parents=True, exist_ok=True)
    (idmctl_home / "idmctl.sqlite").write_bytes(b"not sqlite" * 100)
    from idmctl.ops.doctor import check_store

    row = check_store()
    assert row.status == "FAIL" and str(idmctl_home / "idmctl.sqlite") in row.detail
    assert os.environ.get(ENV_DB_URL) is None


@pytest.fixture
def read_only_store(idmctl_home: Path, cli):  # type: ignore[no-untyped-def]
    """A store at head, then made read-only with its -wal/-shm files beside it: ``chattr +i`` (which binds
    root too) where the capability is there, else file modes (which bind every other user)."""
    import subprocess

    assert cli("exp", "register", "quickstart").exit_code == 0
    from idmctl.record.db import dispose_engines
    from idmctl.record.fast import close_all

    dispose_engines()
    close_all()
    store = idmctl_home / "idmctl.sqlite"
    for suffix in ("-wal", "-shm"):
        Path(f"{store}{suffix}").touch()
    files = [store, Path(f"{store}-wal"), Path(f"{store}-shm")]
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", *map(str, files)], capture_output=True)
        if made.returncode != 0:
            pytest.skip("root without CAP_LINUX_IMMUTABLE: nothing here can make a file read-only for root")
        try:
            yield store
        finally:
            subprocess.run(["chattr", "-i", *map(str, files)], check=True)
    else:
        for path in files:
            path.chmod(0o444)
        try:
            yield store
        finally:
            for path in files:
                path.chmod(0o644)


@pytest.mark.parametrize("command", [("preflight", "quickstart", "--no-smoke"), ("exp", "register", "quickstart")])
def test_a_read_only_store_is_one_line(cli, read_only_store: Path, command: tuple[str, ...]) -> None:
    before = read_only_store.read_bytes()
    _one_line(cli(*command), str(read_only_store), "the store cannot be used", "readonly")
    assert read_only_store.read_bytes() == before


def test_demos_without_actions_fail_preflight_naming_the_demo(cli, tiny_cache, tmp_path: Path) -> None:
    import json
    import shutil

    import h5py

    episodes = tmp_path / "no_actions.hdf5"
    shutil.copy(tiny_cache.data["episodes"], episodes)
    with h5py.File(episodes, "r+") as handle:
        for name in handle["data"]:
            del handle["data"][name]["actions"]
    spec = tiny_cache.spec_file(tmp_path, data={"episodes": str(episodes)})
    result = cli("preflight", str(spec), "--no-smoke", "--json")
    assert result.exit_code == 1, result.output
    cache = next(r for r in json.loads(result.stdout)["checks"] if r["name"] == "cache")
    assert cache["status"] == "FAIL" and "has no actions dataset" in cache["summary"], cache
    assert "data/demo_" in cache["summary"]


@pytest.mark.parametrize(("field", "value"), [("lr", 2.0), ("weight_decay", 1.5)])
def test_a_plausible_but_odd_optimiser_value_is_a_warn_with_the_value(cli, tmp_path: Path, field: str,
                                                                     value: float) -> None:
    import json

    spec = tmp_path / "odd.yaml"
    spec.write_text(f"extends: latent_c_n4\ntrain: {{{field}: {value}}}\n")
    result = cli("preflight", str(spec), "--cluster", "card", "--no-smoke", "--json")
    assert result.exit_code == 0, result.output
    check = next(r for r in json.loads(result.stdout)["checks"] if r["name"] == "spec")
    assert check["status"] == "WARN" and f"train.{field} {value:g} is above 1" in check["summary"], check
    plain = cli("preflight", "latent_c_n4", "--cluster", "card", "--no-smoke", "--json")
    assert next(r for r in json.loads(plain.stdout)["checks"] if r["name"] == "spec")["status"] == "PASS"


def test_doctor_fails_on_a_cluster_profile_every_command_would_refuse(tmp_path: Path, monkeypatch) -> None:
    from ground.contract import ENV_CLUSTER
    from idmctl.ops.doctor import check_slurm

    profile = tmp_path / "bad.yaml"
    profile.write_text((Path(__file__).parents[3] / "clusters" / "local.yaml").read_text()
                       .replace("scheduler: local", "scheduler: pbs"))
    monkeypatch.setenv(ENV_CLUSTER, str(profile))
    row = check_slurm()
    assert row.status == "FAIL" and f"{profile}:scheduler:" in row.detail, row

"""The property-based fuzzer (``test_fuzz_contract``'s values and contract) on the surfaces added since it
was written: class paths, entries and their step lines, code roots, the code store ``gc`` walks, the
user's scrontab table around idmctl's block, and the cluster profile's newer fields.

Each property: the input is refused in one line (a UserError, exit 2 on the command line) or gives a
clean result that keeps the surface's own invariant; never another exception, never a traceback. Fixed
seeds and small example counts: the whole file runs in a few seconds.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from ground import code_snapshot as snap
from ground import contract
from ground.errors import UserError
from ground.paths import clusters_dir
from test_fuzz_contract import DATABASE, INVISIBLE, MARKUP, check_contract, hostile, numbers, texts

FAST = settings(database=DATABASE, max_examples=40, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])

# --- class paths and entries, through the spec and the command line ------------------------------

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
class_paths = st.one_of(
    texts,
    st.lists(identifiers, min_size=1, max_size=4).map(".".join),
    st.sampled_from(["trainers.no_such.Model", "ground.units.parse_bytes", "ground.units", "os.path.join",
                     "json.JSONDecoder", "trainers..x", ".x.Y", "x.", "a" * 600 + ".B", "ground.errors.UserError",
                     "ground.spec.schema.ClassRef", "ground.__class__", "ground.contract.STEP_MARKER"]),
).filter(lambda path: not isinstance(path, str) or path.split(".", 1)[0] not in sys.stdlib_module_names
         or path.split(".", 1)[0] in ("os", "json"))
"""Dotted names from nothing, look-alikes, markup and project names that are no class; never a stdlib
module that acts on import (``antigravity`` opens a browser)."""
entries = st.one_of(texts, st.sampled_from(["trainers.train", "bash run.sh", "torchrun --nproc_per_node=2 x.py",
                                            "python -m x", "./x.sh;id", "x\ny", "\x00", "a" * 5000, "  ", "-m",
                                            "accelerate launch x.py", "deepspeed x.py"]))
roots = st.one_of(texts, st.sampled_from(["/", "~", "$HOME", "..", ".", "/nonexistent", "/proc/self/root", "/dev/null",
                                          "trainers", "/etc/passwd", "$IDMCTL_HOME", "a" * 300, "/" * 50]))


@pytest.fixture(scope="module")
def base_document() -> dict[str, Any]:
    from ground.spec import load_spec

    return load_spec("latent_c_n4").spec.model_dump(mode="json")


@FAST
@seed(20261207)
@given(data=st.data())
def test_class_paths_entries_and_roots_keep_the_contract(data: st.DataObject, base_document: dict[str, Any],
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    from ground.class_path import code_roots, resolve_class
    from ground.class_path import spec_roots
    from ground.spec import load_spec
    from ground.spec.schema import ClassRef

    document = copy.deepcopy(base_document)
    where = data.draw(st.sampled_from(["dataset", "model", "entry", "roots", "roots"]), label="where")
    if where == "dataset":
        document["data"]["dataset"] = {"class_path": data.draw(class_paths, label="class_path"),
                                       "init_args": data.draw(st.one_of(st.just({}), hostile), label="init_args")}
    elif where == "model":
        document["model"]["name"] = {"class_path": data.draw(class_paths, label="class_path")}
    elif where == "entry":
        document.setdefault("code", {})["entry"] = data.draw(st.one_of(entries, hostile), label="entry")
    else:
        document.setdefault("code", {})["roots"] = data.draw(st.lists(roots, min_size=1, max_size=3), label="roots")
    path = tmp_path_factory.mktemp("fuzzed_surfaces") / "spec.yaml"
    try:
        path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), encoding="utf-8")
    except (yaml.YAMLError, RecursionError):
        return
    check_contract(["exp", "validate", str(path)], names=str(path))
    try:
        spec = load_spec(str(path)).spec
    except UserError:
        return
    # Past the schema: the class path resolves to a class or is one line naming its field; the roots
    # resolve to folders or are one line naming code.roots (fast: nothing is walked or hashed here).
    try:
        spec_roots(spec)
        code_roots(spec)
    except UserError as exc:
        assert "code.roots" in exc.line() and "\n" not in exc.line()
        return
    for field, value in (("data.dataset", spec.data.dataset), ("model.name", spec.model.name)):
        if isinstance(value, ClassRef):
            try:
                assert isinstance(resolve_class(value, spec, field), type)
            except UserError as exc:
                assert field in exc.line()


# --- step lines -----------------------------------------------------------------------------------

figure_values = st.one_of(numbers.map(str), st.sampled_from(["nan", "-nan", "inf", "-inf", "1e400", "-0", "0x10",
                                                             "1_000", "1e-400", "", "NaN", "١٢", "+5", "5."]), texts)
step_lines = st.builds(
    lambda marker, fields, tail: f"{marker} " + " ".join(f"{k}={v}" for k, v in fields) + tail,
    st.sampled_from([contract.STEP_MARKER, contract.PHASE_MARKER, contract.CHECKPOINT_MARKER, contract.STEP_MARKER + "X", ""]),
    st.lists(st.tuples(st.sampled_from(["step", "loss", "seconds", "peak_mem_bytes", "bytes", "dataset_s", "model_s",
                                        "checkpoint_s", "checkpoint_bytes", "zz"]), figure_values), max_size=5),
    st.sampled_from(["", " ", "\r", " extra words", " step=1", "\x00"]),
)


@settings(database=DATABASE, max_examples=300, deadline=None, print_blob=True)
@seed(20261208)
@given(lines=st.lists(st.one_of(step_lines, texts), max_size=8))
def test_step_lines_are_judged_or_refused_quoting_the_line(lines: list[str]) -> None:
    from idmctl.gate.entry_smoke import DOMAINS, OutOfDomain, parse_reports

    try:
        steps, phase, checkpoint = parse_reports("\n".join(lines))
    except OutOfDomain as exc:
        assert "in the line" in str(exc)
        return
    for figures in (*steps, phase, checkpoint):
        for key, value in figures.items():
            if key in DOMAINS:
                assert math.isfinite(value) and 0 <= value <= DOMAINS[key][1], (key, value)


# --- the code store gc walks ----------------------------------------------------------------------

names = st.one_of(st.sampled_from(["0123456789abcdef", "ab", "fedcba9876543210", ".x.tmp", "notes", "a" * 62 + ".f",
                                   "0" * 62 + ".x", "0" * 62 + ".txt", "..", "ZZ"]), identifiers)
kinds = st.sampled_from(["file", "folder", "symlink", "manifest", "bad-manifest"])


@FAST
@seed(20261209)
@given(layout=st.lists(st.tuples(st.sampled_from(["", snap.SNAPSHOTS_DIR, snap.OBJECTS_DIR,
                                                  f"{snap.OBJECTS_DIR}/ab", f"{snap.SNAPSHOTS_DIR}/0123456789abcdef"]),
                                 names, kinds), max_size=8),
       store_is=st.sampled_from(["folder", "folder", "folder", "file", "absent"]),
       real=st.booleans())
def test_gc_removes_only_snapshots_it_wrote_whatever_else_the_store_holds(
        layout: list[tuple[str, str, str]], store_is: str, real: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    from idmctl.job.code_gc import collect

    base = tmp_path_factory.mktemp("fuzzed_store")
    store = base / "store"
    written: set[str] = set()
    if store_is == "file":
        store.write_text("x")
    elif store_is == "folder":
        store.mkdir()
        if real:
            source = base / "src"
            (source / "pkg").mkdir(parents=True)
            (source / "pkg" / "m.py").write_text("X = 1\n")
            built = snap.materialize(snap.tree(source), store)
            written = {str(p) for p in built.rglob("*")} | {str(built)}
            written |= {str(p) for p in (store / snap.OBJECTS_DIR).rglob("*")}
        for parent, name, kind in layout:
            folder = store / parent
            if not folder.is_dir() or folder.is_symlink() or name in ("..",) or str(folder) in written:
                continue
            target = folder / name
            if target.exists() or target.is_symlink():
                continue
            if kind == "file":
                target.write_text("theirs")
            elif kind == "folder":
                target.mkdir()
            elif kind == "symlink":
                target.symlink_to(base)
            else:  # a folder with a manifest idmctl did not write (or one it cannot read)
                target.mkdir()
                (target / snap.MANIFEST).write_text(json.dumps({"files": {}}) if kind == "manifest" else "{oops")
    before = {str(p) for p in store.rglob("*")} if store.is_dir() else set()
    try:
        done = collect(store)
    except UserError as exc:
        assert store_is == "file" or not (store / snap.SNAPSHOTS_DIR).is_dir() or not (store / snap.OBJECTS_DIR).is_dir()
        assert "not a folder" in exc.line()
        return
    after = {str(p) for p in store.rglob("*")} if store.is_dir() else set()
    gone = before - after
    for removed in done.removed:
        assert len(removed) == snap.VERSION_LENGTH
    # Everything that went was idmctl's own: inside a removed snapshot, or an object (or its emptied folder).
    for path in gone:
        rel = Path(path).relative_to(store)
        parts = rel.parts
        own_snapshot = parts[0] == snap.SNAPSHOTS_DIR and len(parts) >= 2 and parts[1] in done.removed
        own_object = (parts[0] == snap.OBJECTS_DIR and len(parts) >= 2 and len(parts[1]) == 2
                      and (len(parts) == 2 or (len(parts) == 3 and len(parts[2]) == 64 and parts[2][-2] == ".")))
        assert own_snapshot or own_object, f"gc removed {rel}, which it did not write"


# --- the scrontab table around idmctl's block ----------------------------------------------------

def _marker_lines() -> list[str]:
    from idmctl.ops.scron import BEGIN, END

    return [BEGIN, END, BEGIN + " ", "#" + BEGIN, END + "\r", "#SCRON --time=0", "*/10 * * * * idmctl sync"]


table_lines = st.one_of(texts, st.sampled_from(_marker_lines()), st.sampled_from(
    ["0 3 * * * /home/op/backup.sh", "", "# comment", "@daily x", "MAILTO=x", "\x0c", "a\x1cb", "x\r"]))


@settings(database=DATABASE, max_examples=300, deadline=None, print_blob=True)
@seed(20261210)
@given(lines=st.lists(table_lines, max_size=10))
def test_the_scrontab_block_owns_only_the_lines_between_its_markers(lines: list[str]) -> None:
    from idmctl.ops.scron import BEGIN, END, without_block

    table = "\n".join(lines) + ("\n" if lines else "")
    block = f"{BEGIN}\n#SCRON --time=0-00:05:00\n*/10 * * * * sync\n{END}\n"
    try:
        kept = without_block(table)
    except UserError as exc:
        assert "begin line at line" in exc.line() and "\n" not in exc.line()
        return
    theirs = [line for line in table.split("\n")[:-1] if line.rstrip() not in (BEGIN,)]
    if not any(line.rstrip() == BEGIN for line in table.split("\n")):
        assert kept == table or (table == "" and kept == "")  # no block: the table as it was, byte for byte
    assert set(kept.split("\n")[:-1]) <= set(theirs) | {""}
    assert without_block(kept + block) == kept  # install then remove gives the user's table back
    assert without_block(kept) == kept


# --- the cluster profile's newer fields -----------------------------------------------------------

profile_values = st.one_of(hostile, st.sampled_from(
    ["0GB/s", "-1GB/s", "0.0000001B/s", "1e400GB/s", "nanGB/s", "8GB/s", "0", "0:00:00", "0:00:59", "1", "5m",
     "61 * * * *", "*/0 * * * *", "* * * * *", "0 0 31 2 *", "@hourly", "0 0 * * MON", "5-1 * * * *", "*/10 * * * *",
     "relative/store", "../store", "~/store", "$IDMCTL_HOME/x", "/abs/store", "", " "] + MARKUP + INVISIBLE))


@FAST
@seed(20261211)
@given(field=st.sampled_from(["storage.nas_read", "storage.nvme_read", "storage.page_cache_read",
                              "storage.direct_read", "controller.time_limit", "controller.schedule",
                              "controller.mem", "code_store"]),
       value=profile_values)
def test_profile_fields_are_judged_at_load_in_one_line(field: str, value: Any,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    from ground.units import parse_bandwidth, parse_duration
    from idmctl.core.cron import schedule_problem
    from idmctl.core.profile import load_profile

    data = yaml.safe_load((clusters_dir() / "local-slurm.yaml").read_text())
    target = data
    *parents, last = field.split(".")
    for name in parents:
        target = target.setdefault(name, {})
    target[last] = value
    path = tmp_path_factory.mktemp("fuzzed_profile") / "team.yaml"
    try:
        path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    except (yaml.YAMLError, RecursionError):
        return
    try:
        profile = load_profile(str(path))[0]
    except UserError as exc:
        assert "\n" not in exc.line() and str(path) in exc.line()
    else:
        for name in ("nas_read", "nvme_read", "page_cache_read", "direct_read"):
            rate = getattr(profile.storage, name)
            assert rate is None or parse_bandwidth(rate) > 0
        assert parse_duration(profile.controller.time_limit) >= 60
        assert schedule_problem(profile.controller.schedule) is None
        assert profile.code_store is None or os.path.isabs(os.path.expanduser(os.path.expandvars(profile.code_store))) \
            or profile.code_store.startswith(str(path.parent))
    check_contract(["controller", "show", "--cluster", str(path)], names=str(path))

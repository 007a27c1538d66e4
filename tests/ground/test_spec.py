"""Experiment specs: the shipped ones validate, hashes are canonical, diff shows what differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ground.errors import UserError
from ground.spec import load_experiments, list_experiments, load_spec
from ground.spec.loader import deep_merge
from ground.contract import ENV_EXPERIMENTS

SHIPPED = ["latent_c_n4", "latent_c_n12_dense", "latent_c_n4_d12", "latent_c_n6_d12", "latent_c_n4_d4", "quickstart"]


def test_every_shipped_experiment_is_listed_and_valid():
    names = {p.stem for p in list_experiments()}
    assert set(SHIPPED) <= names
    for name in names:
        assert all(variant.spec is not None for variant in load_experiments(name))  # a sweep: each variant


def test_card_n4_geometry_and_derived_values():
    spec = load_spec("latent_c_n4").spec
    assert spec.data.cached_layers == [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35]
    assert (spec.data.frames, *spec.data.token_grid, spec.data.channels) == (24, 27, 48, 5120)
    assert spec.data.selected_blocks == [5, 14, 23, 32]
    assert spec.data.routing_n == 4
    assert spec.resources.world_size == 8
    assert spec.grad_accum == 1024 // (8 * 8)
    assert spec.loader.derived_persistent_workers is False
    assert spec.goal_parsed is not None and spec.goal_parsed.passes(124.9) and not spec.goal_parsed.passes(125.1)


def test_hash_ignores_key_order_and_extends_layout(tmp_path: Path):
    base = load_spec("latent_c_n4")
    # The same content written flat, with keys in another order, hashes the same.
    flat = dict(reversed(list(base.canonical.items())))
    path = tmp_path / "flat.yaml"
    path.write_text(json.dumps(flat))
    assert load_spec(str(path)).hash == base.hash
    changed = tmp_path / "changed.yaml"
    flat["train"] = {**flat["train"], "lr": 2e-4}
    changed.write_text(json.dumps(flat))
    assert load_spec(str(changed)).hash != base.hash


def test_deep_merge_replaces_lists_and_merges_mappings():
    merged = deep_merge({"a": {"x": 1, "y": [1, 2]}, "b": 1}, {"a": {"y": [3]}, "c": 2})
    assert merged == {"a": {"x": 1, "y": [3]}, "b": 1, "c": 2}


def test_diff_n4_vs_n12_shows_exactly_the_routing(cli):
    result = cli("exp", "diff", "latent_c_n4", "latent_c_n12_dense", "--json")
    assert result.exit_code == 0, result.output
    fields = [row["field"] for row in json.loads(result.output)]
    assert fields == ["data.selected_layer_indices", "derived.routing_n", "derived.selected_blocks", "model.depth"]


def test_exp_list_json_and_show(cli):
    result = cli("exp", "list", "--json")
    assert result.exit_code == 0
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["latent_c_n4"]["routing_n"] == 4 and rows["latent_c_n12_dense"]["routing_n"] == 12
    assert "base_latent_c" not in rows
    shown = cli("exp", "show", "latent_c_n4")
    assert shown.exit_code == 0
    assert "persistent_workers: false" in shown.output and "selected_blocks:" in shown.output


def test_register_is_idempotent_and_writes_versions(cli, idmctl_home: Path):
    first = cli("exp", "register", "quickstart")
    assert first.exit_code == 0 and first.output.startswith("new ")
    second = cli("exp", "register", "quickstart")
    assert second.output.startswith("known")
    import sqlite3

    rows = sqlite3.connect(idmctl_home / "idmctl.sqlite").execute("select experiment from spec_version").fetchall()
    assert rows == [("quickstart",)]


def test_unknown_experiment_suggests_the_close_name():
    with pytest.raises(UserError) as info:
        load_spec("latent_c_n5")
    assert "did you mean" in info.value.line()


def test_experiments_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli):
    shutil.copy(Path(__file__).parents[2] / "experiments" / "quickstart.yaml", tmp_path / "mine.yaml")
    monkeypatch.setenv(ENV_EXPERIMENTS, str(tmp_path))
    result = cli("exp", "list", "--json")
    assert [row["name"] for row in json.loads(result.output)] == ["mine"]


def test_a_bad_value_inherited_from_a_base_is_reported_in_the_base(tmp_path: Path):
    base = tmp_path / "base_mine.yaml"
    spec = json.loads(json.dumps(load_spec("quickstart").canonical))
    spec["loader"]["batch_size"] = -1
    base.write_text(json.dumps(spec))
    child = tmp_path / "child.yaml"
    child.write_text("extends: base_mine\ndescription: inherits a bad batch size\n")
    with pytest.raises(UserError) as info:
        load_spec(str(child))
    assert info.value.line().startswith(f"error: {base}:loader.batch_size: ")
    # The same value set in the child is reported in the child.
    child.write_text("extends: base_mine\nloader: {batch_size: -2}\n")
    with pytest.raises(UserError) as info:
        load_spec(str(child))
    assert info.value.line().startswith(f"error: {child}:loader.batch_size: ")

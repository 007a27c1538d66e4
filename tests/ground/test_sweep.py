"""Declarative sweeps: named variants with their own hashes, one preflight table, submit per variant,
compare grouped by sweep with the swept axes as columns; bad axes are one-line errors."""

from __future__ import annotations

from ground.contract import ENV_EXPERIMENTS

import json
from pathlib import Path

import pytest
import yaml

from ground.spec.loader import load_experiments, load_spec
from trainers.tiny_data import tiny_spec

PHASE2 = ["latent_c_phase2.n4_d4", "latent_c_phase2.n4_d12", "latent_c_phase2.n6_d12"]


def test_card_a_phase2_is_one_sweep_of_three_variants_with_their_own_hashes(cli) -> None:
    variants = load_experiments("latent_c_phase2")
    assert [v.name for v in variants] == PHASE2
    assert [(v.spec.data.routing_n, v.spec.model.depth) for v in variants] == [(4, 4), (4, 12), (6, 12)]
    assert len({v.hash for v in variants}) == 3
    assert variants[1].axes == {"data.selected_layer_indices": [1, 4, 7, 10], "model.depth": 12}
    assert load_spec("latent_c_phase2.n4_d12").hash == variants[1].hash
    listing = {row["name"]: row for row in json.loads(cli("exp", "list", "--json").stdout)}
    assert [name for name in listing if name.startswith("latent_c_phase2")] == PHASE2
    assert [listing[name]["hash"] for name in PHASE2] == [v.short_hash for v in variants]


def test_grid_names_every_combination(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"extends": "quickstart", "sweep": {"grid": {"model.depth": [1, 2],
                                                                                 "train.lr": [0.001, 0.003]}}}))
    names = [v.name for v in load_experiments(str(path))]
    # Dots separate sweep and variant, so values write them as dashes.
    assert names == ["grid.depth-1_lr-0-001", "grid.depth-1_lr-0-003", "grid.depth-2_lr-0-001", "grid.depth-2_lr-0-003"]


@pytest.mark.parametrize(("sweep", "line"), [
    ({"zip": {"model.dpeth": [4, 12]}},
     "model.dpeth: unknown field (a sweep axis) (did you mean 'model.depth'?)"),
    ({"zip": {"model.depth": [4, 12], "train.lr": [0.1]}},
     "sweep.zip: zip axes differ in length (model.depth 2, train.lr 1) (give every axis one value per variant, or use grid:)"),
    ({"grid": {"model.depth": ["deep"]}},
     "model.depth: variant depth-deep: Input should be a valid integer, unable to parse string as an integer, "
     "got 'deep' (a value like its current one, e.g. model.depth=2)"),
    ({"zip": {"model.depth": [4]}, "grid": {"train.lr": [0.1]}},
     "sweep: needs exactly one of grid: or zip: (grid: every combination; zip: the i-th value of every axis together)"),
])
def test_bad_sweep_is_one_line_exit_2_and_nothing_recorded(cli, tmp_path: Path, idmctl_home: Path, sweep: dict,
                                                           line: str) -> None:
    path = tmp_path / "bad_sweep.yaml"
    path.write_text(yaml.safe_dump({"extends": "quickstart", "sweep": sweep}))
    result = cli("preflight", str(path), "--no-smoke")
    assert result.exit_code == 2
    field_prefix = "sweep.zip." if "unknown field" in line else ""
    assert result.stderr == f"error: {path}:{field_prefix}{line}\n"
    assert not (idmctl_home / "idmctl.sqlite").exists()


def test_preflight_of_a_sweep_is_one_table_a_row_per_variant(cli, idmctl_home: Path, tmp_path: Path) -> None:
    # At the card's --mem 1600GB the page cache lets all three fit; at 800GB it holds 29% of N=4's 2.4 TB working
    # set but 20% of N=6's 3.6 TB, and N=6 reads 6/4 as much: 44.8 s/step × 60K = 31.2 d > 30 d.
    path = tmp_path / "phase2_mem.yaml"
    path.write_text("extends: latent_c_phase2\nresources:\n  mem: 800GB\n")
    result = cli("preflight", str(path), "--cluster", "card", "--no-smoke")
    assert result.exit_code == 1
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│ n")}
    assert list(rows) == ["n4_d4", "n4_d12", "n6_d12"]
    assert "│ [1,4,7,10]" in rows["n4_d4"] and "PASS ≥ 27.6 s/step, ≥ 19.3 d" in rows["n4_d4"]
    assert "│ [1,3,5,7,9,11]" in rows["n6_d12"] and "FAIL ≥ 44.8 s/step, ≥ 31.2 d" in rows["n6_d12"]
    header = next(line for line in result.stdout.splitlines() if line.startswith("┃ variant"))
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "variant", "data.selected_layer_indices", "model.depth", "spec", "introspection", "loader", "shm", "io", "qos",
        "disk", "cache", "smoke"]
    assert result.stderr == "preflight failed for 1 of 3 variants: phase2_mem.n6_d12\n"
    document = json.loads(cli("preflight", str(path), "--cluster", "card", "--no-smoke", "--json").stdout)
    assert [v["name"] for v in document["variants"]] == [name.replace("latent_c_phase2", "phase2_mem") for name in PHASE2]
    assert document["variants"][2]["failed"] == ["io"]


def test_submit_of_a_sweep_dry_run_renders_one_script_per_variant(cli) -> None:
    result = cli("submit", "latent_c_phase2", "--cluster", "card", "--dry-run")
    assert result.exit_code == 0, result.output
    assert [line for line in result.stdout.splitlines() if line.startswith("#SBATCH --job-name=")] == [
        f"#SBATCH --job-name={name}" for name in PHASE2]


def test_submit_skips_variants_without_a_passing_preflight(cli) -> None:
    result = cli("submit", "latent_c_phase2", "--cluster", "card", "--json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["submitted"] == [] and [s["variant"] for s in document["skipped"]] == PHASE2


@pytest.mark.slow
@pytest.mark.slurm
def test_three_variant_sweep_end_to_end_on_slurm(cli, tiny_cache, slurm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Preflight (with smokes) → submit → train on the local cluster → compare grouped by sweep."""
    from idmctl.core.job_state import is_terminal
    from slurm_support import wait_until

    home = slurm_home
    specs = home / "specs"
    specs.mkdir()
    monkeypatch.setenv(ENV_EXPERIMENTS, str(specs))
    document = tiny_spec(tiny_cache.data, resources={"cpus": 1, "mem": "1500MB", "time_limit": "0:10:00"},
                         train={"steps": 4, "checkpoint_every": 4, "log_every": 2})
    document["sweep"] = {"zip": {"data.selected_layer_indices": [[0], [0, 2], [1, 3]]}, "names": ["n1", "n2", "n2b"]}
    (specs / "tiny_sweep.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    checked = cli("preflight", "tiny_sweep")
    assert checked.exit_code == 0, checked.output + checked.stderr
    assert checked.stdout.count("PASS (submit unlocked)") == 3
    submitted = json.loads(cli("submit", "tiny_sweep", "--json").stdout)
    assert [s["experiment"] for s in submitted["submitted"]] == ["tiny_sweep.n1", "tiny_sweep.n2", "tiny_sweep.n2b"]
    assert len({s["chain"] for s in submitted["submitted"]}) == 3 and submitted["skipped"] == []

    from slurm_support import sh

    ids = ",".join(s["scheduler_id"] for s in submitted["submitted"])

    def all_ended() -> list | None:
        if sh("squeue", "-h", "-j", ids, "-o", "%T", check=False).strip():
            return None  # Slurm still lists one of them (squeue lists unfinished jobs only): no sync until it does not
        assert cli("sync").exit_code == 0
        rows = json.loads(cli("jobs", "--json").stdout)
        return rows if len(rows) == 3 and all(is_terminal(r["state"]) for r in rows) else None

    rows = wait_until(all_ended, 600, "the three sweep jobs to end (synced once Slurm lists none)", poll_s=1.0)
    assert {r["state"] for r in rows} == {"COMPLETED"}, rows
    report = json.loads(cli("compare", "tiny_sweep", "--json").stdout)
    (group,) = report["sweeps"]
    assert group["sweep"] == "tiny_sweep" and group["axes"] == ["data.selected_layer_indices"]
    assert [(v["variant"], v["axes"]["data.selected_layer_indices"], v["status"]) for v in group["variants"]] == [
        ("n1", [0], "finished"), ("n2", [0, 2], "finished"), ("n2b", [1, 3], "finished")]
    table = cli("compare", "tiny_sweep").stdout
    assert "sweep tiny_sweep" in table and "│ n2b " in table

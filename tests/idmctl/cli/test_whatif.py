"""What-ifs: fixes recomputed by the same check, ``preflight --what-if`` beside the original, bad overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _preflight_rows(home: Path) -> int:
    import sqlite3

    db = home / "idmctl.sqlite"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("select count(*) from preflight_run").fetchone()[0]


def _check(document: dict, name: str) -> dict:
    return next(c for c in document["checks"] if c["name"] == name)


def test_io_fail_carries_fixes_recomputed_by_the_io_check(cli) -> None:
    result = cli("preflight", "latent_c_n12_dense", "--cluster", "card", "--no-smoke", "--json")
    assert result.exit_code == 1
    io = _check(json.loads(result.stdout[: result.stdout.rindex("}") + 1]), "io")
    assert io["status"] == "FAIL"
    # 1,024 ÷ 4 = 256 samples × 796,262,400 B = 203.8 GB/step, 20% of it from the page cache (1.4 TB of a
    # 7.2 TB working set): 80% ÷ 8 GB/s + 20% ÷ 20 GB/s ≈ 22.0 s/step (the job's --mem 1600GB is 1600 GiB of page cache); × 60K + 2.2 h stage = 15.4 d. With the
    # cache N=6 already fits (N=4 did before the cache was modelled).
    assert io["numbers"]["what_ifs"] == [
        {"set": {"loader.repeats": 4}, "status": "PASS", "headline": "≥ 22.0 s/step, ≥ 15.4 d"},
        {"set": {"data.selected_layer_indices": [1, 3, 5, 7, 9, 11]}, "status": "PASS",
         "headline": "≥ 37.5 s/step, ≥ 26.1 d"},
    ]
    assert io["fix"].endswith("what-ifs: loader.repeats=4 → ≥ 22.0 s/step, ≥ 15.4 d; "
                              "data.selected_layer_indices=[1,3,5,7,9,11] (N=6) → ≥ 37.5 s/step, ≥ 26.1 d")


def test_a_fix_and_its_what_if_give_the_same_numbers(cli) -> None:
    fixes = json.loads(cli("preflight", "latent_c_n12_dense", "--cluster", "card", "--no-smoke", "--json").stdout
                       .split("\nerror")[0].split("\npreflight failed")[0])
    suggested = _check(fixes, "io")["numbers"]["what_ifs"][1]
    result = cli("preflight", "latent_c_n12_dense", "--cluster", "card", "--json",
                 "--what-if", "data.selected_layer_indices=[1,3,5,7,9,11]")
    assert result.exit_code == 0, result.output
    io = _check(json.loads(result.stdout), "io")
    assert io["after"]["status"] == suggested["status"] == "PASS"
    # No GPU smoke: both step times are the data time alone, lower bounds.
    assert {"number": "step_s", "before": "≥ 89.1 s", "after": "≥ 37.5 s"} in io["changed"]
    assert {"number": "wall_s", "before": "≥ 62.0 d", "after": "≥ 26.1 d"} in io["changed"]


def test_what_if_repeats_shows_changed_numbers_beside_the_originals_and_records_nothing(cli, idmctl_home) -> None:
    result = cli("preflight", "latent_c_n12_dense", "--cluster", "card", "--what-if", "loader.repeats=8")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "what-if latent_c_n12_dense on card: loader.repeats 1 → 8" in out
    io_row = next(line for line in out.splitlines() if line.startswith("│ io "))
    # It fits now, so well that the spec's 30 d limit is 2.7× the derived one: the WARN says so, with the number.
    assert "FAIL → WARN" in io_row and "step_bytes: 815.4 GB → 101.9 GB" in io_row
    assert "set resources.time_limit: 9-15:49:00" in io_row
    for change in ("step_s: ≥ 89.1 s → ≥ 11.0 s", "train_s: ≥ 61.9 d → ≥ 7.6 d", "wall_s: ≥ 62.0 d → ≥ 7.7 d",
                   "data_s_per_step: 89.1 s/step → 11.0 s/step"):
        assert change in out
    from ground.spec.loader import load_spec

    assert f"what-if PASS (static) — was FAIL: io; spec {load_spec('latent_c_n12_dense').short_hash} → " in out
    assert _preflight_rows(idmctl_home) == 0
    spec_file = Path(__file__).resolve().parents[3] / "experiments" / "latent_c_n12_dense.yaml"
    assert "repeats" not in spec_file.read_text()


def test_what_if_that_still_fails_exits_1(cli) -> None:
    result = cli("preflight", "latent_c_n12_dense", "--cluster", "card", "--what-if", "loader.repeats=2", "--json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["failed_after"] == ["io"] and document["recorded"] is False


@pytest.mark.parametrize(("override", "line"), [
    ("loader.repeat=8", "error: --what-if:loader.repeat: unknown field (did you mean 'loader.repeats'?)"),
    ("repeats=8", "error: --what-if:repeats: unknown field (did you mean 'loader.repeats'?)"),
    ("trian.steps=10", "error: --what-if:trian.steps: unknown field (did you mean 'train.steps'?)"),
    ("loader.repeats=abc", "error: --what-if:loader.repeats: Input should be a valid integer, unable to parse string "
                           "as an integer, got 'abc' (a value like its current one, e.g. loader.repeats=1)"),
    ("loader.repeats=3", "error: --what-if:loader.repeats: 3 does not divide batch_size 8 (each micro-batch holds "
                         "batch_size / repeats distinct samples) (it is 1 now)"),
    ("loader", "error: --what-if: 'loader' is not section.field=value (e.g. --what-if loader.repeats=8)"),
    ("loader=3", "error: --what-if:loader: is a section, not a field (set one of its fields, e.g. loader.batch_size)"),
])
def test_bad_what_if_is_one_line_exit_2_nothing_recorded(cli, idmctl_home, override: str, line: str) -> None:
    result = cli("preflight", "latent_c_n12_dense", "--cluster", "card", "--what-if", override)
    assert result.exit_code == 2
    assert result.stderr == line + "\n"
    assert result.stdout == ""
    assert not (idmctl_home / "idmctl.sqlite").exists()


def test_shm_warn_carries_a_worker_count_that_fits(cli, tmp_path: Path) -> None:
    spec = tmp_path / "workers.yaml"
    spec.write_text("extends: latent_c_n12_dense\nloader:\n  num_workers: 4\n  prefetch_factor: 2\n")
    result = cli("preflight", str(spec), "--cluster", "card", "--no-smoke", "--json")
    shm = _check(json.loads(result.stdout[: result.stdout.rindex("}") + 1]), "shm")
    assert shm["status"] == "FAIL"
    # 256 GB ÷ (8 ranks × 2 prefetch × batch 8 × 796,262,400 B) = 2 workers fit.
    assert shm["numbers"]["what_ifs"][0] == {"set": {"loader.num_workers": 2}, "status": "PASS",
                                             "headline": "203.8 GB of 256.0 GB"}

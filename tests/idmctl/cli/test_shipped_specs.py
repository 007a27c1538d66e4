"""Every shipped spec runs from the CLI alone: from an empty $IDMCTL_HOME to ``preflight --no-smoke``.

The CPU-scale specs make their data with ``idmctl data …`` and ``idmctl cache …`` and must PASS; the
card-scale ones (episodes and caches on the card's NAS, 8 GPUs) may FAIL checks on this machine, but
preflight must run and print its whole table (exit 0 or 1, never a crash or a bad-input exit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CHECKS = ["spec", "introspection", "loader", "shm", "io", "qos", "disk", "cache", "smoke"]
MAKE_DATA = {
    # Demo count and length are cut to keep the test short; the geometry (64 px → 4×4 tokens) is the spec's.
    "quickstart": [("data", "demos", "--out", "{home}/quickstart/demos.hdf5", "--n", "2", "--steps", "22"),
                   ("cache", "build-hidden", "quickstart")],
    "latent_rgbpt_smoke": [("data", "scenes", "--out", "{home}/latent_smoke/demos.hdf5"),
                           ("cache", "build", "latent_rgbpt_smoke"),
                           ("cache", "build-hidden", "latent_rgbpt_smoke")],
}
SHIPPED = sorted(p.stem for p in (REPO / "experiments").glob("*.yaml") if p.stem != "baselines")
"""Every spec file, bases included (``baselines.yaml`` is card A's recorded numbers, not a spec)."""
MISTAKES = sorted(str(p.relative_to(REPO)) for p in (REPO / "experiments" / "mistakes").glob("*.yaml"))


def _checks(output: str) -> dict[str, str]:
    """The JSON report (a failing preflight adds its one stderr line after it)."""
    report, _ = json.JSONDecoder().raw_decode(output)
    return {check["name"]: check["status"] for check in report["checks"]}


def test_every_shipped_spec_is_listed_here() -> None:
    from ground.spec import list_experiments

    assert sorted(p.stem for p in list_experiments(include_bases=True)) == SHIPPED
    assert set(MAKE_DATA) <= set(SHIPPED)


@pytest.mark.parametrize("experiment", sorted(MAKE_DATA))
@pytest.mark.slow
def test_a_cpu_scale_spec_goes_from_nothing_to_a_passing_preflight(cli, idmctl_home: Path, experiment: str) -> None:
    assert not idmctl_home.exists()
    for step in MAKE_DATA[experiment]:
        args = [part.format(home=idmctl_home) for part in step]
        result = cli(*args)
        assert result.exit_code == 0, f"idmctl {' '.join(args)}:\n{result.output[-2000:]}"
    result = cli("preflight", experiment, "--no-smoke", "--json")
    assert result.exit_code == 0, result.output[-3000:]
    checks = _checks(result.output)
    assert list(checks) == CHECKS
    assert all(status == "PASS" for name, status in checks.items() if name != "smoke"), checks
    assert checks["smoke"] == "SKIP"


@pytest.mark.parametrize("experiment", [e for e in SHIPPED if e not in MAKE_DATA] + MISTAKES)
def test_a_card_scale_spec_gets_its_whole_preflight_table_here(cli, experiment: str) -> None:
    result = cli("preflight", experiment, "--no-smoke", "--json")
    assert result.exit_code in (0, 1), result.output[-3000:]
    report, _ = json.JSONDecoder().raw_decode(result.output)
    # A sweep spec (card A's Phase-2 variants) reports one whole table per variant.
    for table in report.get("variants", [report]):
        assert [check["name"] for check in table["checks"]] == CHECKS, table.get("name")


@pytest.mark.parametrize(("args", "message"), [
    (["--n", "1"], "error: --n: --n 1 leaves no held-out episode (use at least 2)"),
    (["--size", "20"], "error: --size: frame size 20 px is not a positive multiple of 16 (e.g. 32)"),
])
def test_data_scenes_bad_input_is_one_line_exit_2_nothing_written(cli, tmp_path: Path, args: list[str],
                                                                  message: str) -> None:
    out = tmp_path / "scenes.hdf5"
    result = cli("data", "scenes", "--out", str(out), *args)
    assert result.exit_code == 2
    assert result.output.strip() == message
    assert not out.exists()

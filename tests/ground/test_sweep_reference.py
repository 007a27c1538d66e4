"""Preflight and submit decide with one predicate whether a reference names a whole sweep or one job."""

from __future__ import annotations

from pathlib import Path

import yaml

from ground.spec.loader import load_experiments, names_a_sweep


def _named(reference: str) -> bool:
    return names_a_sweep(reference, load_experiments(reference))


def test_a_sweep_by_name_or_file_is_a_sweep_and_a_variant_or_a_plain_spec_is_one_job(tmp_path: Path) -> None:
    assert _named("latent_c_phase2")  # card A's Phase 2: three variants
    assert not _named("latent_c_phase2.n4_d12")  # one variant of it
    assert not _named("quickstart")  # no sweep at all
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({"extends": "quickstart", "sweep": {"grid": {"model.depth": [2]}}}))
    # A sweep file of one variant is still the sweep (submit sends it as `one.yaml.<variant>`, and preflight
    # now shows it as the sweep's table too: before, preflight took it for one job and submit for a sweep).
    assert _named(str(one)) and len(load_experiments(str(one))) == 1
    variant = load_experiments(str(one))[0].name.rsplit(".", 1)[1]
    assert not _named(f"{one}.{variant}")  # its one variant, as submit names it

"""Preflight for a ``stage.dest`` the node names (``$SLURM_TMPDIR/idm``): nothing on this machine measures it."""

from __future__ import annotations

from pathlib import Path

import yaml

from ground.spec import load_spec
from idmctl.core.checks import Measurements, PreflightContext, Status
from idmctl.core.profile import load_profile
from idmctl.gate import disk


def _card_spec(tmp_path: Path, dest: str) -> Path:
    path = tmp_path / "card_on_node.yaml"
    path.write_text(yaml.safe_dump({"extends": "latent_c_n4", "stage": {"dest": dest}}))
    return path


def test_disk_check_says_a_node_named_dest_is_not_measured_here(tmp_path: Path) -> None:
    """This machine's 1 TB free would FAIL the 7.2 TB copy; the node's scratch is the profile's 50 GB, and the
    line says the path is the node's, checked by doctor --nodes --scratch, instead of measuring /tmp here."""
    profile = load_profile("local")[0]
    resolved = load_spec(str(_card_spec(tmp_path, "$SLURM_TMPDIR/idm")))
    result = disk.stage_check(PreflightContext(resolved, profile, Measurements(scratch_free_bytes=10**12)))
    assert result.status is Status.FAIL
    assert result.numbers["capacity_bytes"] == 50 * 10**9
    assert ("vs 50.0 GB scratch of a local node ($SLURM_TMPDIR/idm is named by the node, not measurable here: "
            "`idmctl doctor --nodes --scratch '$SLURM_TMPDIR/idm'` checks it on each node)") in result.summary
    plain = disk.stage_check(PreflightContext(load_spec(str(_card_spec(tmp_path, "/tmp/idm"))), profile,
                                              Measurements(scratch_free_bytes=10**12)))
    assert "vs 1.0 TB free under /tmp/idm on this machine (statvfs)" in plain.summary

"""The qos check counts a copy that does not outlive its job against the tier's preempt cycle or max wall."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ground.spec import load_spec
from idmctl.core.checks import Measurements, PreflightContext
from idmctl.core.profile import load_profile


def _ctx(tmp_path: Path, dest: str, qos: str) -> PreflightContext:
    path = tmp_path / "per_attempt.yaml"
    path.write_text(yaml.safe_dump({"extends": "latent_c_n4", "resources": {"qos": qos}, "stage": {"dest": dest}}))
    return PreflightContext(load_spec(str(path)), load_profile("card")[0], Measurements())


def test_qos_counts_the_restaged_copy_against_the_cycle(tmp_path: Path) -> None:
    from idmctl.gate import qos

    result = qos.check(_ctx(tmp_path, "$SLURM_TMPDIR/idm", "sub"))
    assert result.numbers["stage_attempts"] == float("inf")
    assert ("preemptible sub: stage-in 7.2 TB ÷ NAS 900.0 MB/s = 2.2 h on every attempt ($SLURM_TMPDIR is the job's "
            "own directory, removed when it ends) ≥ preempt cycle 60.0 min: preempted before the first step, every "
            "attempt, the copy starting over each time") in result.summary
    own = qos.check(_ctx(tmp_path, "$SLURM_TMPDIR/idm", "core-own"))
    assert own.numbers["stage_attempts"] == 1
    assert own.numbers["stage_total_s"] == pytest.approx(7_151_073_361_920 / 0.9e9)  # 1,871 files × 3.82 GB ÷ 0.9 GB/s
    assert "stage-in 7.2 TB ÷ NAS 900.0 MB/s = 2.2 h × 1 expected attempt = 2.2 h, copied again on every attempt" in own.summary

"""Stage-in per attempt: a copy to the job's own scratch (``$SLURM_TMPDIR``) or to a private /tmp does not
outlive the job, so the plan counts it again on every attempt."""

from __future__ import annotations

from pathlib import Path

import yaml

from ground.spec import load_spec
from ground.stage import model_identity
from idmctl.core.checks import Measurements, PreflightContext
from idmctl.core.profile import load_profile
from idmctl.plan.budget import staging


def _card_spec(tmp_path: Path, dest: str) -> Path:
    path = tmp_path / "card_on_node.yaml"
    path.write_text(yaml.safe_dump({"extends": "latent_c_n4", "stage": {"dest": dest}}))
    return path


def test_a_copy_found_here_is_never_reused_for_a_node_named_dest(tmp_path: Path) -> None:
    """A finished copy with this very key on this machine says nothing of the job's own scratch: stage-in counts."""
    profile = load_profile("local")[0]
    resolved = load_spec(str(_card_spec(tmp_path, "$SLURM_TMPDIR/idm")))
    data = resolved.spec.data
    staged = {"source": str(Path(data.cache_root)), "layers": "all", "model": model_identity(data), "files_match": True}
    on_node = staging(PreflightContext(resolved, profile, Measurements(staged_copy=staged)))
    assert not on_node.reused and on_node.seconds > 0
    here = staging(PreflightContext(load_spec(str(_card_spec(tmp_path, "/tmp/idm"))), profile,
                                    Measurements(staged_copy=staged)))
    assert here.reused and here.seconds == 0

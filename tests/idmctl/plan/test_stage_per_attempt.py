"""Stage-in per attempt: a copy to the job's own scratch (``$SLURM_TMPDIR``) or to a private /tmp does not
outlive the job, so the plan counts it again on every attempt."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ground.spec import load_spec
from ground.stage import model_identity
from idmctl.core.checks import Measurements, PreflightContext
from idmctl.core.profile import load_profile
from idmctl.plan.budget import stage_attempts, staging, step_estimate


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


def _ctx(tmp_path: Path, dest: str, qos: str, layers: str = "all", measurements: Measurements | None = None,
         profile: str = "card") -> PreflightContext:
    path = tmp_path / "per_attempt.yaml"
    path.write_text(yaml.safe_dump({"extends": "latent_c_n4", "resources": {"qos": qos},
                                    "stage": {"dest": dest, "layers": layers}}))
    return PreflightContext(load_spec(str(path)), load_profile(profile)[0], measurements or Measurements())


def test_slurm_tmpdir_is_copied_again_on_every_attempt_with_the_arithmetic(tmp_path: Path) -> None:
    """Card A's routed N=4 (2.4 TB) on sub (1 h preempt cycle) staged to $SLURM_TMPDIR: 44.1 min of every
    attempt is stage-in, so each attempt leaves 15.9 min of work; 14.1 d of work needs ⌈14.1 d ÷ 15.9 min⌉
    = 1,279 attempts and 1,279 copies (39.2 d of stage-in). The same run on the node's shared /tmp is one copy."""
    estimate = step_estimate(_ctx(tmp_path, "$SLURM_TMPDIR/idm", "sub", "routed"))
    assert estimate.stage_attempts == 1279
    assert estimate.stage_attempts_text == (
        "stage-in 2.4 TB ÷ NAS 900.0 MB/s = 44.1 min × 1279 expected attempts = 39.2 d, copied again on every "
        "attempt ($SLURM_TMPDIR is the job's own directory, removed when it ends; attempts = ⌈14.1 d of work ÷ "
        "(preempt cycle 60.0 min − 44.1 min stage-in = 15.9 min)⌉)")
    assert estimate.stage_attempts_text in estimate.arithmetic()
    shared = step_estimate(_ctx(tmp_path, "/tmp/idm_cache", "sub", "routed"))
    assert (shared.stage_attempts, shared.stage_attempts_text) == (1, "")
    assert shared.stage_s == estimate.stage_s and shared.wall_s == estimate.wall_s  # one job's wall: one copy


def test_a_copy_longer_than_the_cycle_never_gets_past_stage_in_when_restaged(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "$SLURM_TMPDIR/idm", "sub")  # all 12 layers: 7.2 TB ÷ 0.9 GB/s = 2.2 h > 1 h
    attempts, text = stage_attempts(ctx, staging(ctx), step_estimate(ctx).train_s)
    assert attempts == float("inf")
    assert text.endswith("≥ preempt cycle 60.0 min: no attempt gets past stage-in, the run never finishes")


def test_a_private_tmp_restages_a_dest_under_tmp_and_finds_no_copy_staged(tmp_path: Path) -> None:
    """Where the cluster's settings make /tmp private per job (``Measurements.private_tmp``, read by
    cluster_settings), a copy at /tmp/idm_cache on this machine does not count as staged for the job."""
    private = Measurements(private_tmp="job_container/tmpfs")
    on_tmp = staging(_ctx(tmp_path, "/tmp/idm_cache", "core-own", measurements=private, profile="local-slurm"))
    assert on_tmp.restaged == "/tmp is private to each job on this cluster: job_container/tmpfs"
    assert on_tmp.formula.endswith("; copied again on every attempt (/tmp is private to each job on this cluster: "
                                   "job_container/tmpfs)")
    elsewhere = staging(_ctx(tmp_path, "/scratch/idm", "core-own", measurements=private))
    assert elsewhere.restaged == ""
    site = staging(_ctx(tmp_path, "$LOCAL_SCRATCH/idm", "core-own", measurements=private))
    assert site.restaged == ""  # a site's scratch the job does not own may outlive it


DATA = Path(__file__).resolve().parents[2] / "data" / "scontrol_config"


def test_private_tmp_is_read_from_the_clusters_own_settings() -> None:
    """``scontrol show config`` as Slurm 22.05 (this project's cluster) and 25.11 print it (tests/data/scontrol_config,
    their README names the sources): none private as recorded; the plugins that make /tmp private when set."""
    from idmctl.gate.cluster_settings import parse_config, private_containers, private_tmp

    local = (DATA / "22.05.8-local.txt").read_text()
    newer = (DATA / "25.11.4-docker-notes.txt").read_text()
    assert private_containers(parse_config(local)) == [] and private_containers(parse_config(newer)) == []
    tmpfs = local.replace("job_container/none", "job_container/tmpfs")
    assert private_containers(parse_config(tmpfs)) == ["job_container/tmpfs"]
    linux = newer.replace("NamespaceType           = (null)", "NamespaceType           = namespace/linux")
    assert private_containers(parse_config(linux)) == ["namespace/linux"]
    # The live local cluster (job_container/none), and a profile naming another cluster: not read as private.
    assert private_tmp("idmctl") is None and private_tmp("another-cluster") is None and private_tmp(None) is None

"""The effective job (spec + flags + node exclusions) and the submit-time checks, in-process."""

from __future__ import annotations

import json

from ground.spec.loader import load_spec
from idmctl.core.job_options import JobRequest
from idmctl.job.effective import apply_flags, build


def test_card_example_qos_sub_is_judged_on_the_effective_job(cli, idmctl_home) -> None:
    """The card example: `submit latent_c_n4 --qos sub` after a core-own preflight — the 2.2 h stage-in on a 1 h
    preempt cycle (card A 6054/6108/6158). --dry-run shows the verdicts submit would reach."""
    result = cli("submit", "latent_c_n4", "--cluster", "card", "--qos", "sub", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "submit would be refused: io, qos FAIL" in result.stderr
    assert "stage-in 7.2 TB ÷ NAS 900.0 MB/s = 2.2 h ≥ preempt cycle 60.0 min" in result.stderr.replace("│", " ") \
        or "preempt cycle 60.0 min" in result.stderr
    assert "(from --qos sub)" in result.stderr
    assert "#SBATCH --qos=sub" in result.stdout
    assert not (idmctl_home / "runs").exists()
    plain = cli("submit", "latent_c_n4", "--cluster", "card", "--dry-run")
    assert "qos FAIL" not in plain.stderr and "(from" not in plain.stderr


def test_resource_flags_land_in_the_effective_spec_and_scheduling_flags_do_not() -> None:
    job = build("latent_c_n4", JobRequest(qos="sub", time_limit="2:00:00", mem="100GB", cpus_per_node=8, gpus_per_node=4,
                                          job_name="x", exclude=("n1",), retries=2, entry="tests.jobs_entry"), "card")
    res = job.resolved.spec.resources
    assert (res.qos, res.time_limit, res.mem, res.cpus, res.gpus_per_node) == ("sub", "2:00:00", "100GB", 8, 4)
    declared = job.declared.spec.resources
    assert (res.job_name, res.exclude, res.retries) == (declared.job_name, declared.exclude, declared.retries)
    assert (job.options.job_name, job.options.retries, job.options.exclude[-1]) == ("x", 2, "n1")
    assert job.resolved.hash != job.declared.hash
    assert job.changed_flags == ["--qos", "--time", "--mem", "-c", "--gres", "--entry"]
    assert job.smoke_flags == {"--gres": "gpu:4", "--entry": "tests.jobs_entry"}
    # A flag repeating the spec changes nothing, so it needs no new preflight.
    same = build("latent_c_n4", JobRequest(gpus_per_node=8, entry="trainers.train"), "card")
    assert same.smoke_flags == {} and same.resolved.hash == same.declared.hash


def test_a_flag_that_breaks_the_spec_is_bad_input_naming_the_flag(cli, idmctl_home) -> None:
    result = cli("submit", "latent_c_n4", "--cluster", "card", "--gres", "gpu:3")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: command line:--gres: the spec with --gres gpu:3 is invalid: "
                                    "train.effective_batch: 1024 is not a multiple of batch_size")
    assert not (idmctl_home / "runs").exists()


def test_preflight_takes_submits_flags_and_keys_the_smoke_flags(cli) -> None:
    result = cli("preflight", "latent_c_n4", "--cluster", "card", "--no-smoke", "--qos", "sub", "--gres", "gpu:4",
                 "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["smoke_flags"] == {"--gres": "gpu:4"}
    assert report["spec_hash"] == load_spec("latent_c_n4").hash  # the spec's own hash keys the gate
    qos = next(c for c in report["checks"] if c["name"] == "qos")
    assert qos["numbers"]["gpus"] == 4 and qos["numbers"]["qos"] == "sub"
    # preflight names the flag behind a FAIL as submit does: the spec alone passes qos on core-own.
    assert qos["status"] == "FAIL" and qos["summary"].endswith("(from --qos sub)") and qos["numbers"]["from_flags"] == ["--qos"]


def test_force_submits_past_a_fail_and_says_so(cli, idmctl_home, monkeypatch) -> None:
    """--force --reason bypasses the gate and the submit-time checks; the FAILs are printed and recorded."""
    from sqlmodel import select

    from idmctl.record.db import session
    from idmctl.record.models import Job

    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")
    # The quickstart's cache is not built in this home: cache FAILs on the local profile.
    result = cli("submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason", "probe")
    assert result.exit_code == 0, result.output
    assert "FORCED without preflight and past FAILs (cache): " in result.stdout and result.stdout.rstrip().endswith(": probe")
    with session() as db:
        (job,) = db.exec(select(Job)).all()
    admitted = job.admitted
    assert admitted["admission"]["failed"] == ["cache"] and admitted["admission"]["preflight_id"] is None

"""Why pending, read from the reasons the real local Slurm gives (scripts/slurm/up.sh): a held job
(JobHeldUser), a job depending on it (Dependency), a job whose begin time is ahead (BeginTime); and the
families of the codes Slurm's documentation lists (https://slurm.schedmd.com/job_reason_codes.html)."""

from __future__ import annotations

import pytest

from idmctl.plan.pending import why_pending
from slurm_support import sh, wait_until


@pytest.mark.usefixtures("local_slurm")
def test_reasons_the_local_slurm_gives_are_read() -> None:
    held = sh("sbatch", "--parsable", "--hold", "-J", "idm-why-held", "--wrap", "sleep 1").strip().split(";")[0]
    jobs = [held]
    try:
        after = sh("sbatch", "--parsable", f"--dependency=afterok:{held}", "-J", "idm-why-dep", "--wrap", "sleep 1").strip().split(";")[0]
        later = sh("sbatch", "--parsable", "--begin=now+1hour", "-J", "idm-why-begin", "--wrap", "sleep 1").strip().split(";")[0]
        jobs += [after, later]

        def reasons() -> dict[str, str] | None:
            out = sh("squeue", "-h", "-j", ",".join(jobs), "-o", "%i %r")
            found = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
            return found if len(found) == 3 and "None" not in found.values() else None

        found = wait_until(reasons, 60, "squeue to give a reason for the 3 pending jobs")
        assert {job: why_pending(found[job]).family for job in jobs} == {
            held: "held", after: "dependency", later: "begin time"}
        assert why_pending(found[held]).line(300.0) == (
            "pending for 5.0 min: held — held: it runs only once released (scontrol release JOBID) (Slurm reason JobHeldUser)")
    finally:
        sh("scancel", *jobs, check=False)


@pytest.mark.parametrize(("code", "family"), [
    ("Resources", "resources"), ("Priority", "priority"), ("(Priority)", "priority"),
    ("QOSMaxGRESPerUser", "qos limit"), ("QOSGrpGRES", "qos limit"), ("MaxGRESPerAccount", "qos limit"),
    ("AssocGrpGRES", "account limit"), ("AssocMaxJobsLimit", "account limit"),
    ("ReqNodeNotAvail, Reserved for maintenance", "reservation"), ("Reservation", "reservation"),
    ("ReqNodeNotAvail, UnavailableNodes:n2", "configuration"), ("PartitionTimeLimit", "configuration"),
    ("JobHeldAdmin", "held"), ("DependencyNeverSatisfied", "dependency"), ("None", "other"), (None, "other"),
    ("SomethingNew", "other"),
])
def test_documented_codes_fall_into_their_family(code: str | None, family: str) -> None:
    assert why_pending(code).family == family


def test_jobs_show_says_why_a_pending_job_waits(cli) -> None:
    from datetime import datetime, timedelta, timezone

    from idmctl.record import session
    from idmctl.record.models import Job

    with session() as db:
        job = Job(scheduler_id="7002", experiment="latent_c_n4", state="PENDING", reason="Dependency", gpus=8,
                  qos="core-own", submitted_at=datetime.now(timezone.utc) - timedelta(minutes=42))
        db.add(job)
        db.flush()
        job_id = job.id
    result = cli("jobs", "show", str(job_id))
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("pending for ")]
    assert line.endswith(" min: dependency — waits for the job(s) it depends on (Slurm reason Dependency)"), line
    assert 41 <= float(line.split()[2]) <= 43, line  # 42 min since submit, give or take the test's own time

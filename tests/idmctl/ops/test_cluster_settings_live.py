"""The cluster's own settings judged on a cluster of this module's own, brought up with them off, then on.

scripts/slurm/up.sh's knobs pick the settings: ``off`` has no preempt_send_user_signal and no job container,
``on`` has SlurmctldParameters=preempt_send_user_signal and a MinJobAge of 30 s; both give QoS ``sub`` a
GraceTime of 60 s. For each: `idmctl doctor`'s "cluster settings" row, the qos check on the preemptible tier
``sub``, and what a real idmctl job on ``sub`` goes through when ``core-own`` preempts it. A third state,
``private_tmp``, is ``on`` with job_container/tmpfs, for doctor's row only: it runs no job, because each job's
/tmp is private there, and a checkout under /tmp (as a CI clone may be) would be hidden from the job (the
batch script: "…/.venv/bin/python: No such file or directory").

The cluster is this module's alone (its own root under /var/tmp, ports 17200-17209, MariaDB 3497, job ids from 20001; the
suite's shared clusters use 17010 + 20·K and 1 + 3000·K), stopped with scripts/slurm/down.sh after each
state and removed at the end; a file lock keeps two sessions from bringing it up at once. Its tests stay on
one worker (one xdist group), since the module's fixture owns the cluster.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ground.contract import ENV_CLUSTER, ENV_HOME, EXIT_REQUEUE
from slurm_support import sh, squeue_state, text_so_far, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("cluster_settings_live")]

REPO = Path(__file__).resolve().parents[3]
ROOT = Path("/var/tmp/idmctl-slurm-settings")
"""Not under /tmp: job_container/tmpfs gives each job a /tmp of its own, which would hide the spool (slurmd
could not exec the batch script: "execve(): …/spool/n1/job20005/slurm_script: No such file or directory")."""
LOCK = Path("/tmp/idmctl-slurm-settings.lock")
CONF = ROOT / "etc" / "slurm.conf"
CLUSTER_ENV = {"IDMCTL_SLURM_ROOT": str(ROOT), "IDMCTL_SLURM_PORT": "17200", "IDMCTL_SLURM_FIRST_JOB_ID": "20001",
               "IDMCTL_SLURM_SUB_GRACE": "60"}
STATES = {
    "off": {"IDMCTL_SLURM_PREEMPT_SIGNAL": "0", "IDMCTL_SLURM_JOB_CONTAINER": "none", "IDMCTL_SLURM_MIN_JOB_AGE": "300"},
    "on": {"IDMCTL_SLURM_PREEMPT_SIGNAL": "1", "IDMCTL_SLURM_JOB_CONTAINER": "none", "IDMCTL_SLURM_MIN_JOB_AGE": "30"},
    "private_tmp": {"IDMCTL_SLURM_PREEMPT_SIGNAL": "1", "IDMCTL_SLURM_JOB_CONTAINER": "tmpfs",
                    "IDMCTL_SLURM_MIN_JOB_AGE": "30"},
}
OFF_AND_ON = pytest.mark.parametrize("cluster_state", ["off", "on"], indirect=True)
"""The tests that run jobs or judge preemption: the two states whose jobs see the checkout."""
UP_S = 180  # up.sh's own waits: 30 s for each daemon and for the nodes


def _script(name: str, env: dict[str, str]) -> None:
    result = subprocess.run([str(REPO / "scripts" / "slurm" / name)], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=UP_S)
    assert result.returncode == 0, f"scripts/slurm/{name} → {result.returncode}: {result.stderr[-2000:]}"


@pytest.fixture(scope="module")
def own_root() -> Iterator[Path]:
    """The module's cluster root, held under a file lock; at the end its daemons stopped and its files removed.
    Bringing a cluster up needs Slurm's daemons and root (munge, slurmd): without them the module is skipped,
    in CI (``$CI`` set) it fails, as every Slurm test does (tests/slurm_support.py)."""
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "slurmdbd")
               if not (shutil.which(tool) or Path("/usr/sbin", tool).exists())]
    why = f"{', '.join(missing)} not installed (scripts/system_deps.sh)" if missing else (
        "" if os.geteuid() == 0 else "bringing a Slurm cluster up needs root")
    if why:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(why)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield ROOT
        finally:
            _script("down.sh", CLUSTER_ENV)
            shutil.rmtree(ROOT, ignore_errors=True)
            shutil.rmtree(f"/var/tmp/{ROOT.name}-job_container", ignore_errors=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def cluster_state(request: pytest.FixtureRequest, own_root: Path) -> Iterator[str]:
    """The cluster up with one state's settings; its jobs cancelled and its daemons stopped afterwards
    (job_container/tmpfs comes and goes only with a restart)."""
    name = request.param
    _script("up.sh", {**CLUSTER_ENV, **STATES[name]})
    try:
        yield name
    finally:
        subprocess.run(["scancel", "--user=root"], env={**os.environ, "SLURM_CONF": str(CONF)},
                       capture_output=True, timeout=30)
        _script("down.sh", CLUSTER_ENV)


@pytest.fixture
def state(cluster_state: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This test pointed at the module's cluster: SLURM_CONF, the local-slurm profile (whose slurm_cluster,
    idmctl, is this cluster's name too), and the qos check's cached cluster texts read afresh."""
    from idmctl.gate.cluster_settings import cluster_texts

    monkeypatch.setenv("SLURM_CONF", str(CONF))
    monkeypatch.setenv(ENV_CLUSTER, "local-slurm")
    cluster_texts.cache_clear()
    wanted = "(null)" if cluster_state == "off" else "preempt_send_user_signal"
    wait_until(lambda: f"SlurmctldParameters     = {wanted}" in sh("scontrol", "show", "config", check=False), 30,
               f"slurmctld of {ROOT} to report SlurmctldParameters = {wanted}")
    yield cluster_state
    cluster_texts.cache_clear()


def _doctor_row(cli) -> dict:
    result = cli("doctor", "--json", "--no-render")
    rows = {row["name"]: row for row in json.loads(result.output)["rows"]}
    return rows["cluster settings"]


@pytest.mark.parametrize("cluster_state", list(STATES), indirect=True)
def test_doctor_says_whether_a_preempted_job_hears_its_usr1(cli, state: str) -> None:
    row = _doctor_row(cli)
    detail = row["detail"]
    assert "GraceTime (qos sub) 60 s: a preempted job has that long to finish its step" in detail
    if state == "off":
        assert row["status"] == "WARN", row
        assert "preemption notice (WARN) no send_user_signal: a preempted job's tasks get TERM" in detail
        assert row["fix"] == ("ask the admins for SlurmctldParameters=preempt_send_user_signal (Slurm ≥ 23.02: "
                              "PreemptParameters=send_user_signal)")
        assert "MinJobAge 5.0 min" in detail
        assert "JobContainerType job_container/none: /tmp and /dev/shm are the node's" in detail
    else:
        assert row["status"] == "OK", row
        assert "preemption notice SlurmctldParameters=preempt_send_user_signal: the job's USR1 arrives" in detail
        assert "MinJobAge 30.0 s" in detail
        if state == "on":
            assert "JobContainerType job_container/none: /tmp and /dev/shm are the node's" in detail
        else:
            assert "JobContainerType job_container/tmpfs: each job has a private /tmp and /dev/shm" in detail


def _notice(**limits: float) -> tuple:
    """The qos check's verdict on QoS ``sub`` (local-slurm: preempt cycle 60 s) for a job of these figures."""
    from idmctl.core.profile import load_profile
    from idmctl.gate.qos import _preemption_notice

    profile, _ = load_profile("local-slurm")
    figures = SimpleNamespace(step_s=limits["step_s"], write_s=limits["write_s"],
                              time_limit=SimpleNamespace(effective=limits["time_limit_s"]))
    numbers: dict = {}
    status, text, fix = _preemption_notice(SimpleNamespace(qos="sub", partition=None), profile, figures,  # type: ignore[arg-type]
                                           600.0, 60.0, numbers)
    return status, text, fix, numbers


@OFF_AND_ON
def test_the_qos_check_fails_a_long_job_that_would_hear_only_term(state: str) -> None:
    from idmctl.core.checks import Status

    status, text, fix, numbers = _notice(step_s=0.5, write_s=1.5, time_limit_s=7200.0)
    assert numbers["preempt_grace_s"] == 60.0 and numbers["preempt_save_need_s"] == 2.0
    if state == "off":
        assert numbers["preempt_signalled"] is False
        assert status == Status.FAIL
        assert text == ("preemptible sub: a preemption here sends TERM, not the job's USR1 (no send_user_signal, "
                        "GraceTime 60 s (qos sub)): the trainer checkpoints, but the job script takes TERM for a "
                        "cancel and does not requeue, so the job ends FAILED 75 and the chain stops; time_limit "
                        "2.0 h > preempt cycle 60.0 s: expect a preemption before the job ends")
        assert fix == ("ask the admins for SlurmctldParameters=preempt_send_user_signal (Slurm ≥ 23.02: "
                       "PreemptParameters=send_user_signal), or use a non-preemptible QoS, or a time_limit ≤ 60.0 s")
    else:
        assert numbers["preempt_signalled"] is True
        assert status is None and text == ("a preemption sends its USR1 and leaves 60.0 s to save ≥ step 0.500 s + "
                                           "write 1.500 s = 2.000 s (SlurmctldParameters=preempt_send_user_signal, "
                                           "GraceTime 60 s (qos sub))")


@OFF_AND_ON
def test_the_gate_fails_the_quickstart_on_sub_only_where_preemption_sends_term(state: str) -> None:
    """The whole qos check, as preflight runs it, on the quickstart spec moved to ``sub``: its 30 min time
    limit is longer than the tier's 60 s preempt cycle, and nothing else in the check objects."""
    from ground.spec import load_spec
    from idmctl.core.checks import Measurements, PreflightContext, Status
    from idmctl.core.profile import load_profile
    from idmctl.gate import qos

    resolved = load_spec("quickstart")
    spec = resolved.spec.model_copy(update={"resources": resolved.spec.resources.model_copy(update={"qos": "sub"})})
    profile, _ = load_profile("local-slurm")
    result = qos.check(PreflightContext(type(resolved)(resolved.name, resolved.path, spec), profile, Measurements()))
    if state == "off":
        assert result.status == Status.FAIL, result
        assert result.summary.startswith("preemptible sub: a preemption here sends TERM, not the job's USR1 (no "
                                         "send_user_signal, GraceTime 60 s (qos sub))"), result.summary
        assert "; time_limit 30.0 min > preempt cycle 60.0 s: expect a preemption before the job ends; " in result.summary
        assert result.fix.endswith("or a time_limit ≤ 60.0 s")
    else:
        assert result.status == Status.PASS, result
        assert "a preemption sends its USR1 and leaves 60.0 s to save" in result.summary


@OFF_AND_ON
def test_a_job_within_one_cycle_keeps_a_warn_and_a_grace_shorter_than_the_save_warns_either_way(state: str) -> None:
    from idmctl.core.checks import Status

    status, text, _, _ = _notice(step_s=0.5, write_s=1.5, time_limit_s=50.0)
    if state == "off":
        assert status == Status.WARN and text.endswith("(time_limit 50.0 s ≤ preempt cycle 60.0 s: only if "
                                                       "preempted sooner than the cycle)")
    else:
        assert status is None
    # step 40 s + write 25 s = 65 s > the 60 s grace: killed mid-save, Slurm requeues, the periodic checkpoint holds
    status, text, fix, _ = _notice(step_s=40.0, write_s=25.0, time_limit_s=7200.0)
    assert status == Status.WARN and text.startswith("preemptible sub: no checkpoint on preemption here (")
    assert "GraceTime 60 s (qos sub) < step 40.0 s + write 25.0 s = 65.0 s)" in text
    assert "up to 10.0 min (half on average)" in text and fix.startswith("ask the admins for a GraceTime ≥ 195.0 s on sub")


def _sacct_run(job_id: str) -> tuple[str, str]:
    """(State, ExitCode) of the job's newest run (``-D``: a requeued job's earlier runs are rows too)."""
    rows = [line.split("|") for line in sh("sacct", "-n", "-P", "-X", "-D", "-j", job_id,
                                           "--format=State,ExitCode", check=False).split()]
    return (rows[-1][0], rows[-1][1]) if rows else ("", "")


@OFF_AND_ON
def test_a_preempted_job_hears_its_usr1_and_requeues_or_hears_term_and_ends_failed_75(cli, state: str,
                                                                                     monkeypatch) -> None:
    """A real idmctl job (the job script and its entry contract; tests.jobs_entry as the trainer) on ``sub``,
    preempted by a ``core-own`` job on its node: what its log, run directory and Slurm's record show."""
    from sqlmodel import select

    from idmctl.ops.failures.classify import classify
    from idmctl.record.db import session
    from idmctl.record.models import Chain, Job

    # Outside pytest's tree (jobs outlive asserts) and outside /tmp, which is private to each job when "on".
    home = Path(tempfile.mkdtemp(prefix="idmctl-settings-test-", dir="/var/tmp"))
    monkeypatch.setenv(ENV_HOME, str(home))
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:400:0.3")  # 120 s of steps: preempted long before the end
    try:
        result = cli("submit", "quickstart", "--force", "--reason", "cluster settings test", "--json",
                     "--entry", "tests.jobs_entry", "--qos", "sub", "-c", "2", "--mem", "500MB", "--exclude", "n2",
                     "-J", f"settings-{state}")
        assert result.exit_code == 0, result.output
        low = json.loads(result.stdout)
        job_id, run_dir = str(low["scheduler_id"]), Path(low["script"]).parent
        log = run_dir / f"slurm-{job_id}.out"
        ckpt = run_dir / "ckpt.json"
        wait_until(lambda: ckpt.exists() and json.loads(ckpt.read_text())["step"] >= 3, 120,
                   lambda: f"3 steps of sub job {job_id} (log: {text_so_far(log)[-600:]!r})")
        sh("sbatch", "--qos=core-own", "--nodelist=n1", "--cpus-per-task=2", "--mem=200M", "-J", "settings-preemptor",
           "-o", "/dev/null", "--wrap", "sleep 5")
        if state == "on":
            wait_until(lambda: "asked to be requeued" in text_so_far(log), 90,
                       lambda: f"job {job_id} to checkpoint and requeue itself (log: {text_so_far(log)[-800:]!r})")
            text = text_so_far(log)
            assert "idmctl: USR1 received, asking the trainer to checkpoint" in text, text
            wait_until(lambda: _sacct_run(job_id)[0] in ("REQUEUED", "PENDING", "RUNNING"), 60,
                       lambda: f"job {job_id} requeued (sacct: {_sacct_run(job_id)})")
        else:
            wait_until(lambda: _sacct_run(job_id)[0] == "FAILED", 90,
                       lambda: f"job {job_id} to end (sacct: {_sacct_run(job_id)}; log: {text_so_far(log)[-800:]!r})")
            text = text_so_far(log)
            assert "received" not in text, text  # the batch script heard no signal before the trainer ended
            assert f"idmctl: trainer exited {EXIT_REQUEUE}" in text, text
            assert _sacct_run(job_id) == ("FAILED", f"{EXIT_REQUEUE}:0")
            assert squeue_state(job_id) in ("", "FAILED"), "Slurm requeued the job after all"
            # What sync makes of it: no cause's rule knows this ending, and `unknown` stops the chain.
            found = classify("FAILED", exit_code=f"{EXIT_REQUEUE}:0", log_tail=text, started=True)
            assert found.cause == "unknown", (found.cause, text)
            synced = cli("sync")
            assert synced.exit_code == 0, synced.output
            with session() as db:
                chain = db.get(Chain, low["chain"])
                jobs = db.exec(select(Job).where(Job.chain_id == low["chain"])).all()
            assert chain is not None and chain.status == "FAILED" and len(jobs) == 1, (chain, synced.output)
        # Either way the entry checkpointed on the signal it got: the step it names is the one in ckpt.json.
        line = next(line for line in text.splitlines() if " on signal, exiting " in line)
        step = int(line.split("checkpointed at step ")[1].split()[0])
        assert step >= 3 and json.loads(ckpt.read_text())["step"] == step, (line, ckpt.read_text())
    finally:
        subprocess.run(["scancel", "--user=root"], capture_output=True, timeout=30)
        shutil.rmtree(home, ignore_errors=True)

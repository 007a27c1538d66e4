"""`idmctl failures` over card A's seven failed jobs as the store records them after `sync`.

The Slurm records and log lines are those the local cluster and torch print (see test_classify.py
and test_failure_replay.py, which produce them for real); here they are rows in a real store."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlmodel import select

from ground.paths import REPO_ROOT
from ground.tracking import TAG_FAILURE_CAUSE, TAG_SLURM_STATE
from idmctl.record import session
from idmctl.record.models import Chain, Failure, Fix, Job

T0 = datetime(2026, 11, 20, 9, 0, 0, tzinfo=timezone.utc)
# The checkout's own path: the classifier names project frames relative to it.
TYPEERROR_LOG = f"""\
staging /nas/cache → /tmp/idm_cache ... done
Traceback (most recent call last):
  File "{REPO_ROOT}/trainers/fit.py", line 41, in <module>
    main()
  File "{REPO_ROOT}/cache/registry.py", line 57, in build_dataset
    return cls(**kwargs)
           ^^^^^^^^^^^^^
TypeError: HiddenSingleLayerDataset.__init__() got an unexpected keyword argument 'selected_layer_indices'
"""
LOADER_LOG = f"""\
Traceback (most recent call last):
  File "{REPO_ROOT}/trainers/idm_training.py", line 283, in make_loader
    return DataLoader(dataset, num_workers=0, persistent_workers=True)
  File "{REPO_ROOT}/.venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 298, in __init__
    raise ValueError("persistent_workers option needs num_workers > 0")
ValueError: persistent_workers option needs num_workers > 0
"""
SHM_LOG = ("RuntimeError: unable to allocate shared memory(shm) for file </torch_8423_262588490_0>: "
           "No space left on device (28)\n")


def add_card_a_jobs() -> None:
    with session() as db:
        chain = Chain(experiment="latent_c_n12_dense", spec_hash="h12")
        db.add(chain)
        db.flush()
        common = {"experiment": "latent_c_n12_dense", "routing_n": 12}
        db.add(Job(scheduler_id="5961", state="CANCELLED by 0", exit_code="0:0", gpus=8, qos="core-extra",
                   submitted_at=T0, ended_at=T0 + timedelta(days=6), **common))
        for attempt, job_id in enumerate(["6054", "6108", "6158"], start=1):
            start = T0 + timedelta(days=6, hours=2 * attempt)
            db.add(Job(scheduler_id=job_id, chain_id=chain.id, attempt=attempt, state="PREEMPTED", exit_code="0:15",
                       gpus=4, qos="sub", submitted_at=start, started_at=start + timedelta(minutes=1),
                       ended_at=start + timedelta(hours=1), **common))
        db.add(Job(scheduler_id="5845", state="FAILED", exit_code="1:0", gpus=4, qos="sub", log_tail=SHM_LOG,
                   submitted_at=T0 - timedelta(days=1), started_at=T0 - timedelta(days=1),
                   ended_at=T0 - timedelta(days=1) + timedelta(hours=2), **common))
        db.add(Job(scheduler_id="6262", state="FAILED", exit_code="1:0", gpus=8, qos="core-own", log_tail=LOADER_LOG,
                   submitted_at=T0 + timedelta(days=7), started_at=T0 + timedelta(days=7),
                   ended_at=T0 + timedelta(days=7, hours=2), **common))
        db.add(Job(scheduler_id="6321", experiment="latent_c_n4", routing_n=4, state="FAILED", exit_code="1:0",
                   gpus=8, qos="core-own", log_tail=TYPEERROR_LOG, submitted_at=T0 + timedelta(days=8),
                   started_at=T0 + timedelta(days=8), ended_at=T0 + timedelta(days=8, hours=2)))
        db.add(Job(scheduler_id="6400", experiment="latent_c_n4", routing_n=4, state="COMPLETED", exit_code="0:0",
                   gpus=1, qos="core-own", submitted_at=T0 + timedelta(days=9), started_at=T0 + timedelta(days=9),
                   ended_at=T0 + timedelta(days=9, minutes=1)))


def test_failures_classifies_every_failed_job(cli, store_backend) -> None:
    add_card_a_jobs()
    result = cli("failures", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["job"]: row for row in json.loads(result.output)}
    assert {job: row["cause"] for job, row in rows.items()} == {
        "5845": "shm_enospc", "5961": "queue_cancelled", "6054": "preempted", "6108": "preempted",
        "6158": "preempted", "6262": "loader_config", "6321": "python_exception"}
    assert rows["5961"]["evidence"] == "cancelled after waiting 6.0 d in the queue, never started"
    assert rows["5961"]["detail"]["waited_seconds"] == 518400
    assert rows["6321"]["evidence"] == ("TypeError: HiddenSingleLayerDataset.__init__() got an unexpected keyword "
                                        "argument 'selected_layer_indices' at cache/registry.py:57")
    assert rows["6262"]["detail"]["frame"] == "trainers/idm_training.py:283"
    assert rows["6262"]["caught_by"] == "loader" and rows["5845"]["caught_by"] == "shm"
    assert rows["6321"]["caught_by"] == "introspection" and rows["6054"]["caught_by"] == "qos"
    assert rows["5961"]["setting"] == "8 GPU core-extra, N=12"


def test_one_fix_covers_three_preemptions_and_the_markdown_shows_it(cli, store_backend) -> None:
    add_card_a_jobs()
    result = cli("failures", "fix", "6054", "6108", "6158", "--note", "own/extra quota (sub does not fit long-stage jobs)",
                 "--commit", "0123456789abcdef")
    assert result.exit_code == 0, result.output
    assert result.output == ("fix 1 recorded for 6054, 6108, 6158: own/extra quota (sub does not fit long-stage jobs)"
                             " (commit 0123456789abcdef)\n")
    assert cli("failures", "fix", "6262", "--note", "persistent_workers=(num_workers > 0)").exit_code == 0
    markdown = cli("failures", "--markdown").output
    lines = markdown.splitlines()
    assert lines[2] == "| job | experiment | setting | cause | evidence | fix | caught now by |"
    assert ("| 6054, 6108, 6158 | latent_c_n12_dense | 4 GPU sub, N=12 | preempted ×3 | preempted after running "
            "59.0 min | own/extra quota (sub does not fit long-stage jobs) (0123456789ab) "
            "| qos |") in lines
    assert any(line.startswith("| 6262 | latent_c_n12_dense | 8 GPU core-own, N=12 | loader_config | ValueError: "
                               "persistent_workers option needs num_workers > 0 at trainers/idm_training.py:283 | "
                               "persistent_workers=(num_workers > 0) | loader |") for line in lines)
    assert "| 6321 | latent_c_n4 | 8 GPU core-own, N=4 | python_exception |" in markdown
    assert "open — suggested: fix the code at the innermost project frame shown" in markdown
    assert ("- fix 1: own/extra quota (sub does not fit long-stage jobs) (commit 0123456789abcdef) — covers "
            "6054, 6108, 6158") in lines
    assert lines[-1] == "7 failed jobs, 4 with a recorded fix, 3 open."


def test_filters(cli, store_backend) -> None:
    add_card_a_jobs()
    only_n4 = json.loads(cli("failures", "latent_c_n4", "--json").output)
    assert [row["job"] for row in only_n4] == ["6321"]
    preempted = json.loads(cli("failures", "--cause", "preempted", "--json").output)
    assert [row["job"] for row in preempted] == ["6054", "6108", "6158"]
    recent = json.loads(cli("failures", "--since", "2026-11-27", "--json").output)
    assert [row["job"] for row in recent] == ["6262", "6321"]
    table = cli("failures", "latent_c_n4").output
    assert "6321" in table and "python_exception" in table and "introspection" in table


@pytest.mark.parametrize("args, message", [
    (("failures", "fix", "9999", "--note", "x"), "error: JOB: no job 9999 in the store (run `idmctl sync`"),
    (("failures", "fix", "6400", "--note", "x"), "error: JOB: job 6400 is COMPLETED, not a failure"),
    (("failures", "fix", "6054", "--note", " "), "error: --note: the fix note is empty"),
    (("failures", "--cause", "gremlins"), "error: --cause: unknown cause 'gremlins' (one of: queue_cancelled,"),
    (("failures", "--since", "last tuesday"), "error: --since: not a date or a look-back: 'last tuesday'"),
])
def test_bad_input_is_one_line_and_writes_nothing(cli, args, message, store_backend) -> None:
    add_card_a_jobs()
    result = cli(*args)
    assert result.exit_code == 2
    assert result.output.startswith(message)
    assert len(result.output.strip().splitlines()) == 1
    with session() as db:
        assert db.exec(select(Fix)).all() == []


def test_reclassified_job_keeps_its_fix(cli, store_backend) -> None:
    add_card_a_jobs()
    assert cli("failures", "fix", "6321", "--note", "kwarg on the right class").exit_code == 0
    with session() as db:
        job = db.exec(select(Job).where(Job.scheduler_id == "6321")).one()
        job.log_tail = LOADER_LOG  # a later sync brought a longer log
        job.updated_at = datetime.now(timezone.utc)
        db.add(job)
    rows = json.loads(cli("failures", "latent_c_n4", "--json").output)
    assert rows[0]["cause"] == "loader_config" and rows[0]["fix"] == "kwarg on the right class"


def test_failed_run_is_marked_in_mlflow(cli, idmctl_home) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    experiment_id = client.create_experiment("idmctl")
    run = client.create_run(experiment_id)
    assert run.info.status == "RUNNING"
    with session() as db:
        chain = Chain(experiment="latent_c_n4", spec_hash="h4", mlflow_run_id=run.info.run_id)
        db.add(chain)
        db.flush()
        db.add(Job(scheduler_id="7001", chain_id=chain.id, experiment="latent_c_n4", state="PREEMPTED",
                   exit_code="0:15", started_at=T0, ended_at=T0 + timedelta(hours=1)))
        db.add(Job(scheduler_id="7002", experiment="latent_c_n4", state="FAILED", exit_code="1:0",
                   started_at=T0, ended_at=T0, log_tail=TYPEERROR_LOG))
    assert cli("failures").exit_code == 0
    marked = client.get_run(run.info.run_id)
    assert marked.info.status == "KILLED"
    assert marked.data.tags[TAG_FAILURE_CAUSE] == "preempted"
    assert marked.data.tags[TAG_SLURM_STATE] == "PREEMPTED"
    del mlflow


def test_a_requeued_job_counts_each_preempted_run(cli, store_backend) -> None:
    # What sync stores for a job Slurm requeued three times (sacct -D: one line per run).
    runs = [{"state": state, "exit_code": "0:15" if state != "CANCELLED by 0" else "0:0", "reason": None,
             "started_at": (T0 + timedelta(minutes=10 * i)).isoformat(),
             "ended_at": (T0 + timedelta(minutes=10 * i + 3)).isoformat(), "node_list": "n1"}
            for i, state in enumerate(["PREEMPTED", "REQUEUED", "PREEMPTED", "CANCELLED by 0"])]
    with session() as db:
        db.add(Job(scheduler_id="88", experiment="preemptible_sub_stage", state="CANCELLED by 0", exit_code="0:0",
                   restarts=3, gpus=2, qos="sub", routing_n=4, submitted_at=T0, started_at=T0 + timedelta(minutes=30),
                   ended_at=T0 + timedelta(minutes=33), runs=runs))
    rows = json.loads(cli("failures", "--json").output)
    assert [(row["job"], row["cause"]) for row in rows] == [
        ("88 run 1", "preempted"), ("88 run 2", "preempted"), ("88 run 3", "preempted"), ("88 run 4", "cancelled")]
    assert rows[0]["evidence"] == "preempted after running 3.0 min"
    assert rows[2]["evidence"] == "preempted after running 3.0 min, requeued 2×"
    assert cli("failures", "fix", "88", "--note", "core-own for long stage-in").exit_code == 0
    markdown = cli("failures", "--markdown").output
    assert "| 88 run 1, 88 run 2, 88 run 3 | preemptible_sub_stage | 2 GPU sub, N=4 | preempted ×3 |" in markdown


def test_table_shows_the_most_recent_rows_and_says_how_many_are_left(cli):
    add_card_a_jobs()
    full = cli("failures", "--limit", "0")
    assert full.exit_code == 0 and "showing the" not in full.output
    cut = cli("failures", "--limit", "2")
    assert cut.exit_code == 0
    footer = [line for line in cut.output.splitlines() if line.startswith("showing the 2 most recent rows of ")]
    assert footer, cut.output
    assert "6321" in cut.output and "5845" not in cut.output  # 5845 ended first, 6321 last
    assert len(json.loads(cli("failures", "--json", "--limit", "2").output)) >= 7  # JSON is never cut


def test_fast_table_read_matches_the_orm_rows_and_steps_aside_for_unclassified_jobs(cli, idmctl_home):
    from idmctl.ops.failures.postmortem import table
    from idmctl.record.store import store
    from idmctl.ops.failures.rows import read_table_rows
    from idmctl.record.failures import HEAD_REVISION
    from ground.paths import db_path
    from idmctl.record.db import HEAD_REVISION as STORE_HEAD

    assert HEAD_REVISION == STORE_HEAD
    add_card_a_jobs()
    assert read_table_rows(db_path(), None, None, 50) is None  # unclassified failures: the ORM path must run
    assert cli("failures").exit_code == 0  # classifies them
    since = T0 + timedelta(days=6, hours=4)  # after 5961 and 6054 ended, before 6108
    for experiment, cause, newest, after in [(None, None, 50, None), (None, None, 2, None),
                                             ("latent_c_n12_dense", "preempted", 50, None), (None, None, None, None),
                                             (None, None, None, since), (None, "preempted", None, since)]:
        fast_rows, fast_total = read_table_rows(db_path(), experiment, cause, newest, after)
        orm_rows, orm_total = table(store(), experiment=experiment, cause=cause, newest=newest, since=after)
        assert [r.as_json() for r in fast_rows] == [r.as_json() for r in orm_rows]
        assert fast_total == orm_total
    assert [row.job for row in read_table_rows(db_path(), None, None, None, since)[0]] == ["6108", "6158", "6262", "6321"]


def test_json_and_markdown_take_the_fast_path_and_print_what_the_orm_rows_give(cli):
    """`failures --json/--markdown/--since` read with sqlite3 (no ORM import) once every failure is
    classified, and print exactly what the ORM rows would."""
    import subprocess
    import sys

    from idmctl.ops.failures.postmortem import postmortem_rows
    from idmctl.ops.failures.report import markdown
    from idmctl.record.store import store

    add_card_a_jobs()
    assert cli("failures").exit_code == 0  # the ORM path classifies them once
    orm_rows = postmortem_rows(store())
    recent = postmortem_rows(store(), since=datetime(2026, 11, 26, 12))
    fast_json = cli("failures", "--json")
    assert fast_json.exit_code == 0
    assert fast_json.output.startswith("[\n{") and fast_json.output.count("\n") == len(orm_rows) + 2
    assert json.loads(fast_json.output) == json.loads(json.dumps([r.as_json() for r in orm_rows], default=str))
    assert cli("failures", "--markdown").output == markdown(orm_rows)
    since = cli("failures", "--json", "--since", "2026-11-26T12:00:00")
    assert [row["job"] for row in json.loads(since.output)] == [r.job for r in recent] and recent
    probe = ("import sys; from typer.testing import CliRunner; from idmctl.cli.app import app; "
             "r = CliRunner().invoke(app, sys.argv[1:]); assert r.exit_code == 0, r.output; "
             "print(sorted(m for m in ('sqlalchemy', 'sqlmodel', 'mlflow') if m in sys.modules))")
    for args in (["failures", "--json"], ["failures", "--markdown"], ["failures", "--since", "30d"]):
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True,
                              cwd=REPO_ROOT, timeout=120)
        assert done.stdout.strip().splitlines()[-1:] == ["[]"], (args, done.stdout[-500:], done.stderr[-2000:])


# `failures explain LOG`: a log from the failure corpus (gpu_net-056: the BigScience tr1-13B logbook, quoted
# there with its source and licence), classified as sync would.
def _corpus_log(case_id: str) -> str:
    import yaml

    for path in sorted((REPO_ROOT / "tests/idmctl/ops/failure_corpus").glob("*.yaml")):
        for case in yaml.safe_load(path.read_text(encoding="utf-8"))["cases"]:
            if case["id"] == case_id:
                return case["log"]
    raise AssertionError(case_id)


ECC_FIX = ("nothing in the job; sync leaves the node out and resumes from the checkpoint. Tell the admins the node "
           "and the Xid or ECC line in the evidence (the GPU needs a reset, a row remap or an RMA)")
ECC_SYNC = ("exclude_node_and_resume: exclude the job's node for 24.0 h, then resubmit and resume from the chain's "
            "checkpoint; at most 3× for gpu_hardware in one chain, then stop")


def test_explain_prints_cause_evidence_fix_and_what_sync_would_do(cli, tmp_path) -> None:
    log = tmp_path / "slurm-4411.out"
    log.write_text(_corpus_log("gpu_net-056"))
    result = cli("failures", "explain", str(log), "--state", "NODE_FAIL", "--exit-code", "0:0")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "cause:     gpu_hardware (refines node_fail)\n"
        "headline:  RuntimeError: transform: failed to synchronize: cudaErrorECCUncorrectable: uncorrectable ECC "
        "error encountered at /gpfsssd/worksf/projects/rech/six/commun/code/tr1-13B/DeepSpeed-big-science/deepspeed/"
        "runtime/pipe/engine.py:679\n"
        "evidence:\n"
        "  Slurm: State=NODE_FAIL ExitCode=0:0\n"
        "  RuntimeError: transform: failed to synchronize: cudaErrorECCUncorrectable: uncorrectable ECC error encountered\n"
        "  what():  CUDA error: uncorrectable ECC error encountered\n"
        f"fix:       {ECC_FIX}\n"
        f"sync:      {ECC_SYNC}\n"
        "caught by: none\n")
    as_json = json.loads(cli("failures", "explain", str(log), "--json").stdout)
    assert as_json == {
        "cause": "gpu_hardware", "refines": "node_fail", "caught_by": "none", "fix": ECC_FIX, "action": "exclude_node_and_resume",
        "sync_would": ECC_SYNC, "headline": as_json["headline"],
        "evidence": ["Slurm: State=FAILED",
                     "RuntimeError: transform: failed to synchronize: cudaErrorECCUncorrectable: uncorrectable ECC error encountered",
                     "what():  CUDA error: uncorrectable ECC error encountered"]}


@pytest.mark.parametrize("args,error", [
    (("missing.log",), "error: {tmp}/missing.log: no such file (name an existing log file; `idmctl jobs show JOB` prints a job's)"),
    (("binary.log",), "error: {tmp}/binary.log: is a binary file, not a log (it holds NUL bytes) (name the job's text log, "
                      "its stdout/stderr file)"),
    (("job.log", "--state", "EXPLODED"), "error: --state: 'EXPLODED' is not a state Slurm prints (as sacct shows it: "
                                         "FAILED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY…)"),
    (("job.log", "--exit-code", "1"), "error: --exit-code: '1' is not an exit code Slurm prints (code:signal as sacct "
                                      "shows it, e.g. 1:0 or 0:9)"),
    (("job.log", "--exit-code", "1:300"), "error: --exit-code: '1:300' is not an exit code Slurm prints (code:signal as "
                                          "sacct shows it, e.g. 1:0 or 0:9)"),
])
def test_explain_refuses_bad_input_in_one_line(cli, tmp_path, args: tuple[str, ...], error: str) -> None:
    (tmp_path / "job.log").write_text("Traceback (most recent call last):\nKeyError: 'x'\n")
    (tmp_path / "binary.log").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" * 10)
    result = cli("failures", "explain", str(tmp_path / args[0]), *args[1:])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [error.format(tmp=tmp_path)]


def test_explain_reads_a_huge_log_by_its_tail(cli, tmp_path) -> None:
    """A 1 GB log (sparse: its middle is a hole) and one 10 MB line of \\r progress bars with ANSI colours and
    bytes that are not UTF-8: one seek and 64 kB read each, classified by what the tail says."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    huge = tmp_path / "huge.log"
    with open(huge, "wb") as handle:
        handle.write(b"step 1 loss 2.0\n" * 1000)
        handle.truncate(1 << 30)
        handle.seek(0, 2)
        handle.write(b"step 9000 loss 0.3\n" * 1000 + oom.encode() + b"\n")
    bars = tmp_path / "bars.log"
    bars.write_bytes(b"\x1b[32m" + b" 42%|####      | 42/100\r" * 420_000 + b"\xff\xfe 43%\r\x1b[31m" + oom.encode() + b"\x1b[0m\n")
    assert bars.stat().st_size > 10_000_000
    for log in (huge, bars):
        result = cli("failures", "explain", str(log), "--json")
        assert result.exit_code == 0, result.output
        found = json.loads(result.stdout)
        assert (found["cause"], found["evidence"][-1]) == ("oom_cuda", oom)


def test_caught_now_by_is_judged_from_the_failing_step(cli, store_backend) -> None:
    """The card's TypeError (caught_by: introspection) raised before any step, at step 2 and at step 40,000:
    introspection, the smoke of 3 steps, and no check (said so)."""
    steps = {"6501": [], "6502": [0, 1], "6503": [39_998, 39_999]}
    with session() as db:
        for job_id, reported in steps.items():
            log = "".join(f"IDMCTL_STEP step={s} loss=0.5000 seconds=0.200\n" for s in reported) + TYPEERROR_LOG
            db.add(Job(scheduler_id=job_id, experiment="latent_c_n4", routing_n=4, state="FAILED", exit_code="1:0",
                       log_tail=log, submitted_at=T0, started_at=T0, ended_at=T0 + timedelta(minutes=1)))
    rows = {row["job"]: row for row in json.loads(cli("failures", "--json").stdout)}
    assert {job: (rows[job]["cause"], rows[job]["caught_by"]) for job in steps} == {
        "6501": ("python_exception", "introspection"),
        "6502": ("python_exception", "smoke (failed at step 2, within its 3 steps)"),
        "6503": ("python_exception", "none (failed at step 40,000, past the smoke's 3 steps)")}

"""Slurm's output as every release prints it: idmctl's readers on recorded outputs of real clusters
(fixtures/*.out, each named in fixtures/SOURCES.yaml with its project, Slurm release and licence) and on
what each release's own source says it prints (fixtures/releases/*.json, SchedMD/slurm 20.11 to 25.11).

The fake tools of slurm_replay only replay: every line they print was printed by a real Slurm. Nothing
here needs the local cluster; the recordings of it were made once (SOURCES.yaml says when).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from idmctl.core.job_state import UNFINISHED, JobState, is_terminal
from idmctl.ops.executors import preempt_mode, slurm
from idmctl.ops.executors.slurm import (SACCT_FIELDS, SQUEUE_FORMAT, USAGE_FIELDS, SlurmExecutor, parse_sacct,
                                        parse_squeue)
from idmctl.ops.executors.slurm_read import parse_time, sacct_time
from idmctl.ops.failures import importer
from idmctl.plan.efficiency import report
from slurm_replay import FIXTURES, project, recording, shim, sources

RELEASES = sorted(FIXTURES.glob("releases/*.json"))
UTC = timezone.utc


def at(text: str) -> datetime:
    """A time as the recording printed it (recorded with TZ=UTC, read here with TZ=UTC)."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.fixture(autouse=True)
def utc_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Read as the recordings were printed: TZ=UTC (sacct prints and reads the local time of its process)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "idmctl" and r.levelno == logging.WARNING]


# --- the recordings are what they say they are ---------------------------------------------------------

def test_every_recording_names_its_source_release_and_licence() -> None:
    entries = sources()
    files = {p.name for p in FIXTURES.glob("*.out")}
    assert files == set(entries), "a recording without its SOURCES.yaml entry, or an entry without its file"
    for name, meta in entries.items():
        assert meta.get("project") and meta.get("slurm") and meta.get("licence") and meta.get("command"), name
    releases = {json.loads(p.read_text())["release"] for p in RELEASES}
    assert releases == {"20.11", "21.08", "22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11"}


# --- sacct, as sync reads it ---------------------------------------------------------------------------

def test_requeue_history_from_sacct_D_with_every_run() -> None:
    _, text = recording("local-22.05-sacct-requeue.out")
    found = parse_sacct(text)
    job = found["21"]  # preempted by the suite's QoS test, then completed
    assert [r.state for r in job.runs] == ["REQUEUED", "COMPLETED"] and job.restarts == 1
    assert job.state == "COMPLETED" and job.exit_code == "0:0" and job.reason == "BeginTime"
    assert job.runs[0].reason is None  # sacct printed the word None: no reason
    assert job.runs[0].started_at == at("2026-12-07T20:52:51") and job.submitted_at == at("2026-12-07T20:52:50")
    assert job.runs[0].steps[1] == ("21.0", "CANCELLED by 0", "0:9")
    assert (found["52"].restarts, found["52"].state) == (2, "COMPLETED")
    looping = found["76"]  # requeued four times by its own script, then completed
    assert looping.restarts == 4 and looping.state == "COMPLETED"
    assert looping.runs[0].started_at is None  # a REQUEUED run printed Start=None on node n1
    assert looping.runs[1].started_at == at("2026-12-07T20:57:35")


def test_a_job_that_never_ran_has_no_start_whatever_start_says() -> None:
    _, text = recording("local-22.05-sacct-requeue.out")
    found = parse_sacct(text)
    held = found["100"]  # 22.05 printed Start = End = 20:58:53 for a job cancelled while held
    assert held.state == "CANCELLED by 0" and JobState.of(held.state) is JobState.CANCELLED
    assert held.started_at is None and held.node_list is None and held.ended_at == at("2026-12-07T20:58:53")
    assert held.reason == "JobHeldUser"
    for component in ("107+0", "107+1"):  # a heterogeneous job: each component its own record
        assert found[component].state == "CANCELLED by 0" and found[component].started_at is None


def test_arrays_and_steps_as_their_own_records() -> None:
    _, text = recording("local-22.05-sacct-array.out")
    found = parse_sacct(text)
    assert set(found) == {"99", "101_1", "101_2", "101_3"}
    task = found["101_2"]
    assert task.state == "COMPLETED" and task.runs[0].steps == [("101_2.batch", "COMPLETED", "0:0")]
    assert task.runs[0].usage["ReqMem"] == "100M" and task.runs[0].usage["Timelimit"] == "UNLIMITED"


@pytest.mark.parametrize(("name", "states"), [
    ("vcell-23.11-sacct-terminal-states.out", {"2699101": "TIMEOUT", "2699102": "OUT_OF_MEMORY",
                                               "2699103": "NODE_FAIL", "2699104": "FAILED"}),
    ("vcell-23.11-sacct-cancelled-by-user.out", {"2699001": "CANCELLED by 54321"}),
])
def test_23_11_states_are_recorded_as_printed_and_final(name: str, states: dict[str, str]) -> None:
    found = parse_sacct(project(name, SACCT_FIELDS, "|"))
    assert {k: v.state for k, v in found.items()} == states
    assert all(is_terminal(v.state) for v in found.values())
    if "2699001" in found:
        assert found["2699001"].runs[0].steps == [("2699001.batch", "CANCELLED", ""), ("2699001.extern", "COMPLETED", "")]
        assert found["2699001"].started_at is None  # no NodeList in the recording: not known, not guessed


def test_reused_id_is_matched_by_submit_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Della recycled ids: ``sacct -j 12728301`` answered for a 2017 job while a new one ran."""
    fake = shim(tmp_path, monkeypatch)
    fake.answer("sacct", project("blackfish-sacct-reused-id.out", SACCT_FIELDS + USAGE_FIELDS, "|"))
    fake.answer("squeue", "")
    ours = datetime(2026, 8, 21, 14, 0, tzinfo=UTC)
    assert SlurmExecutor().status(["12728301"], {"12728301": ours}) == {}  # the 2017 job is not ours: kept as it was
    sacct_call = fake.calls("sacct")[0]["argv"]
    assert sacct_call[sacct_call.index("-S") + 1] == "2026-08-21T13:50:00"  # window opened at our submit − SKEW
    assert fake.calls("squeue"), "the id sacct does not know is asked of squeue"
    # Without the store's submit time (the old reader) the 2017 record was taken for the job:
    assert SlurmExecutor().status(["12728301"])["12728301"].state == "COMPLETED"


def test_the_requeued_run_is_current_whatever_order_sacct_prints(tmp_path: Path) -> None:
    """sacct -X printed the first run's PREEMPTED after the requeued run completed (MFlowCode/MFC#1311):
    the same recorded lines, run lines in the order that thread saw them."""
    _, text = recording("local-22.05-sacct-requeue.out")
    lines = [line for line in text.splitlines() if line.split("|")[0] == "21"]
    found = parse_sacct("\n".join(reversed(lines)) + "\n")
    assert found["21"].state == "COMPLETED" and [r.state for r in found["21"].runs] == ["REQUEUED", "COMPLETED"]


# --- squeue, sbatch, scontrol, sacctmgr -----------------------------------------------------------------

def test_squeue_live_view_is_never_final() -> None:
    _, text = recording("local-22.05-squeue.out")
    found = parse_squeue(text)
    assert set(found) == {"99", "100", "101_1", "101_2", "101_3", "107+0", "107+1"}
    assert not any(s.confirmed for s in found.values())
    assert found["100"].started_at is None and found["100"].node_list is None  # StartTime printed, never ran
    assert found["99"].node_list == "n1" and found["99"].reason is None  # %r None: no reason
    assert found["107+0"].reason == "Resources"


def test_sbatch_parsable_as_every_release_prints_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = shim(tmp_path, monkeypatch)
    _, text = recording("local-22.05-sbatch-parsable.out")
    fake.answer("sbatch", text)
    assert SlurmExecutor().submit(tmp_path / "job.sbatch", "log") == "99"
    for path in RELEASES:  # every release: printf("%u") then printf(";%s") on a federated cluster
        facts = json.loads(path.read_text())
        assert facts["sbatch_parsable_printf"] == ["%u", ";%s", "\\n"], facts["release"]
    fake.answer("sbatch", "4242;cluster2\n")  # what that printf gives with a working cluster record
    assert SlurmExecutor().submit(tmp_path / "job.sbatch", "log") == "4242"


def test_preempt_mode_from_scontrol_and_sacctmgr() -> None:
    _, config = recording("local-22.05-scontrol-show-config.out")
    _, partitions = recording("local-22.05-scontrol-show-partition.out")
    _, qos = recording("local-22.05-sacctmgr-qos-sub.out")
    assert preempt_mode.mode_for(config, qos.strip(), partitions) == preempt_mode.REQUEUE
    assert preempt_mode.mode_for(config, "cluster", partitions) == preempt_mode.REQUEUE  # the cluster's PreemptMode
    for path in RELEASES:
        facts = json.loads(path.read_text())
        assert facts["scontrol_config_keys"] == ["PreemptMode", "PreemptType"], facts["release"]
        assert facts["sacctmgr_qos_preempt_mode"], facts["release"]


# --- jobs import ----------------------------------------------------------------------------------------

def test_import_reads_names_with_a_pipe_and_a_newline() -> None:
    _, text = recording("local-22.05-sacct-import.out")
    jobs = {job.scheduler_id: job for job in importer.parse_history(text)}
    assert set(jobs) == {"99", "100", "101_1", "101_2", "101_3", "107+0", "107+1"}
    assert jobs["99"].name == "drift|pipe\nnewline" and jobs["99"].state == "COMPLETED"
    assert jobs["100"].started_at is None and jobs["100"].reason == "JobHeldUser"
    assert jobs["99"].reason is None and jobs["99"].qos == "core-own"
    # No line of this answer shows gres/gpu and nothing says the cluster counts it: unknown, not 0.
    assert {job.gpus for job in jobs.values()} == {None}


def test_a_gpu_count_missing_from_alloctres_is_zero_only_where_the_cluster_counts_gpus() -> None:
    _, config = recording("local-22.05-scontrol-show-config.out")
    assert "gres/gpu" in next(line for line in config.splitlines() if line.startswith("AccountingStorageTRES"))
    _, text = recording("local-22.05-sacct-import-gpu.out")
    assert {j.scheduler_id: j.gpus for j in importer.parse_history(text, counted=True)} == {"99": 0, "143": 1}
    assert {j.scheduler_id: j.gpus for j in importer.parse_history(text, counted=False)} == {"99": None, "143": 1}
    _, cpu_only = recording("local-22.05-sacct-import.out")
    assert {j.gpus for j in importer.parse_history(cpu_only, counted=True)} == {0, None}  # 100, 107: no AllocTRES at all


def test_import_windows_are_local_time_west_of_greenwich(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    since = datetime(2026, 12, 7, 15, 0)  # naive UTC, as parse_since gives it
    args = importer.history_args(since, datetime(2026, 12, 8, 15, 0, tzinfo=UTC))
    assert args[args.index("-S") + 1] == "2026-12-07T10:00:00" and args[args.index("-E") + 1] == "2026-12-08T10:00:00"
    assert sacct_time(since) == "2026-12-07T10:00:00"  # the old reader sent 15:00: five hours of jobs missed
    assert parse_time("2026-12-07T10:00:00") == datetime(2026, 12, 7, 15, 0, tzinfo=UTC)


def test_times_with_a_zone_unknown_and_none() -> None:
    assert parse_time("2026-12-07T10:00:00+01:00") == datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    assert parse_time("2026-12-07T10:00:00Z") == datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
    assert [parse_time(w) for w in ("Unknown", "None", "NONE", "N/A", "")] == [None] * 5


# --- efficiency: ReqMem is the job's total --------------------------------------------------------------

def _run_of(name: str, fields: tuple[str, ...] = ("JobID", "State", *USAGE_FIELDS)) -> dict:
    rows = [line.split("|") for line in project(name, fields, "|").splitlines()]
    run: dict = {"state": rows[0][1], "usage": dict(zip(fields[2:], rows[0][2:])), "step_usage": {}}
    for row in rows[1:]:
        run["step_usage"][row[0]] = dict(zip(fields[2:], row[2:]))
    return run


def test_reqmem_per_node_suffix_is_multiplied_out_over_20_nodes() -> None:
    found = report("6196869", _run_of("reportseff-pre21.08-sacct-multinode.out"), {}, None)
    assert found.nodes == 20 and found.req_mem_bytes == 20 * 191846 * 2**20
    # peak per node 33824748 KiB × 20 nodes ÷ (20 × 191846 MiB)
    assert found.mem_eff == pytest.approx(33824748 * 2**10 * 20 / (20 * 191846 * 2**20))
    assert "× 20 nodes ÷ ReqMem 3.7 TiB" in "\n".join(found.lines())


def test_reqmem_per_cpu_suffix_is_multiplied_by_the_cpus() -> None:
    text = project("reportseff-pre21.08-sacct-cancelled.out", ("JobID", "State", *USAGE_FIELDS), "|")
    usage = dict(zip(USAGE_FIELDS, text.strip().split("|")[2:]))
    assert usage["ReqMem"] == "4000Mc" and usage["AllocCPUS"] == "16"
    found = report("23000233", {"state": "CANCELLED by 129319", "usage": usage}, {}, None)
    assert found.req_mem_bytes == 16 * 4000 * 2**20  # the old reader took 4000 MiB


def test_reqmem_without_suffix_is_the_total() -> None:
    found = report("131042", _run_of("reportseff-21.08plus-sacct-multitask.out"), {}, None)
    assert found.req_mem_bytes == 16000 * 2**20
    assert found.mem_eff == pytest.approx(1947276 * 2**10 * 8 / (16000 * 2**20))  # step .0: 8 tasks on 1 node


# --- what every release prints (SchedMD/slurm source at each release tag) -------------------------------

@pytest.mark.parametrize("path", RELEASES, ids=[p.stem for p in RELEASES])
def test_every_release_knows_what_idmctl_asks_and_prints_states_idmctl_knows(path: Path) -> None:
    facts = json.loads(path.read_text())
    asked = set(SACCT_FIELDS + USAGE_FIELDS + importer.IMPORT_FIELDS)
    assert asked <= set(facts["sacct_fields"]), asked - set(facts["sacct_fields"])  # else "Invalid field requested"
    assert not {"Reserved", "Planned"} & asked  # renamed in 23.02: queue wait is Start − Submit instead
    for word in facts["job_states"]:
        state = JobState.of(word)
        assert state is not None, f"{facts['release']} prints {word}, which idmctl does not know"
        flag = facts["job_states"].index(word) < facts["job_states"].index("PENDING")
        assert (state in UNFINISHED) == (flag or word in ("PENDING", "RUNNING", "SUSPENDED")) or word == "REVOKED"
    assert facts["cancelled_by_uid"] and JobState.of("CANCELLED by 54321") is JobState.CANCELLED
    letters = {c for c, present in facts["squeue_letters"].items() if present}
    assert letters == {part[1] for part in SQUEUE_FORMAT.split("|")}


def test_the_reserved_to_planned_rename_is_where_the_changelog_says() -> None:
    by_release = {json.loads(p.read_text())["release"]: json.loads(p.read_text())["sacct_fields"] for p in RELEASES}
    assert "Reserved" in by_release["22.05"] and "Planned" not in by_release["22.05"]
    assert "Planned" in by_release["23.02"] and "Reserved" not in by_release["23.02"]
    assert [r for r, f in by_release.items() if "Planned" in f] == ["23.02", "23.11", "24.05", "24.11", "25.05", "25.11"]


def test_idmctl_reads_no_json() -> None:
    """squeue/sacct --json change shape by data_parser version (24.05.1: ``nodes`` became a structure and
    ``allocated_nodes`` moved to ``nodes.allocation``, clemsonciti/jobperf#4); idmctl reads the text forms,
    whose columns it names itself, and never asks for JSON."""
    root = Path(slurm.__file__).parent.parent
    for path in [Path(slurm.__file__), Path(importer.__file__), Path(preempt_mode.__file__)]:
        assert '"--json"' not in path.read_text() and "'--json'" not in path.read_text(), path.relative_to(root)


# --- bad input: one warning naming the command and the field, the job kept as it was --------------------

def test_an_unknown_state_a_truncated_line_and_epoch_times_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="idmctl")
    _, text = recording("local-22.05-sacct-array.out")
    first = text.splitlines()[0]
    truncated = first[:first.index("|2026-12-07T20:58:53")]  # the line cut inside Start
    unknown = first.replace("|COMPLETED|", "|PLANNED_FOR_LATER|").replace("99|", "98|", 1)
    found = parse_sacct(f"{truncated}\n{unknown}\n")
    assert found == {}  # neither job is recorded from what could not be read
    said = warnings_of(caplog)
    assert said == ["warning: sacct: 1 line with an unreadable State (first: 'PLANNED_FOR_LATER'); those jobs are kept as they were",
                    f"warning: sacct: 1 line with an unreadable field count (first: {truncated!r}); those jobs are kept as they were"]
    caplog.clear()
    epoch = project("slurm-mail-sacct-epoch-times.out", SACCT_FIELDS + USAGE_FIELDS, "|")
    assert parse_sacct(epoch) == {}
    assert warnings_of(caplog) == [
        "warning: sacct: 1 line with an unreadable End (first: '1652870160'); those jobs are kept as they were",
        "warning: sacct: 1 line with an unreadable Start (first: '1652870039'); those jobs are kept as they were"]


def test_slurm_time_format_of_the_user_is_overridden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = shim(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_TIME_FORMAT", "%s")  # as slurm-mail's environment had it
    _, text = recording("local-22.05-sacct-array.out")
    fake.answer("sacct", text)
    assert SlurmExecutor().status(["99"])["99"].state == "COMPLETED"
    assert {c["SLURM_TIME_FORMAT"] for c in fake.calls()} == {"standard"}


def test_an_empty_answer_keeps_the_job_and_asks_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = shim(tmp_path, monkeypatch)
    meta, text = recording("vcell-23.11-sacct-no-matching-jobs.out")
    fake.answer("sacct", project("vcell-23.11-sacct-no-matching-jobs.out", SACCT_FIELDS + USAGE_FIELDS, "|"))
    fake.answer("squeue", "")
    assert text.strip() == "JobID|JobName|State" and SlurmExecutor().status(["2699001"]) == {}
    assert len(fake.calls("squeue")) == 1


def test_a_usage_field_a_release_refuses_is_dropped_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="idmctl")
    fake = shim(tmp_path, monkeypatch)
    _, text = recording("local-22.05-sacct-array.out")
    states_only = "".join("|".join(line.split("|")[:len(SACCT_FIELDS)]) + "\n" for line in text.splitlines())
    (fake.base / "sacct.json").write_text(json.dumps([
        {"stdout": "", "rc": 1, "stderr": 'sacct: error: Invalid field requested: "MaxRSS"\n'},
        {"stdout": states_only, "rc": 0}]))
    assert SlurmExecutor().status(["99"])["99"].state == "COMPLETED"
    assert [c["argv"][-1] for c in fake.calls("sacct")] == [f"--format={','.join(SACCT_FIELDS + USAGE_FIELDS)}",
                                                            f"--format={','.join(SACCT_FIELDS)}"]
    assert len(warnings_of(caplog)) == 1 and "MaxRSS" in warnings_of(caplog)[0]


# --- "gone" only after two reads apart in time ----------------------------------------------------------

PREEMPTED = "57|PREEMPTED|0:0||2026-11-30T02:00:00|2026-11-30T02:00:05|2026-11-30T02:00:30|n1\n"
"""A line sacct printed on the local 22.05.8 cluster for a preempted job (tests/idmctl/ops/test_sacct_parse.py)."""


@pytest.mark.parametrize(("squeue_answers", "rc", "state", "confirmed", "reads"), [
    (["", ""], 0, "PREEMPTED", True, 2),              # twice absent, 0.05 s apart: gone
    (["", "57|PENDING|BeginTime|2026-11-30T02:00:31|N/A|N/A|\n"], 0, "PENDING", True, 2),  # back after a transient empty read
    (["57|PENDING|BeginTime|2026-11-30T02:00:31|N/A|N/A|\n"], 0, "PENDING", True, 1),  # requeued: held back at once
    ([""], 1, "PREEMPTED", False, 1),                 # squeue failed: no evidence, the job is not final
])
def test_gone_only_after_two_reads_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squeue_answers: list[str],
                                         rc: int, state: str, confirmed: bool, reads: int) -> None:
    fake = shim(tmp_path, monkeypatch)
    monkeypatch.setattr(slurm, "GONE_RECHECK_S", 0.05)
    fake.answer("sacct", PREEMPTED)
    fake.answer("squeue", *squeue_answers, rc=rc, stderr="squeue: error: slurm_load_jobs error: Socket timed out\n" if rc else "")
    found = SlurmExecutor().status(["57"])["57"]
    assert (found.state, found.confirmed) == (state, confirmed)
    assert len(fake.calls("squeue")) == reads


# --- big histories: windows, a record cap, a deadline ---------------------------------------------------

def test_a_window_over_the_record_cap_is_halved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = shim(tmp_path, monkeypatch)
    _, text = recording("local-22.05-sacct-import.out")
    monkeypatch.setattr(importer, "MAX_LINES_PER_CALL", 5)
    monkeypatch.setattr(importer, "WINDOW", importer.timedelta(days=4))
    many, few = text * 2, text  # 16 lines, then 8: over the cap of 5, then still over, ...
    fake.answer("sacct", many, few, "")
    since = datetime(2026, 12, 1, tzinfo=UTC)
    windows = list(importer.history_windows(since, datetime(2026, 12, 9, tzinfo=UTC)))
    spans = [(c["argv"][c["argv"].index("-S") + 1], c["argv"][c["argv"].index("-E") + 1]) for c in fake.calls("sacct")]
    assert spans[:3] == [("2026-12-01T00:00:00", "2026-12-05T00:00:00"), ("2026-12-01T00:00:00", "2026-12-03T00:00:00"),
                         ("2026-12-01T00:00:00", "2026-12-02T00:00:00")]
    assert windows[-1][1] == datetime(2026, 12, 9, tzinfo=UTC) and all(w[0] == "" for w in windows)


@pytest.mark.parametrize("name", ["drift|pipe\nnewline", "a|b", "two\nlines"])
def test_a_name_sacct_could_not_delimit_is_refused_at_submit_in_one_line(name: str) -> None:
    """idmctl's own jobs never carry a ``|`` or a newline to sacct (the recorded job 99 was a plain sbatch)."""
    from ground.errors import UserError
    from idmctl.job.render import check_name

    with pytest.raises(UserError) as refused:
        check_name(name, "resources.job_name", "experiments/x.yaml")
    assert "\n" not in str(refused.value).replace(repr(name), "") and refused.value.field == "resources.job_name"


def test_sync_never_ends_a_job_on_an_empty_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the real store: sacct and squeue both answer nothing (a slurmdbd still catching up, a controller
    restarting): the job stays exactly as it was, sync after sync; the recorded answer then ends it."""
    from sqlmodel import select

    from idmctl.ops.sync import sync
    from idmctl.record.db import session
    from idmctl.record.models import Job

    fake = shim(tmp_path, monkeypatch)
    with session() as db:
        db.add(Job(experiment="drift", executor="slurm", scheduler_id="99", state="RUNNING",
                   submitted_at=at("2026-12-07T20:58:52"), node_list="n1"))
    fake.answer("sacct", "")
    fake.answer("squeue", "")
    for _ in range(2):
        report = sync(retry=False)
        assert report.finished == [] and report.checked == 0
        with session() as db:
            job = db.exec(select(Job)).one()
            assert (job.state, job.ended_at, job.exit_code) == ("RUNNING", None, None)
    _, text = recording("local-22.05-sacct-array.out")
    fake.answer("sacct", text)
    assert len(sync(retry=False).finished) == 1
    with session() as db:
        job = db.exec(select(Job)).one()
        assert (job.state, job.exit_code, job.ended_at) == ("COMPLETED", "0:0", at("2026-12-07T20:58:55"))

"""The cluster's own settings judged: real ``scontrol show config`` outputs of three releases
(tests/data/scontrol_config/README.md names each source), and the live local cluster through doctor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from idmctl.gate.cluster_settings import OK, WARN, judge, parse_config, parse_grace_times, signal_on_preemption

DATA = Path(__file__).resolve().parents[2] / "data" / "scontrol_config"
LOCAL = (DATA / "22.05.8-local.txt").read_text()
LOCAL_QOS = (DATA / "22.05.8-local-qos.txt").read_text()


def _by_setting(findings):  # type: ignore[no-untyped-def]
    return {f.setting: f for f in findings}


def test_the_local_22_05_cluster_signals_preemption_and_its_sub_grace_is_too_short_for_a_checkpoint() -> None:
    findings = _by_setting(judge(LOCAL, LOCAL_QOS))
    assert findings["PreemptType"].status == OK
    assert findings["PreemptType"].meaning.startswith("preempt/qos, PreemptMode=REQUEUE: a preempted job is requeued")
    assert findings["preemption notice"].status == OK
    assert "SlurmctldParameters=preempt_send_user_signal" in findings["preemption notice"].meaning
    # scripts/slurm/up.sh: QoS sub (preempted by core-own and core-extra) has GraceTime=10
    grace = findings["GraceTime (qos sub)"]
    assert grace.status == WARN and grace.meaning.startswith("10 s < idmctl's smallest signal lead 60 s")
    assert not any(name.startswith("GraceTime (qos core-own") for name in findings)  # nothing preempts core-own
    assert findings["MinJobAge"].meaning.startswith("5.0 min")
    assert findings["JobContainerType"].meaning.startswith("job_container/none: /tmp and /dev/shm are the node's")
    assert findings["ScronParameters"].meaning.startswith("not enable")


@pytest.mark.parametrize("name, version", [("23.02.7-vantage-agent.txt", "23.02.7"),
                                           ("25.11.4-docker-notes.txt", "25.11.4")])
def test_a_cluster_without_preemption_says_so_in_every_release(name: str, version: str) -> None:
    text = (DATA / name).read_text()
    assert parse_config(text)["SLURM_VERSION"] == version
    findings = _by_setting(judge(text))
    # 23.02 prints preempt/none, 25.11 prints (null): both mean no preemption
    assert findings["PreemptType"].meaning == "preempt/none: no job is ever preempted here"
    assert "preemption notice" not in findings
    assert all(f.status == OK for f in findings.values()), findings


def test_without_send_user_signal_preemption_is_a_term_and_the_fix_names_both_spellings() -> None:
    off = LOCAL.replace("preempt_send_user_signal", "(null)")
    assert signal_on_preemption(parse_config(off)) is None
    notice = _by_setting(judge(off, LOCAL_QOS))["preemption notice"]
    assert notice.status == WARN and "tasks get TERM, not its USR1, at the start of GraceTime" in notice.meaning
    assert "PreemptParameters=send_user_signal" in notice.fix and "preempt_send_user_signal" in notice.fix
    newer = off.replace("PreemptExemptTime", "PreemptParameters       = send_user_signal\nPreemptExemptTime")
    assert signal_on_preemption(parse_config(newer)) == "PreemptParameters=send_user_signal"


def test_a_zero_grace_means_no_checkpoint_on_preemption_and_partition_graces_are_read_too() -> None:
    qos = LOCAL_QOS.replace("sub||00:00:10", "sub||00:00:00")
    grace = _by_setting(judge(LOCAL, qos))["GraceTime (qos sub)"]
    assert grace.status == WARN and "no checkpoint on preemption" in grace.meaning
    partitions = ("PartitionName=sub AllowGroups=ALL PriorityTier=1 GraceTime=300 PreemptMode=REQUEUE State=UP\n"
                  "PartitionName=core-own AllowGroups=ALL PriorityTier=10 GraceTime=0 PreemptMode=OFF State=UP\n")
    assert parse_grace_times("", partitions) == {"partition sub": 300.0}
    by_partition = LOCAL.replace("preempt/qos", "preempt/partition_prio")
    findings = _by_setting(judge(by_partition, LOCAL_QOS, partitions))
    assert findings["GraceTime (partition sub)"].status == OK
    assert "GraceTime (qos sub)" not in findings  # under partition_prio the QoS grace is not the one that acts


def test_a_private_tmp_per_job_is_named_with_its_restage_cost() -> None:
    tmpfs = LOCAL.replace("job_container/none", "job_container/tmpfs")
    container = _by_setting(judge(tmpfs, LOCAL_QOS))["JobContainerType"]
    assert container.meaning.startswith("job_container/tmpfs: each job has a private /tmp and /dev/shm")
    assert "copied again on every attempt" in container.meaning


@pytest.mark.cluster_reader
def test_doctor_reads_the_live_cluster_settings(cli, local_slurm: str) -> None:
    result = cli("doctor", "--json", "--no-render")
    rows = {row["name"]: row for row in json.loads(result.output)["rows"]}
    row = rows["cluster settings"]
    assert row["status"] == WARN, row  # QoS sub's 10 s grace (scripts/slurm/up.sh)
    assert "GraceTime (qos sub) (WARN) 10 s" in row["detail"]
    assert "preempt_send_user_signal" in row["detail"]
    assert row["fix"] == "ask for a GraceTime ≥ 60 s on this tier"


@pytest.mark.cluster_reader
def test_the_qos_check_weighs_the_save_against_the_tiers_grace_on_the_live_cluster(local_slurm: str) -> None:
    from types import SimpleNamespace

    from idmctl.core.checks import Status
    from idmctl.core.profile import load_profile
    from idmctl.gate.cluster_settings import cluster_texts
    from idmctl.gate.qos import _preemption_notice

    cluster_texts.cache_clear()  # another module of this process may have read another cluster
    profile, _ = load_profile("local-slurm")
    res = SimpleNamespace(qos="sub", partition=None)
    numbers: dict = {}
    # QoS sub: USR1 at preemption (preempt_send_user_signal), GraceTime 10 s (scripts/slurm/up.sh)
    quick = SimpleNamespace(step_s=0.5, write_s=1.5)
    status, note, _ = _preemption_notice(res, profile, quick, 60.0, 60.0, numbers)  # type: ignore[arg-type]
    assert status is None and note.startswith("a preemption sends its USR1 and leaves 10.0 s to save ≥ step 0.500 s + write")
    assert numbers["preempt_signalled"] is True and numbers["preempt_grace_s"] == 10.0
    slow = SimpleNamespace(step_s=8.0, write_s=5.0)
    status, warn, fix = _preemption_notice(res, profile, slow, 3600.0, 60.0, numbers)  # type: ignore[arg-type]
    assert status == Status.WARN
    assert warn.startswith("preemptible sub: no checkpoint on preemption here (SlurmctldParameters="
                           "preempt_send_user_signal, GraceTime 10 s (qos sub) < step 8.000 s + write 5.000 s = 13.0 s)")
    assert "up to 60.0 min (half on average)" in warn and "GraceTime ≥ 39.0 s on sub" in fix
    card, _ = load_profile("card")  # another cluster's profile: this host's Slurm says nothing about it
    assert _preemption_notice(res, card, slow, 3600.0, 60.0, {})[1].startswith("preemption notice not read")


@pytest.mark.parametrize("signal, grace, time_limit_s, verdict", [
    ("(null)", "00:01:00", 7200.0, "FAIL"),  # TERM only, a 2 h job on a 60 s cycle: its first preemption ends it
    ("(null)", "00:01:00", 50.0, "WARN"),  # the same within one cycle: only if preempted sooner
    ("(null)", "00:00:00", 7200.0, "WARN"),  # no grace: killed at once and requeued by Slurm, signal or not
    ("preempt_send_user_signal", "00:01:00", 7200.0, None),  # USR1 with 60 s ≥ the 2 s save: a note
])
def test_the_qos_verdict_on_the_local_clusters_recorded_settings(monkeypatch: pytest.MonkeyPatch, signal: str,
                                                                  grace: str, time_limit_s: float, verdict) -> None:
    """The qos check's preemption verdict from the recorded 22.05.8 texts, with the knobs scripts/slurm/up.sh
    turns (22.05 prints ``SlurmctldParameters = (null)`` without preempt_send_user_signal, as
    test_cluster_settings_live.py's off cluster does); the live module judges the same on real clusters."""
    from types import SimpleNamespace

    from idmctl.core.checks import Status
    from idmctl.core.profile import load_profile
    from idmctl.gate import cluster_settings, qos

    texts = (LOCAL.replace("preempt_send_user_signal", signal), LOCAL_QOS.replace("sub||00:00:10", f"sub||{grace}"), "")
    monkeypatch.setattr(cluster_settings, "cluster_texts", lambda: texts)
    monkeypatch.setattr(qos, "read_cluster_texts", lambda: texts)
    profile, _ = load_profile("local-slurm")  # sub: preempt cycle 0:01:00
    figures = SimpleNamespace(step_s=0.5, write_s=1.5, time_limit=SimpleNamespace(effective=time_limit_s))
    numbers: dict = {}
    status, text, fix = qos._preemption_notice(SimpleNamespace(qos="sub", partition=None), profile,  # type: ignore[arg-type]
                                               figures, 60.0, 60.0, numbers)
    assert (status.value if status else None) == verdict, text
    assert numbers["preempt_signalled"] is (signal != "(null)")
    if verdict == "FAIL":
        assert text.endswith("; time_limit 2.0 h > preempt cycle 60.0 s: expect a preemption before the job ends")
        assert "ends FAILED 75 and the chain stops" in text and fix.endswith("or a time_limit ≤ 60.0 s")
    elif status == Status.WARN and grace == "00:00:00":
        assert text.startswith("preemptible sub: no checkpoint on preemption here (no send_user_signal, GraceTime 0 s")

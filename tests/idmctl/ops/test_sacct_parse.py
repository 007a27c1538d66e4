"""Parsing sacct's --parsable2 output, on lines copied from the local Slurm 22.05 cluster."""

from __future__ import annotations

from idmctl.ops.executors.slurm import parse_sacct


def test_job_cancelled_while_pending_never_started():
    # sacct gives Start = End for a pending job that was cancelled; only the node list tells.
    text = "178|CANCELLED by 0|0:0||2026-11-30T02:20:47|2026-11-30T02:22:47|2026-11-30T02:22:47|None assigned\n"
    status = parse_sacct(text)["178"]
    assert status.state == "CANCELLED by 0"
    assert status.started_at is None and status.node_list is None
    assert status.ended_at is not None and status.submitted_at is not None


def test_requeued_job_keeps_every_run_and_counts_restarts():
    text = "\n".join([
        "57|PREEMPTED|0:0||2026-11-30T02:00:00|2026-11-30T02:00:05|2026-11-30T02:00:30|n1",
        "57.batch|CANCELLED|0:15||2026-11-30T02:00:05|2026-11-30T02:00:05|2026-11-30T02:00:30|n1",
        "57|COMPLETED|0:0||2026-11-30T02:00:00|2026-11-30T02:01:00|2026-11-30T02:02:00|n2",
    ]) + "\n"
    status = parse_sacct(text)["57"]
    assert [run.state for run in status.runs] == ["PREEMPTED", "COMPLETED"]
    assert status.restarts == 1 and status.state == "COMPLETED" and status.node_list == "n2"
    assert status.runs[0].steps == [("57.batch", "CANCELLED", "0:15")]

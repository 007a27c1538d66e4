"""The efficiency report per job: sacct's figures parsed from lines copied from the local
Slurm 22.05 cluster, then a real trainer job whose report sync writes, `jobs show` prints, MLflow keeps
and the next submit of the experiment turns into --mem/--time suggestions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ground import contract, tracking
from ground.trainer_stats import RunStats
from idmctl.ops.executors.slurm import parse_sacct
from idmctl.plan.efficiency import report, slurm_bytes, slurm_seconds
from slurm_support import wait_until

# Job 117 of the local cluster (a 2-rank CPU trainer): the allocation line, its batch step and step 0.
SACCT_117 = "\n".join([
    "117|COMPLETED|0:0|None|2026-11-30T09:00:00|2026-11-30T09:00:02|2026-11-30T09:00:30|n1|00:00:28|00:10.677|2|"
    "1500M||00:10:00||1",
    "117.batch|COMPLETED|0:0||2026-11-30T09:00:02|2026-11-30T09:00:02|2026-11-30T09:00:30|n1|00:00:28|00:00.017|2|"
    "|4032K||1|1",
    "117.0|COMPLETED|0:0||2026-11-30T09:00:03|2026-11-30T09:00:03|2026-11-30T09:00:30|n1|00:00:27|00:10.660|2|"
    "|360112K||2|1",
]) + "\n"


def test_sacct_units_are_slurms() -> None:
    assert slurm_bytes("2862M") == 2862 * 2**20 and slurm_bytes("360112K") == 360112 * 1024
    assert slurm_bytes("4000Mn") == 4000 * 2**20 and slurm_bytes("") is None
    assert slurm_seconds("00:10.677") == pytest.approx(10.677)
    assert slurm_seconds("01:02:03") == 3723 and slurm_seconds("1-00:00:01") == 86401
    assert slurm_seconds("UNLIMITED") is None


def test_report_from_sacct_and_the_trainer() -> None:
    run = parse_sacct(SACCT_117)["117"].runs[-1]
    run_record = {"state": run.state, "usage": run.usage, "step_usage": run.step_usage}
    trainer = RunStats(steps=40, step_s=20.0, data_wait_s=1.5, peak_mem_bytes=350_000_000, device="cpu")
    found = report("117", run_record, {"ranks_per_node": 2, "cpus_per_node": 2}, trainer)
    assert found.cpu_eff == pytest.approx(10.677 / (28 * 2))
    assert found.peak_rss_bytes == 360112 * 1024 * 2  # one task's MaxRSS × 2 tasks on the node
    assert found.mem_eff == pytest.approx(360112 * 1024 * 2 / (1500 * 2**20))
    assert found.time_frac == pytest.approx(28 / 600)
    assert found.data_wait_frac == pytest.approx(0.075)
    lines = found.lines()
    assert lines[0] == "CPU efficiency 19%: TotalCPU 10.7 s ÷ (Elapsed 28 s × 2 CPUs)"
    assert lines[1] == "memory efficiency 47%: peak 703.3 MiB (MaxRSS of 117.0 351.7 MiB × 2 task/node) ÷ ReqMem 1.5 GiB"
    assert lines[2] == "time used 5%: Elapsed 28.0 s of the 10.0 min limit"
    assert lines[3] == "data wait 7.5% of step time over 40 steps (trainer)"
    flags = {s.flag: s.value for s in found.suggestions}
    # 703.3 MiB × 1.25 = 879 MiB → 896 MiB (64 MiB steps); 28 s × 1.5 → at least 5 min; -c stays ≥ 2 ranks.
    assert flags == {"--mem": "896MiB", "--time": "0-00:05:00"}


@pytest.mark.slow
@pytest.mark.slurm
def test_a_real_job_gets_its_report_and_the_next_submit_its_suggestions(
        cli, tmp_path: Path, local_slurm: str) -> None:
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri
    from test_failure_replay import replay_spec, submit

    spec = replay_spec(tmp_path, "shm_overflow", loader={"num_workers": 0}, train={"steps": 6, "log_every": 2},
                       resources={"mem": "1500MB", "time_limit": "0:10:00"})
    job = submit(cli, spec)

    def ended() -> bool:
        assert cli("sync").exit_code == 0
        shown = json.loads(cli("jobs", "show", str(job["job"]), "--json").stdout)
        return shown["efficiency"] is not None

    wait_until(ended, 180, "the trainer job to end and its report to be written", poll_s=3.0)
    shown = cli("jobs", "show", str(job["job"]))
    assert shown.exit_code == 0, shown.output
    print(shown.output)  # the report in the test log, as the closing note quotes it
    text = shown.output
    assert f"job {job['job']} (slurm {job['scheduler_id']})" in text and "COMPLETED" in text
    assert "CPU efficiency " in text and "÷ (Elapsed " in text
    # --mem 1500MB is Slurm's 1500M = 1500 MiB = 1.46 GiB. A step of ~25 s ends before sacct's first 30 s
    # sample: the trainer's VmHWM stands in.
    assert "memory efficiency " in text and "÷ ReqMem 1.5 GiB" in text
    assert "of the 10.0 min limit" in text
    assert "data wait " in text and "over 6 steps (trainer)" in text
    assert "peak host RSS of rank 0 " in text
    assert "suggest --time 0-00:05:00: completed in " in text
    assert "suggest --mem " in text and "asked 1.5 GiB" in text

    data = json.loads(cli("jobs", "show", str(job["job"]), "--json").stdout)["efficiency"]
    run_id = (Path(job["script"]).parent / contract.MLFLOW_RUN_ID_FILE).read_text().strip()
    run = MlflowClient(tracking_uri=mlflow_tracking_uri()).get_run(run_id)
    assert run.data.metrics[tracking.M_JOB_CPU_EFF] == pytest.approx(data["cpu_eff"])
    assert run.data.metrics[tracking.M_JOB_TIME_FRAC] == pytest.approx(data["time_frac"])
    assert "CPU efficiency" in run.data.tags[f"{tracking.TAG_EFFICIENCY}.attempt-1"]

    # The next submit of the experiment says what to ask for instead; a flag already taken is not repeated.
    again = cli("submit", str(spec), "--force", "--reason", "efficiency follow-up", "--time", "0:05:00")
    assert again.exit_code == 0, again.output
    print(again.output)
    assert f"from the efficiency report of job {job['scheduler_id']}" in again.output
    assert "suggest --mem " in again.output and "suggest --time" not in again.output
    new_job = next(line.split()[2] for line in again.output.splitlines() if line.startswith("submitted job"))
    assert cli("cancel", new_job).exit_code == 0


def test_jobs_show_of_an_unknown_job_is_one_line(cli) -> None:
    result = cli("jobs", "show", "999")
    assert result.exit_code == 2
    assert result.output.strip() == "error: JOB: no job 999 (see `idmctl jobs`)"

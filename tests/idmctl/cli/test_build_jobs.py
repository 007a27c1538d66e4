"""Cache builds as jobs: ``idmctl preflight|submit EXP --build hidden|rgb|pt|ff``.

The gate and bad input run in-process; a real full tmpfs gives a real ENOSPC; the rest runs on the
real local Slurm cluster (scripts/slurm/up.sh): RGB ‖ PT as two jobs of 2 ranks on n1's and n2's GPUs
at once then FF, a 2-rank build over both nodes against the same build in one process,
a build on `sub` preempted by a `core-own` job and resumed skipping its finished files, and a build
with missing weights that fails with its classified cause. Every build is the real builder with the
tiny seeded Wan VAE on CPU.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ground.tracking import TAG_BUILD

REPO = Path(__file__).resolve().parents[3]


def write_spec(home: Path, name: str, *, demos: int = 3, steps: int = 9, extra: str = "") -> Path:
    """A latent spec over scene episodes of ``demos × steps`` under ``home`` (32×32, 2 cameras)."""
    from cache.latent.scenes import write_scene_episodes

    episodes = home / name / "demos.hdf5"
    write_scene_episodes(episodes, demos=demos, steps=steps)
    path = home / f"{name}.yaml"
    path.write_text(f"extends: latent_rgbpt_smoke\ndata:\n  episodes: {episodes}\n"
                    f"latent:\n  cache_root: {home / name}\n{extra}")
    return path


def files_in(directory: Path) -> dict[str, int]:
    """Complete cache files → mtime_ns (a file re-encoded gets a new one)."""
    if not directory.is_dir():
        return {}
    return {p.name: p.stat().st_mtime_ns for p in directory.glob("*.safetensors") if not p.name.startswith(".")}


def slot_dir(spec: Path, slot: str) -> Path:
    from cache.build_plan import plan
    from ground.spec import load_spec

    return plan(load_spec(str(spec)), slot).output_dir


# -- in-process: the gate, bad input, a real ENOSPC --------------------------------------------------

@pytest.mark.slow
def test_build_submit_needs_a_passing_build_preflight(cli, idmctl_home: Path) -> None:
    spec = write_spec(idmctl_home, "gate")
    refused = cli("submit", str(spec), "--build", "rgb")
    assert refused.exit_code == 1
    assert "idmctl preflight gate --cluster local --build rgb" in refused.stderr
    training = cli("preflight", str(spec), "--no-smoke", "--json")  # a training preflight does not unlock a build
    assert json.loads(training.stdout)["smoke_flags"] == {}
    ff = cli("preflight", str(spec), "--build", "ff", "--json")
    assert ff.exit_code == 1
    checks = {c["name"]: c for c in json.loads(ff.stdout)["checks"]}
    assert checks["build_norm"]["status"] == "FAIL" and "pt_norm_missing" in checks["build_norm"]["summary"]
    assert checks["build_smoke"]["status"] == "SKIP"
    rgb = cli("preflight", str(spec), "--build", "rgb", "--json")
    assert rgb.exit_code == 0, rgb.output + rgb.stderr
    report = json.loads(rgb.stdout)
    assert report["unlocks_submit"] and report["smoke_flags"] == {"--build": "rgb"}
    checks = {c["name"]: c for c in report["checks"]}
    assert [c["name"] for c in report["checks"]] == ["build_weights", "build_norm", "build_disk", "build_smoke"]
    smoke = checks["build_smoke"]["numbers"]
    assert smoke["todo"] == 9 and smoke["processes"] == 1 and smoke["bytes_per_file"] > 0
    assert smoke["estimate_s"] == pytest.approx(smoke["load_s"] + 9 * smoke["encode_s"])
    assert checks["build_disk"]["numbers"]["need_bytes"] == 9 * smoke["bytes_per_file"]
    assert files_in(slot_dir(spec, "rgb")) == {}  # the smoke encodes into a scratch dir, never the cache
    planned = cli("submit", str(spec), "--build", "rgb", "--dry-run")
    assert planned.exit_code == 0, planned.stderr
    assert "submit-time checks pass" in planned.stderr
    assert "#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=2\n" in planned.stdout
    assert "#SBATCH --job-name=gate-build-rgb\n" in planned.stdout
    assert '-m trainers.build_job --run-dir "$RUN_DIR" --mode rgb --processes 1 &' in planned.stdout
    # Sized by the smoke's arithmetic: memory peak × ranks × 1.25, time limit the estimate ÷ 0.8 (whole minutes,
    # at least 10), both from this preflight's build_smoke.
    peak, estimate = smoke["peak_rss_bytes"], smoke["estimate_s"]
    mem_g = math.ceil(peak * 1 * 1.25 / 2**30)
    minutes = math.ceil(max(600.0, estimate / 0.8) / 60)
    assert f"#SBATCH --mem={mem_g}G\n" in planned.stdout
    assert f"#SBATCH --time=0-{minutes // 60:02d}:{minutes % 60:02d}:00\n" in planned.stdout
    derivation = next(line for line in planned.stdout.splitlines() if line.startswith("# idmctl: build job:"))
    assert re.fullmatch(rf"# idmctl: build job: memory peak .+ × 1 ranks × 1\.25 = .+ → {mem_g}G \(build smoke of "
                        rf"preflight #{report['run_id']}\); time limit \(load .+ s \+ ⌈9 files ÷ 1 process\(es\)⌉ × "
                        rf".+ s/file = .+\) ÷ 0\.8, at least 10\.0 min → 0-\d\d:\d\d:00 \(build smoke of preflight #{report['run_id']}\)",
                        derivation), derivation
    # The smoke's measurement, re-judged at submit against the effective --mem: the tiny VAE's process
    # peaks at hundreds of MB, so 100 MB is refused (oom_host), naming the arithmetic.
    small = cli("submit", str(spec), "--build", "rgb", "--mem", "100MB", "--json")
    assert small.exit_code == 1, small.stdout + small.stderr
    refused = json.loads(small.stdout)
    assert refused["failed"] == ["build_smoke"]
    assert "out of memory (oom_host)" in next(c["summary"] for c in refused["checks"] if c["name"] == "build_smoke")


@pytest.mark.parametrize(("args", "field"), [
    (["--build", "bogus"], "--build"),
    (["--build", "rgb", "--entry", "tests.jobs_entry"], "--entry"),
])
def test_bad_build_flags_are_one_line_errors(cli, idmctl_home: Path, args: list[str], field: str) -> None:
    spec = write_spec(idmctl_home, "bad")
    result = cli("submit", str(spec), *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: command line:{field}: ") and result.stderr.count("\n") == 1


def test_latent_build_of_a_spec_without_latent_section_is_bad_input(cli) -> None:
    result = cli("preflight", "quickstart", "--build", "pt")
    assert result.exit_code == 2
    assert ":latent: --build pt needs a latent section" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.slow
def test_real_enospc_prints_the_disk_full_marker_and_classifies(idmctl_home: Path) -> None:
    """The latent builder on an 8 KiB tmpfs (2 pages; 9 files of 1.3 kB need 9) (its own mount namespace): the kernel's ENOSPC, not a quote."""
    from idmctl.ops.failures.classify import classify

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to mount a private tmpfs")
    spec = write_spec(idmctl_home, "full")
    (idmctl_home / "full" / "cache").mkdir()
    script = (f"mount -t tmpfs -o size=8k tmpfs {idmctl_home / 'full' / 'cache'} && "
              f"exec {sys.executable} -m trainers.build_latent_cache --spec {spec} --mode rgb --no-progress")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    if "mount" in done.stderr and done.returncode == 32:
        pytest.skip(f"cannot mount tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 1, done.stderr[-2000:]
    assert re.search(r"^IDMCTL_FAILURE cause=disk_full path=\S+: No space left on device$", done.stderr, re.M)
    assert classify("FAILED", exit_code="1:0", log_tail=done.stderr, started=True).cause == "disk_full"


# -- on the real local Slurm cluster --------------------------------------------------------------

def _submit(cli, spec: Path, *args: str) -> dict:
    result = cli("submit", str(spec), "--force", "--reason", "build job test", "--json", *args)
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _until_final(cli, job_id: int, timeout_s: float = 180):
    from idmctl.core.job_state import is_terminal
    from idmctl.record.db import session
    from idmctl.record.models import Job
    from slurm_support import wait_until

    def ended():
        with session() as db:
            job = db.get(Job, job_id)
        if job is not None and job.scheduler_id and _queued(job.scheduler_id):
            return None  # the scheduler still has it: a sync (in-process, but squeue + sacct + the store) would change nothing
        assert cli("sync").exit_code == 0
        with session() as db:
            job = db.get(Job, job_id)
        return job if job is not None and is_terminal(job.state) else None

    return wait_until(ended, timeout_s, f"build job {job_id} to end (synced once Slurm no longer lists it)", poll_s=1.0)


def _queued(scheduler_id: str) -> bool:
    """Whether Slurm still lists the job as pending or running (squeue lists unfinished jobs only)."""
    from slurm_support import sh

    return bool(sh("squeue", "-h", "-j", scheduler_id, "-o", "%T", check=False).strip())


def _build_metrics(run_dir: Path) -> tuple[dict[str, str], dict[str, list[tuple[int, float]]]]:
    """The build chain's MLflow run: tags and each build metric's (attempt, value) history."""
    from mlflow.tracking import MlflowClient

    from ground.contract import MLFLOW_RUN_ID_FILE
    from ground.paths import mlflow_tracking_uri

    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    run = client.get_run(run_id)
    history = {key: sorted((int(m.step), float(m.value)) for m in client.get_metric_history(run_id, key))
               for key in run.data.metrics}
    return dict(run.data.tags), history


def _rank_reports(log: Path) -> list[dict]:
    """The builder ranks' lines in a build job's log: which rank ran where, on which device."""
    return sorted((json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"rank_of_build"')),
                  key=lambda row: row["rank_of_build"])


@pytest.mark.slurm
@pytest.mark.slow
def test_rgb_and_pt_build_at_once_on_disjoint_gpu_sets_then_ff_reencodes_no_rgb(cli, slurm_home: Path) -> None:
    spec = write_spec(slurm_home, "par", demos=3, steps=13)
    # `share` preempts nobody: other sessions' `sub` jobs on this cluster are left alone. Each build asks
    # for a node's 2 (fake) GPUs: 2 srun tasks, one builder rank each (on the CPU: CUDA does not work here).
    rgb = _submit(cli, spec, "--build", "rgb", "--qos", "share", "--exclude", "n2", "--mem", "3000MB", "--gres", "gpu:2")
    pt = _submit(cli, spec, "--build", "pt", "--qos", "share", "--exclude", "n1", "--mem", "3000MB", "--gres", "gpu:2")
    script = Path(rgb["script"]).read_text()
    assert "#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n" in script and "--processes 2 &" in script
    rgb_job, pt_job = _until_final(cli, rgb["job"]), _until_final(cli, pt["job"])
    assert (rgb_job.state, pt_job.state) == ("COMPLETED", "COMPLETED"), (rgb_job.log_tail, pt_job.log_tail)
    assert (rgb_job.node_list, pt_job.node_list) == ("n1", "n2")
    for submitted, node in ((rgb, "n1"), (pt, "n2")):
        ranks = _rank_reports(Path(submitted["log"]))
        # Both ranks ran, each a task of one srun step on the build's node, each its own local rank.
        assert [(r["rank_of_build"], r["world"], r["local_rank"], r["launcher"], r["node"], r["device"])
                for r in ranks] == [(0, 2, 0, "srun", node, "cpu"), (1, 2, 1, "srun", node, "cpu")], ranks
        assert sum(r["encoded"] for r in ranks) == 15 and all(r["encoded"] > 0 for r in ranks)
    overlap = min(rgb_job.ended_at, pt_job.ended_at) - max(rgb_job.started_at, pt_job.started_at)
    assert overlap.total_seconds() > 0, "the two builds did not run at the same time"
    rgb_files = files_in(slot_dir(spec, "rgb"))
    pt_dir = slot_dir(spec, "pt")
    assert len(rgb_files) == len(files_in(pt_dir)) == 15 and pt_dir.name.startswith("5x32x32_pt__")
    for submitted, mode in ((rgb, "rgb"), (pt, "pt")):
        tags, metrics = _build_metrics(Path(submitted["script"]).parent)
        assert tags[TAG_BUILD] == mode
        assert metrics["build_files_built"] == [(1, 15.0)] and metrics["build_bytes_written"][0][1] > 0
        assert metrics["build_files_per_s"][0][1] > 0
    # Card B's order: FF after PT (its directory is named by PT's hash); it must not touch RGB.
    ff = _submit(cli, spec, "--build", "ff", "--qos", "share", "--mem", "1500MB")
    assert _until_final(cli, ff["job"]).state == "COMPLETED"
    assert len(files_in(slot_dir(spec, "ff"))) == 15
    assert files_in(slot_dir(spec, "rgb")) == rgb_files  # 0 RGB files re-encoded
    listed = json.loads(cli("jobs", "--json").stdout)
    assert sorted(row["build"] for row in listed) == ["ff", "pt", "rgb"]


@pytest.mark.slurm
@pytest.mark.slow
def test_two_rank_build_over_two_nodes_writes_the_one_rank_files(cli, slurm_home: Path) -> None:
    from trainers.build_latent_cache import build

    spec = write_spec(slurm_home, "wide", demos=3, steps=13, extra="resources:\n  nodes: 2\n  cpus: 1\n")
    job = _submit(cli, spec, "--build", "rgb", "--qos", "share", "--mem", "1500MB")
    script = Path(job["script"]).read_text()
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=1\n" in script
    ended = _until_final(cli, job["job"])
    assert ended.state == "COMPLETED" and ended.node_list == "n[1-2]", ended.log_tail
    ranks = _rank_reports(Path(job["log"]))
    assert [(r["rank_of_build"], r["world"], r["node"], r["threads"]) for r in ranks] == [
        (0, 2, "n1", 1), (1, 2, "n2", 1)], ranks
    two = {name: (slot_dir(spec, "rgb") / name).read_bytes() for name in files_in(slot_dir(spec, "rgb"))}
    assert len(two) == 15
    # The same build in one process here, into another root: the same files, bit for bit.
    reference = write_spec(slurm_home, "narrow", demos=3, steps=13)
    one = build(str(reference), "rgb", progress=False)
    assert one["slots"]["rgb"]["encoded"] == 15
    assert {name: (slot_dir(reference, "rgb") / name).read_bytes() for name in files_in(slot_dir(reference, "rgb"))} == two


@pytest.mark.slurm
@pytest.mark.slow
def test_build_preempted_on_sub_resumes_skipping_finished_files(cli, slurm_home: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_support import release_requeued, sh, text_so_far, wait_until

    # 8 demos × 19 starts = 152 RGB files: ~25 s at the ~6 files/s seen here. The preemptor waits held and
    # is released at the third file, so the preemption lands within Slurm's 5 s scheduling interval,
    # mid-build, however slowly a submit runs under load.
    spec = write_spec(slurm_home, "pre", demos=8, steps=41)
    total = 152
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:2:0.1")
    # Wants both of n1's CPUs: it can only run by preempting the build.
    high = cli("submit", "quickstart", "--entry", "tests.jobs_entry", "--qos", "core-own", "-c", "2",
               "--mem", "500MB", "--exclude", "n2", "--force", "--reason", "preempt the build", "--json", "--hold")
    assert high.exit_code == 0, high.stderr
    monkeypatch.delenv("IDMCTL_TEST_BEHAVIOR")
    low = _submit(cli, spec, "--build", "rgb", "--qos", "sub", "-c", "2", "--exclude", "n2", "--mem", "1500MB")
    rgb_dir = slot_dir(spec, "rgb")
    wait_until(lambda: len(files_in(rgb_dir)) >= 3, 180, "the sub build's first 3 files")
    sh("scontrol", "release", json.loads(high.stdout)["scheduler_id"])
    log = Path(low["log"])

    def restarted() -> bool:
        release_requeued(low["scheduler_id"])
        return "restart 1" in text_so_far(log)

    wait_until(restarted, 180, "the preempted build to restart", poll_s=1.0)
    job = _until_final(cli, low["job"], timeout_s=240)
    text = log.read_text()
    assert job.state == "COMPLETED" and job.restarts >= 1, text[-3000:]
    assert "build_job: SIGUSR1 received: builders stopped, exiting 75" in text, text[-3000:]
    present = [int(n) for n in re.findall(r"build_job: rgb of pre: \d+ files, (\d+) already built", text)]
    assert len(present) >= 2 and present[0] == 0 and present[-1] > 0, text[-3000:]
    assert len(files_in(rgb_dir)) == total
    _, metrics = _build_metrics(Path(low["script"]).parent)
    built = [value for _, value in metrics["build_files_built"]]
    # Every file encoded exactly once over the attempts: the resumed attempt skipped the finished ones.
    assert sum(built) == total and built[-1] == total - present[-1], (built, present)


@pytest.mark.slurm
@pytest.mark.slow
def test_build_with_missing_weights_fails_classified(cli, slurm_home: Path) -> None:
    spec = write_spec(slurm_home, "noweights", extra=f"  vae: {slurm_home / 'models' / 'wan2.2'}\n")
    refused = cli("submit", str(spec), "--build", "rgb", "--qos", "share", "--json")
    assert refused.exit_code == 1 and json.loads(refused.stdout)["failed"] == ["build_weights"]
    job = _submit(cli, spec, "--build", "rgb", "--qos", "share", "--mem", "1500MB")
    ended = _until_final(cli, job["job"])
    assert ended.state == "FAILED" and ended.exit_code == "1:0", ended.log_tail
    result = cli("failures", "--json")
    rows = [row for row in json.loads(result.stdout) if row["job_pk"] == job["job"]]
    assert [row["cause"] for row in rows] == ["missing_weights"], result.stdout
    assert rows[0]["caught_by"] == "build_weights" and "does not exist" in rows[0]["evidence"]


# -- the hidden cache as a job (local executor: the same script, no srun) -------------------------

@pytest.mark.slow
def test_hidden_build_job_through_the_gate_builds_every_demo(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from cache.episodes import Demo, write_episodes
    from ground.paths import expand_path
    from ground.spec import load_spec
    from hidden_quick_spec import use_hidden_quick
    from idmctl.core.job_state import is_terminal
    from idmctl.ops.executors.local import LocalExecutor
    from slurm_support import wait_until

    use_hidden_quick(monkeypatch, tmp_path)
    spec = load_spec("quickstart").spec
    rng = np.random.default_rng(0)
    demos = [Demo(f"demo_{i}", rng.standard_normal((steps, 7)).astype(np.float32), rng.standard_normal((steps, 4)),
                  {"robot0_agentview_image": rng.integers(0, 255, (steps, 24, 24, 3), dtype=np.uint8)})
             for i, steps in enumerate((23, 9, 40))]
    write_episodes(expand_path(spec.data.episodes), demos, {"env_name": "Lift"}, {"train": ["demo_0", "demo_1"],
                                                                                  "valid": ["demo_2"]})
    preflight = cli("preflight", "quickstart", "--build", "hidden", "--json")
    assert preflight.exit_code == 0, preflight.stdout + preflight.stderr
    checks = {c["name"]: c for c in json.loads(preflight.stdout)["checks"]}
    assert checks["build_smoke"]["numbers"]["todo"] == 3 and checks["build_weights"]["status"] == "PASS"
    submitted = cli("submit", "quickstart", "--build", "hidden", "--json")
    assert submitted.exit_code == 0, submitted.stderr
    job = json.loads(submitted.stdout)

    def ended() -> bool:
        status = LocalExecutor().status([job["scheduler_id"]]).get(job["scheduler_id"])
        if status is None or not is_terminal(status.state):
            return False  # its runner's state file says it runs: a sync would change nothing
        assert cli("sync").exit_code == 0
        return json.loads(cli("jobs", "--json").stdout)[0]["state"] not in ("PENDING", "RUNNING")

    wait_until(ended, 240, "the local hidden build job to end (synced once its state file says so)", poll_s=1.0)
    row = json.loads(cli("jobs", "--json").stdout)[0]
    assert (row["state"], row["build"]) == ("COMPLETED", "hidden"), Path(job["log"]).read_text()[-3000:]
    root = expand_path(spec.data.cache_root)
    assert sorted(p.name for p in root.glob("*.safetensors")) == [f"demo_{i}.safetensors" for i in range(3)]
    _, metrics = _build_metrics(Path(job["script"]).parent)
    assert metrics["build_files_built"] == [(1, 3.0)]
    assert metrics["build_bytes_written"][0][1] == sum(p.stat().st_size for p in root.glob("*.safetensors"))

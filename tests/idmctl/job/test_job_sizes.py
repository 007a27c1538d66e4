"""Jobs sized for what they do: an eval job asks for one process's share, not the training node, and
``submit --dry-run --eval`` shows every script the submit would send (training, eval, controller)."""

from __future__ import annotations

from pathlib import Path

import yaml


def _scripts(stdout: str) -> dict[str, str]:
    """The dry run's scripts by what they are (the first is the training job's)."""
    parts = stdout.split("\n# ==== idmctl: then the ")
    out = {"training": parts[0]}
    for part in parts[1:]:
        what, script = part.split(" ====\n", 1)
        out[what.split(" (")[0]] = script
    return out


def _header(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith(("#SBATCH", "# idmctl: eval job"))]


def test_card_a_eval_job_asks_for_one_ranks_share_and_the_dry_run_shows_every_script(cli, idmctl_home: Path) -> None:
    result = cli("submit", "latent_c_n4", "--cluster", "card", "--dry-run", "--eval", "last")
    assert result.exit_code == 0, result.output
    scripts = _scripts(result.stdout)
    assert list(scripts) == ["training", "eval job of step 60000", "controller job after the attempt"]
    training = _header(scripts["training"])
    assert "#SBATCH --cpus-per-task=14" in training and "#SBATCH --mem=1600G" in training
    evaluation = _header(scripts["eval job of step 60000"])
    assert evaluation[:10] == [
        "#SBATCH --job-name=latent_c_n4-eval-60000", "#SBATCH --qos=core-own", "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=14", "#SBATCH --mem=200G", "#SBATCH --gres=gpu:1",
        "#SBATCH --time=30-00:00:00", "#SBATCH --exclude=worker-5",
        f"#SBATCH --output={idmctl_home}/runs/latent_c_n4/0/eval-step-60000-%j.out"]
    assert "#SBATCH --dependency=afterok:0" in evaluation
    assert ("# idmctl: eval job: 1 process, 1 GPU; CPUs 112 ÷ 8 ranks = 14; memory 1600G ÷ 8 ranks = 200G (one training "
            "rank's share); time limit 30-00:00:00 (the training job's: evaluator time unmeasured, no eval job of this "
            "spec ran yet)") in evaluation
    controller = _header(scripts["controller job after the attempt"])
    assert "#SBATCH --cpus-per-task=1" in controller and "#SBATCH --dependency=afterany:0" in controller
    assert not (idmctl_home / "runs").exists()


def test_the_spec_overrides_the_eval_jobs_resources(cli, tmp_path: Path) -> None:
    spec = tmp_path / "eval_sized.yaml"
    spec.write_text(yaml.safe_dump({"extends": "latent_c_n4",
                                    "eval": {"resources": {"cpus": 8, "mem": "96G", "time_limit": "4:00:00"}}}))
    result = cli("submit", str(spec), "--cluster", "card", "--dry-run", "--eval", "last")
    assert result.exit_code == 0, result.output
    evaluation = _header(_scripts(result.stdout)["eval job of step 60000"])
    assert "#SBATCH --cpus-per-task=8" in evaluation and "#SBATCH --mem=96G" in evaluation
    assert "#SBATCH --time=0-04:00:00" in evaluation
    assert ("# idmctl: eval job: 1 process, 1 GPU; CPUs 8 (eval.resources); memory 96G (eval.resources); "
            "time limit 4:00:00 (eval.resources)") in evaluation
    bad = tmp_path / "eval_bad.yaml"
    bad.write_text(yaml.safe_dump({"extends": "latent_c_n4", "eval": {"resources": {"mem": "1.5T"}}}))
    refused = cli("submit", str(bad), "--cluster", "card", "--dry-run", "--eval", "last")
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.output
    assert refused.stderr.startswith(f"error: {bad}:eval.resources.mem: '1.5T' is not a size Slurm reads"), refused.stderr



def _row(stderr: str, name: str) -> tuple[str, str]:
    """(status, reason) of the check table's row ``name``, its wrapped lines joined."""
    rows: list[list[str]] = []
    for line in stderr.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) != 4:
            continue
        if cells[0]:
            rows.append(cells)
        elif rows:
            rows[-1] = [" ".join(filter(None, (a, b))) for a, b in zip(rows[-1], cells)]
    found = next(row for row in rows if row[0] == name)
    return found[1], found[2]


def test_the_dry_run_judges_the_eval_jobs_own_resources(cli, idmctl_home: Path) -> None:
    result = cli("submit", "latent_c_n4", "--cluster", "card", "--dry-run", "--eval", "last")
    assert result.exit_code == 0, result.output
    size = "eval job of step 60000 (1 GPU, 14 CPUs, 200G, 30-00:00:00)"
    assert _row(result.stderr, "eval qos") == (
        "PASS", f"{size}: core-own: 1 GPU ≤ max 8; time limit 30-00:00:00 ≤ max wall 30-00:00:00")
    assert _row(result.stderr, "eval loader") == (
        "PASS", f"{size}: consistent: num_workers 0, persistent_workers false (derived), prefetch 0/worker, "
                "pin_memory true; 1 ranks × 3 batch buffers (2 read ahead + 1 in use) × 8 samples × 265,420,800 "
                "B/sample (bfloat16) = 6.4 GB pinned vs resources.mem 214.7 GB")
    assert _row(result.stderr, "eval shm")[0] == "PASS"
    assert _row(result.stderr, "eval disk") == (
        "PASS", f"{size}: no stage-in: reads the files of its held-out split 'valid' in place under "
                "/nas/cache/cosmos_hidden_multi (training copies the cache to /tmp/idm_cache; the eval job needs no "
                "scratch)")
    # The training job copies the 7.2 TB cache to the node; the eval job's script copies nothing.
    scripts = _scripts(result.stdout)
    assert "stage_in || exit 1" in scripts["training"]
    evaluation = scripts["eval job of step 60000"]
    assert "stage_in" not in evaluation and "--stage-bytes" not in evaluation
    assert "# stage-in: none (an eval job reads only its held-out episodes' files, in place under data.cache_root:" \
        in evaluation
    assert "submit-time checks pass" in result.stderr


def test_an_eval_job_over_its_qos_max_wall_is_shown_failing_naming_the_eval_job(cli, tmp_path: Path,
                                                                                idmctl_home: Path) -> None:
    spec = tmp_path / "eval_too_long.yaml"
    spec.write_text(yaml.safe_dump({"extends": "latent_c_n4", "eval": {"resources": {"time_limit": "40-00:00:00"}}}))
    result = cli("submit", str(spec), "--cluster", "card", "--dry-run", "--eval", "last")
    assert result.exit_code == 0, result.output  # a dry run shows the FAIL; it refuses nothing
    assert _row(result.stderr, "eval qos") == (
        "FAIL", "eval job of step 60000 (1 GPU, 14 CPUs, 200G, 40-00:00:00): time limit 40-00:00:00 > core-own max "
                "wall 30-00:00:00; 1 GPU ≤ max 8")
    assert "submit would be refused: eval qos FAIL" in result.stderr


def test_a_build_job_dry_run_shows_the_build_and_its_controller_sized_by_the_spec(cli, tmp_path: Path,
                                                                                 idmctl_home: Path) -> None:
    """No build preflight measured this build: memory and time limit are the spec's, and the script says so;
    resources.build overrides each; no time limit anywhere is bad input."""
    result = cli("submit", "latent_rgbpt_smoke", "--build", "rgb", "--cluster", "card", "--dry-run")
    assert result.exit_code == 0, result.output
    scripts = _scripts(result.stdout)
    assert list(scripts) == ["training", "controller job after the attempt"]  # "training": the first script
    build = [line for line in scripts["training"].splitlines() if line.startswith(("#SBATCH", "# idmctl: build job"))]
    assert build[:7] == ["#SBATCH --job-name=latent_rgbpt_smoke-build-rgb", "#SBATCH --qos=core-own",
                         "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=2",
                         "#SBATCH --mem=4G", "#SBATCH --time=0-00:30:00"]
    assert ("# idmctl: build job: memory 4G (resources.mem: no build smoke measured the peak); time limit 0:30:00 "
            "(resources.time_limit: build time unmeasured)") in build
    assert "#SBATCH --dependency=afterany:0" in _header(scripts["controller job after the attempt"])

    own = tmp_path / "build_sized.yaml"
    own.write_text(yaml.safe_dump({"extends": "latent_rgbpt_smoke",
                                   "resources": {"build": {"cpus": 1, "mem": "3G", "time_limit": "2:00:00"}}}))
    result = cli("submit", str(own), "--build", "rgb", "--cluster", "card", "--dry-run")
    assert result.exit_code == 0, result.output
    header = _scripts(result.stdout)["training"]
    assert "#SBATCH --cpus-per-task=1\n#SBATCH --mem=3G\n#SBATCH --time=0-02:00:00\n" in header
    assert ("# idmctl: build job: CPUs 1 (resources.build); memory 3G (resources.build); time limit 2:00:00 "
            "(resources.build)\n") in header
    flagged = cli("submit", str(own), "--build", "rgb", "--cluster", "card", "--dry-run", "--time", "3:00:00")
    assert "time limit 3:00:00 (--time)" in flagged.stdout, flagged.output

    untimed = tmp_path / "build_untimed.yaml"
    untimed.write_text(yaml.safe_dump({"extends": "latent_rgbpt_smoke", "resources": {"time_limit": None}}))
    refused = cli("submit", str(untimed), "--build", "rgb", "--cluster", "card", "--dry-run")
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.output
    assert refused.stderr.startswith(f"error: {untimed}:resources.build.time_limit: a build job needs a time limit"), \
        refused.stderr


def test_an_eval_jobs_time_limit_follows_the_last_completed_eval_of_the_spec(cli, idmctl_home: Path) -> None:
    """A COMPLETED eval job of card A's spec that ran 25 min (its row in the store, as sync records it):
    the next eval job asks for 2 × 25 min, and the eval qos row judges that limit."""
    from datetime import datetime, timedelta, timezone

    from sqlmodel import select

    from ground.spec.loader import load_spec
    from idmctl.core.job_state import JobState
    from idmctl.record.db import session
    from idmctl.record.models import Job

    spec_hash = load_spec("latent_c_n4").hash
    started = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
    with session() as db:
        for minutes, state, of_spec in ((25, JobState.COMPLETED, spec_hash), (90, JobState.FAILED, spec_hash),
                                        (300, JobState.COMPLETED, "another-spec")):
            db.add(Job(experiment="latent_c_n4", spec_hash=of_spec, state=state.value, started_at=started,
                       ended_at=started + timedelta(minutes=minutes), eval_of_chain=1, eval_step=60000))
        db.commit()
        measured_id = min(job.id for job in db.exec(select(Job)).all())  # the first row: the 25-min COMPLETED one
    result = cli("submit", "latent_c_n4", "--cluster", "card", "--dry-run", "--eval", "last")
    assert result.exit_code == 0, result.output
    evaluation = _header(_scripts(result.stdout)["eval job of step 60000"])
    assert "#SBATCH --time=0-00:50:00" in evaluation
    assert ("# idmctl: eval job: 1 process, 1 GPU; CPUs 112 ÷ 8 ranks = 14; memory 1600G ÷ 8 ranks = 200G (one training "
            f"rank's share); time limit 2 × 25.0 min (eval job {measured_id} of this spec, measured), at least 10.0 min "
            "→ 0-00:50:00") in evaluation
    assert _row(result.stderr, "eval qos")[1].endswith("time limit 0-00:50:00 ≤ max wall 30-00:00:00")

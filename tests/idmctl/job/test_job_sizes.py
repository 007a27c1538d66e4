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
            "rank's share); time limit 30-00:00:00 (the training job's: no evaluator time measured yet)") in evaluation
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

"""A job asks Slurm for what its spec and flags say, in Slurm's own words.

Slurm reads ``--mem``'s K, M, G, T as 1024-based and a bare number as MiB; the accepted and refused
spellings below were asked of the local Slurm 22.05.8 (``sbatch --test-only --mem=…``): 1GB, 1G, 1Gb,
1g, 1kB, 2048K and 1024 are taken, 1GiB, 1.5G, 1P, 1XB and "1 G" are "Invalid --mem specification".
"""

from __future__ import annotations

import pytest

from ground.units import parse_slurm_mem, slurm_mem
from idmctl.core.job_options import JobRequest
from idmctl.job.effective import build


@pytest.mark.parametrize(("written", "mib", "rendered"), [
    ("1600GB", 1_638_400, "1600G"),  # card A's flag: 1600 GiB, as sbatch reads it
    ("1600G", 1_638_400, "1600G"),
    ("1600gb", 1_638_400, "1600G"),
    ("1600GiB", 1_638_400, "1600G"),  # Slurm does not take GiB; it means exactly Slurm's G
    ("400MiB", 400, "400M"),
    ("4096", 4096, "4G"),  # a bare number is MiB, as Slurm reads it
    ("2048K", 2, "2M"),
    ("1024G", 1_048_576, "1T"),
])
def test_a_size_means_what_slurm_reads(written: str, mib: int, rendered: str) -> None:
    assert parse_slurm_mem(written) == mib * 2**20
    assert slurm_mem(written) == rendered


@pytest.mark.parametrize("written", ["1.5G", "1PB", "1 XB", "1XB", "GB", "1B", "16Gi", "-1G"])
def test_a_unit_slurm_does_not_know_is_refused(written: str) -> None:
    with pytest.raises(ValueError, match="is not a size Slurm reads"):
        parse_slurm_mem(written)


def test_card_a_flags_render_card_a_allocation() -> None:
    """``--mem 1600GB`` was sent as ``--mem=1525879M`` (1600e9 B in MiB): 7 % less than card A's sbatch got."""
    from idmctl.job.render import _sbatch_lines

    job = build("latent_c_n4", JobRequest(mem="1600GB", cpus_per_node=112, gpus_per_node=8, qos="core-own",
                                          exclude=("worker-5",), job_name="latentC_n4_60k"), "card")
    lines = _sbatch_lines(job.options, "/tmp/x-%j.out")
    assert "#SBATCH --mem=1600G" in lines
    assert "#SBATCH --cpus-per-task=14" in lines and "#SBATCH --ntasks-per-node=8" in lines
    assert "#SBATCH --gres=gpu:8" in lines and "#SBATCH --qos=core-own" in lines
    assert job.resolved.spec.resources.mem_bytes == 1600 * 2**30


@pytest.mark.parametrize(("mem", "said"), [
    ("0", "'0' is less than 1 MiB (Slurm reads --mem=0 as the whole node; give a size, e.g. 4G)"),
    ("1.5TB", "'1.5TB' is not a size Slurm reads (Slurm's units: K, M, G, T = KiB, MiB, GiB, TiB"),
    ("16PB", "'16PB' is not a size Slurm reads"),
])
def test_bad_mem_flag_is_one_line_naming_the_flag_exit_2(cli, idmctl_home, mem: str, said: str) -> None:
    result = cli("submit", "quickstart", "--mem", mem, "--dry-run")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: command line:--mem: {said}"), result.stderr
    assert "Traceback" not in result.output and not (idmctl_home / "runs").exists()


def test_mem_help_says_what_each_unit_means(cli) -> None:
    result = cli("submit", "--help")
    text = " ".join(result.stdout.replace("│", " ").split())
    assert "K, M, G, T = KiB, MiB, GiB, TiB (1024-based; 1600GB is 1600 GiB, as sbatch reads it)" in text

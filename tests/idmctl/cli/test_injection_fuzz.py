"""Every spec field and flag that reaches the batch script, fuzzed with control characters and shell
metacharacters (before, a trailing newline passed `$`, and `--exclude $'n2\\n,n2'` ended the
#SBATCH header early, so --output, --requeue and --signal were ignored).

For each case the rendering either refuses (exit 2, one line, no traceback, nothing written) or, where
the value is only parsed into a number (--mem, --time), produces exactly the script of the clean value.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ground.contract import ENV_HOME

import pytest
import yaml

from ground.paths import experiments_dir

PAYLOADS = ["\n", "\n,n2", "\r", "\t", "\x0b", "\x1b[2J", "\x7f", ";id", "$(id)", "${HOME}", "`id`", "'", '"', "|id",
            "&id", "&&id", "\\", ">x", "<x", " x", "#x", "\n#SBATCH --qos=core-own"]

FLAGS = {"--qos": "sub", "-J": "job", "--exclude": "n2", "--entry": "trainers.train", "--gres": "gpu:1",
         "--mem": "500MB", "--time": "00:10:00"}

SPEC_FIELDS = {
    ("resources", "qos"): "sub",
    ("resources", "job_name"): "job",
    ("resources", "partition"): "debug",
    ("resources", "exclude"): ["n2"],
    ("data", "cache_root"): "/tmp/cache",
    ("stage", "dest"): "/tmp/stage",
}


def _refused_or_same(result, clean: str, where: str) -> None:  # type: ignore[no-untyped-def]
    assert "Traceback" not in result.output, where
    if result.exit_code == 0:
        _same_shape(result.stdout, clean, where)
        return
    assert result.exit_code == 2, f"{where}: exit {result.exit_code}: {result.output}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}: {result.stderr!r}"


def _same_shape(script: str, clean: str, where: str) -> None:
    """An accepted value (a path with ``${HOME}`` or a space, a --mem with a trailing newline that only
    becomes a number) adds no line, no #SBATCH option and nothing bash would run: same lines as the
    clean script, same header options, and bash parses it."""
    lines, clean_lines = script.splitlines(), clean.splitlines()
    assert len(lines) == len(clean_lines), f"{where}: {len(lines)} lines instead of {len(clean_lines)}"
    options = [line.split("=")[0] for line in lines if line.startswith("#SBATCH")]
    assert options == [line.split("=")[0] for line in clean_lines if line.startswith("#SBATCH")], where
    parsed = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert parsed.returncode == 0, f"{where}: {parsed.stderr}"


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_every_flag_that_reaches_the_script(cli, idmctl_home: Path, flag: str) -> None:
    clean = cli("submit", "quickstart", "--dry-run", flag, FLAGS[flag])
    assert clean.exit_code == 0, clean.output
    for payload in PAYLOADS:
        for value in (FLAGS[flag] + payload, payload + FLAGS[flag]):
            _refused_or_same(cli("submit", "quickstart", "--dry-run", flag, value), clean.stdout, f"{flag} {value!r}")


def _spec(tmp_path: Path, section: str, key: str, value: object) -> Path:
    data: dict = {"extends": str(experiments_dir() / "quickstart.yaml"), section: {key: value}}
    if section == "stage" or key == "cache_root":
        data.setdefault("stage", {})["enabled"] = True
    path = tmp_path / f"fuzz_{section}_{key}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("field", sorted(SPEC_FIELDS), ids=[".".join(f) for f in sorted(SPEC_FIELDS)])
def test_every_spec_field_that_reaches_the_script(cli, idmctl_home: Path, tmp_path: Path, field: tuple[str, str]) -> None:
    section, key = field
    base = SPEC_FIELDS[field]
    clean = cli("submit", str(_spec(tmp_path, section, key, base)), "--dry-run")
    assert clean.exit_code == 0, clean.output
    # A stage.dest that starts with a variable is the node's to expand: its script has the block that says so
    # (the variable unset on the node is one line), the same block for any variable.
    node_named = cli("submit", str(_spec(tmp_path, section, key, "${SLURM_TMPDIR}/stage")), "--dry-run") \
        if field == ("stage", "dest") else clean
    assert node_named.exit_code == 0, node_named.output
    for payload in PAYLOADS:
        for value in ([base[0] + payload] if isinstance(base, list) else [base + payload, payload + base]):
            result = cli("submit", str(_spec(tmp_path, section, key, value)), "--dry-run")
            reference = node_named if isinstance(value, str) and value.startswith("${") else clean
            _refused_or_same(result, reference.stdout, f"{section}.{key} {value!r}")


@pytest.mark.parametrize("payload", ["\n", ";id", "$(id)", "`id`", "'"])
def test_idmctl_home_that_reaches_the_script(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: str) -> None:
    home = tmp_path / f"home{payload}x"
    monkeypatch.setenv(ENV_HOME, str(home))
    result = cli("submit", "quickstart", "--dry-run")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not home.exists()


CONTROLLER_FIELDS = {"qos": "share", "partition": "debug", "mem": "400MiB", "time_limit": "0:03:00",
                     "schedule": "*/10 * * * *"}


@pytest.mark.parametrize("field", sorted(CONTROLLER_FIELDS))
def test_every_controller_field_that_reaches_the_scrontab_block(cli, tmp_path: Path, field: str) -> None:
    """The scrontab block is a table the user's own lines share: a value that added a line there would
    run (or hide) a command. Refused in one line, or the block has the clean block's lines."""
    from ground.paths import clusters_dir

    def show(value: str):  # type: ignore[no-untyped-def]
        data = yaml.safe_load((clusters_dir() / "local-slurm.yaml").read_text())
        data["controller"][field] = value
        path = tmp_path / "profile.yaml"
        path.write_text(yaml.safe_dump(data))
        return cli("controller", "show", "--cluster", str(path))

    clean = show(CONTROLLER_FIELDS[field])
    assert clean.exit_code == 0, clean.output
    for payload in PAYLOADS:
        for value in (CONTROLLER_FIELDS[field] + payload, payload + CONTROLLER_FIELDS[field]):
            result = show(value)
            where = f"controller.{field} {value!r}"
            assert "Traceback" not in result.output, where
            if result.exit_code == 0:
                lines, clean_lines = result.stdout.splitlines(), clean.stdout.splitlines()
                assert len(lines) == len(clean_lines), f"{where}: {result.stdout}"
                assert [line.split("=")[0] for line in lines[:-2]] == [line.split("=")[0] for line in clean_lines[:-2]]
                continue
            lines = result.stderr.strip().splitlines()
            assert result.exit_code == 2 and len(lines) == 1 and f"controller.{field}" in lines[0], f"{where}: {result.output}"

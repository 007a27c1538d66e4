"""The batch script: what submit --dry-run renders from a spec plus flags, and the injection guard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from idmctl.core.job_options import JobRequest
from idmctl.job.render import RenderContext, render_script, resolve_options
from ground.spec.loader import load_spec
from ground.contract import STAGE_MARKER, STAGE_PENDING
from ground.errors import UserError
from ground.stage import model_identity, stage_key


def _spec_file(tmp_path: Path, **sections: dict) -> Path:
    document = {"extends": "quickstart", **sections}
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_dry_run_renders_header_stage_and_srun_from_spec_and_flags(cli, tmp_path: Path, idmctl_home: Path) -> None:
    spec = _spec_file(tmp_path, stage={"enabled": True, "dest": str(tmp_path / "scratch")},
                      resources={"cpu_ranks": 2, "cpus": 2})
    result = cli("submit", str(spec), "--dry-run", "--qos", "sub", "--mem", "2GB", "--exclude", "n2,worker-5",
                 "-J", "latentC_n4_60k", "--time", "1:00:00", "--gres", "gpu:2", "--cluster", "local-slurm")
    assert result.exit_code == 0, result.output
    script = result.stdout
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --job-name=latentC_n4_60k",
        "#SBATCH --qos=sub",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=2",  # one rank per GPU
        "#SBATCH --cpus-per-task=1",  # 2 CPUs per node / 2 ranks
        "#SBATCH --mem=2G",  # 2GB as Slurm reads it (G = 1024 MiB), in Slurm's own words
        "#SBATCH --gres=gpu:2",
        "#SBATCH --time=0-01:00:00",
        "#SBATCH --exclude=n2,worker-5",
        f"#SBATCH --output={idmctl_home}/runs/probe/0/slurm-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@60",  # derived: (step + checkpoint write) × 3, at least Slurm's 60 s
    ]
    assert f"STAGE_DEST={tmp_path / 'scratch'}" in script
    assert f"STAGE_SRC={idmctl_home}/quickstart/hidden_cache" in script
    assert "-m trainers.train --run-dir \"$RUN_DIR\" &" in script
    assert "scontrol requeue \"$SLURM_JOB_ID\"" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not (idmctl_home / "runs").exists(), "--dry-run must write nothing"


def _stage_only_python(tmp_path: Path) -> str:
    """The job script's ``python`` for tests of its stage-in: the stage helpers (ground.stage,
    cache.convert) run on the real interpreter; the node guard, trainer and watchdog, which these
    tests are not about, do nothing and succeed."""
    path = tmp_path / "bin" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/bash\ncase "$2" in ground.stage|cache.convert) exec {sys.executable} "$@" ;; esac\nexit 0\n')
    path.chmod(0o755)
    return str(path)


def test_stage_in_copies_once_then_skips_by_marker(tmp_path: Path, idmctl_home: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ep0.safetensors").write_bytes(b"x" * 1000)
    spec = _spec_file(tmp_path, data={"cache_root": str(cache)}, stage={"enabled": True, "dest": str(tmp_path / "dest")})
    resolved = load_spec(str(spec))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ctx = RenderContext(run_dir=run_dir, chain_id=1, attempt=1, idmctl_home=idmctl_home,
                        log_path=str(run_dir / "log"), python=_stage_only_python(tmp_path))
    script = render_script(resolved, resolve_options(resolved, JobRequest()), ctx)
    script_path = run_dir / "job.sh"
    script_path.write_text(script)
    first = subprocess.run(["bash", str(script_path)], capture_output=True, text=True, timeout=30)
    second = subprocess.run(["bash", str(script_path)], capture_output=True, text=True, timeout=30)
    assert first.returncode == 0 and second.returncode == 0, first.stdout + first.stderr
    assert "idmctl: stage-in done" in first.stdout
    assert "stage-in skipped" in second.stdout and "already holds all of" in second.stdout
    assert (tmp_path / "dest" / "ep0.safetensors").read_bytes() == b"x" * 1000
    marker = json.loads((tmp_path / "dest" / STAGE_MARKER).read_text())
    assert (marker["source"], marker["layers"], marker["files"][0][:2]) == (str(cache), "all", ["ep0.safetensors", 1000])
    assert marker["model"] == model_identity(resolved.spec.data) and marker["staged_at"]


def test_stage_in_disk_full_fails_with_clear_line(tmp_path: Path, idmctl_home: Path) -> None:
    # /dev/full makes every write fail with ENOSPC, like a full node-local disk.
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ep0.safetensors").write_bytes(b"x" * 1000)
    spec = _spec_file(tmp_path, data={"cache_root": str(cache)}, stage={"enabled": True, "dest": str(tmp_path / "dest")})
    resolved = load_spec(str(spec))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "ep0.safetensors").symlink_to("/dev/full")
    # An unfinished copy of this very key (so stage-in resumes into it, keeping the file that is full).
    key = stage_key(cache, "all", model_identity(resolved.spec.data))
    (tmp_path / "dest" / STAGE_PENDING).write_text(json.dumps(key))
    ctx = RenderContext(run_dir=run_dir, chain_id=1, attempt=1, idmctl_home=idmctl_home,
                        log_path=str(run_dir / "log"), python=_stage_only_python(tmp_path))
    script_path = run_dir / "job.sh"
    script_path.write_text(render_script(resolved, resolve_options(resolved, JobRequest()), ctx))
    result = subprocess.run(["bash", str(script_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "idmctl: stage-in FAILED (cp exit 1)" in result.stdout
    assert "No space left on device" in result.stdout
    assert "resumes the unfinished copy" in result.stdout
    assert not (tmp_path / "dest" / STAGE_MARKER).exists()


def test_stage_dest_named_by_the_node_is_expanded_by_the_job_script_there(tmp_path: Path, idmctl_home: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``stage.dest: $SLURM_TMPDIR/idm`` stays a variable in the script (the submitting host has none), the
    script expands it from its own environment (as the local executor's job has it), and fails in one line
    naming the variable where it is unset."""
    monkeypatch.delenv("SLURM_TMPDIR", raising=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ep0.safetensors").write_bytes(b"x" * 1000)
    spec = _spec_file(tmp_path, data={"cache_root": str(cache)}, stage={"enabled": True, "dest": "$SLURM_TMPDIR/idm"})
    resolved = load_spec(str(spec))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ctx = RenderContext(run_dir=run_dir, chain_id=1, attempt=1, idmctl_home=idmctl_home, stage_bytes=1000,
                        log_path=str(run_dir / "log"), python=_stage_only_python(tmp_path))
    script = render_script(resolved, resolve_options(resolved, JobRequest()), ctx)
    assert 'export STAGE_DEST="${SLURM_TMPDIR}"/idm' in script
    assert '--stage-dest "${SLURM_TMPDIR}"/idm --stage-bytes 1000' in script
    script_path = run_dir / "job.sh"
    script_path.write_text(script)
    node_tmp = tmp_path / "job-scratch"
    node_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SLURM_TMPDIR"}
    unset = subprocess.run(["bash", str(script_path)], capture_output=True, text=True, timeout=30, env=env)
    assert unset.returncode == 1
    failed = [line for line in unset.stdout.splitlines() if "FAILED" in line]
    assert failed == [f"idmctl: stage-in FAILED on {os.uname().nodename}: stage.dest names $SLURM_TMPDIR, which is "
                      "unset on this node (set it in the job's environment, or give stage.dest a plain path)"]
    assert not Path("/idm").exists()
    staged = subprocess.run(["bash", str(script_path)], capture_output=True, text=True, timeout=30,
                            env={**env, "SLURM_TMPDIR": str(node_tmp)})
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert f"stage-in on {os.uname().nodename} {cache} -> {node_tmp}/idm (" in staged.stdout
    assert (node_tmp / "idm" / "ep0.safetensors").read_bytes() == b"x" * 1000
    assert json.loads((node_tmp / "idm" / STAGE_MARKER).read_text())["source"] == str(cache)


@pytest.mark.parametrize("dest", ["$SLURM_TMPDIR/$(id)", "$SLURM_TMPDIR/a;b", "$slurm_tmpdir/idm", "$SLURM_TMPDIR/x/$UNSET_X"])
def test_stage_dest_with_any_other_dollar_is_refused_in_one_line(tmp_path: Path, idmctl_home: Path, dest: str) -> None:
    spec = _spec_file(tmp_path, stage={"enabled": True, "dest": dest})
    resolved = load_spec(str(spec))
    ctx = RenderContext(run_dir=tmp_path / "run", chain_id=1, attempt=1, idmctl_home=idmctl_home,
                        log_path=str(tmp_path / "log"))
    with pytest.raises(UserError) as raised:
        render_script(resolved, resolve_options(resolved, JobRequest()), ctx)
    assert raised.value.field == "stage.dest" and raised.value.file == str(spec)


SPEC_INJECTIONS = [
    ({"resources": {"job_name": "x\n#SBATCH --uid=0"}}, "resources.job_name"),
    ({"resources": {"qos": "core-own;rm -rf /"}}, "resources.qos"),
    ({"resources": {"exclude": ["n1$(id)"]}}, "resources.exclude"),
    ({"resources": {"partition": "main`id`"}}, "resources.partition"),
    ({"data": {"cache_root": "/data/$(touch /tmp/pwned)"}, "stage": {"enabled": True}}, "data.cache_root"),
    ({"stage": {"enabled": True, "dest": "/tmp/x;reboot"}}, "stage.dest"),
    ({"stage": {"enabled": True, "dest": "/tmp/x\necho hi"}}, "stage.dest"),
    ({"stage": {"enabled": True, "dest": "$SLURM_TMPDIR/`id`"}}, "stage.dest"),
]


@pytest.mark.parametrize("sections,field", SPEC_INJECTIONS, ids=[f for _, f in SPEC_INJECTIONS])
def test_injection_through_spec_fields_exits_2_and_writes_nothing(cli, tmp_path: Path, idmctl_home: Path,
                                                                   sections: dict, field: str) -> None:
    spec = _spec_file(tmp_path, **sections)
    for args in (["--dry-run"], ["--force", "--reason", "test"]):
        result = cli("submit", str(spec), *args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {spec}:{field}: "), lines
    assert not (idmctl_home / "runs").exists()
    assert not (idmctl_home / "idmctl.sqlite").exists() or _job_count() == 0


FLAG_INJECTIONS = [
    (["-J", "a`id`"], "-J"),
    (["--qos", "sub\nx"], "--qos"),
    (["--exclude", "n1;ls"], "--exclude"),
    (["--mem", "1GB;x"], "--mem"),
    (["--time", "$(id)"], "--time"),
    (["--gres", "gpu:1;x"], "--gres"),
    (["--entry", "os;id"], "--entry"),
]


@pytest.mark.parametrize("flags,flag", FLAG_INJECTIONS, ids=[f for _, f in FLAG_INJECTIONS])
def test_injection_through_flags_exits_2(cli, idmctl_home: Path, flags: list[str], flag: str) -> None:
    result = cli("submit", "quickstart", *flags, "--force", "--reason", "test")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], lines
    assert not (idmctl_home / "runs").exists()


def test_force_without_reason_is_bad_input(cli) -> None:
    result = cli("submit", "quickstart", "--force")
    assert result.exit_code == 2
    assert result.stderr.strip() == 'error: command line:--reason: --force needs --reason (e.g. --reason "smoke passed on login node")'


def _job_count() -> int:
    from sqlmodel import select

    from idmctl.record.db import session
    from idmctl.record.models import Job

    with session() as db:
        return len(db.exec(select(Job)).all())


def test_dry_run_without_slurm_tools_says_the_scheduler_was_not_asked(cli, tmp_path: Path, idmctl_home: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry-run for a Slurm profile from a machine without sbatch (a laptop) still prints the script;
    the verdict line says the scheduler could not be asked, and a real submit would fail as sbatch would."""
    import shutil

    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("git", "bash"):
        (tools / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tools))
    result = cli("submit", "quickstart", "--dry-run", "--cluster", "local-slurm")
    assert result.exit_code == 0, result.stderr
    assert "scheduler not asked (sbatch --test-only): scheduler: sbatch not found on PATH" in result.stderr, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n")
    refused = cli("submit", "quickstart", "--cluster", "local-slurm", "--force", "--reason", "no sbatch here")
    assert refused.exit_code == 2 and refused.stderr.strip().startswith("error: scheduler: sbatch not found on PATH")
    assert not (idmctl_home / "runs").exists()


def _python_training_for(tmp_path: Path) -> str:
    """``_stage_only_python`` whose trainer stands in for a run reading its copy: it sleeps ``$TRAIN_SLEEP`` s."""
    path = tmp_path / "bin" / "python-train"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/bash\ncase "$2" in ground.stage|cache.convert) exec {sys.executable} "$@" ;; '
                    'trainers.train) exec sleep "${TRAIN_SLEEP:-0}" ;; esac\nexit 0\n')
    path.chmod(0o755)
    return str(path)


def test_a_copy_in_use_is_not_replaced_until_its_job_ends(tmp_path: Path, idmctl_home: Path) -> None:
    """Job A stages cache A to one stage.dest and trains (holds its file under DEST.users); job B, another
    key at the same dest, waits its 2 s and fails in one line naming A; after A ends, B replaces the copy.
    The local executor's scripts (no Slurm: the job ids are IDMCTL_LOCAL_JOB_ID's)."""
    from ground import contract

    dest = tmp_path / "dest"
    scripts = {}
    for name in ("a", "b"):
        cache = tmp_path / f"cache_{name}"
        cache.mkdir()
        (cache / "ep0.safetensors").write_bytes(name.encode() * 1000)
        spec_dir = tmp_path / name
        spec_dir.mkdir()
        spec = _spec_file(spec_dir, data={"cache_root": str(cache)}, stage={"enabled": True, "dest": str(dest)})
        resolved = load_spec(str(spec))
        run_dir = spec_dir / "run"
        run_dir.mkdir()
        ctx = RenderContext(run_dir=run_dir, chain_id=1, attempt=1, idmctl_home=idmctl_home, stage_wait_s=2,
                            log_path=str(run_dir / "log"), python=_python_training_for(tmp_path))
        scripts[name] = run_dir / "job.sh"
        scripts[name].write_text(render_script(resolved, resolve_options(resolved, JobRequest()), ctx))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    a_log = tmp_path / "a.log"
    with open(a_log, "w") as out:
        job_a = subprocess.Popen(["bash", str(scripts["a"])], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**env, contract.ENV_LOCAL_JOB_ID: "local-a", "TRAIN_SLEEP": "60"})
    try:
        deadline = time.monotonic() + 30
        while "stage-in done" not in a_log.read_text():
            assert time.monotonic() < deadline and job_a.poll() is None, f"job A never finished its stage-in: {a_log.read_text()}"
            time.sleep(0.1)
        blocked = subprocess.run(["bash", str(scripts["b"])], capture_output=True, text=True, timeout=60,
                                 env={**env, contract.ENV_LOCAL_JOB_ID: "local-b"})
        assert blocked.returncode == 1
        failed = [line for line in blocked.stdout.splitlines() if "FAILED" in line]
        assert failed == [f"idmctl: stage-in FAILED (ground.stage exit 1): {dest} is in use by job local-a (reading the "
                          f"copy of all of {tmp_path}/cache_a (1 files, {model_identity(load_spec(str(tmp_path / 'a' / 'probe.yaml')).spec.data)})): "
                          "not replaced after waiting 2 s; give experiments that run side by side their own stage.dest, "
                          "or submit this one after job local-a ends"]
        assert (dest / "ep0.safetensors").read_bytes() == b"a" * 1000, "job A's copy was touched"
    finally:
        os.killpg(job_a.pid, signal.SIGKILL)
        job_a.wait()
    replaced = subprocess.run(["bash", str(scripts["b"])], capture_output=True, text=True, timeout=60,
                              env={**env, contract.ENV_LOCAL_JOB_ID: "local-b2"})
    assert replaced.returncode == 0, replaced.stdout
    assert "replaces the copy at" in replaced.stdout
    assert (dest / "ep0.safetensors").read_bytes() == b"b" * 1000
    assert sorted(p.name for p in (tmp_path / "dest.users").iterdir()) == ["local-b2"]  # A's and B's files pruned

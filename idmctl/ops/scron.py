"""Running jobs looked at on a schedule: a ``scrontab`` entry that runs ``idmctl sync`` every few minutes
inside Slurm (the profile's ``controller.schedule``, on its controller QoS/partition), so a hang that the
job's own watchdog could not report (the node wedged, the watchdog killed with it) is still found by
sync's heartbeat check. ``idmctl controller install`` puts idmctl's block into the user's scrontab
(between its begin/end lines, the rest kept), ``… remove`` takes it out.

scrontab needs ``ScronParameters=enable`` in slurm.conf (an admin's setting); where it is off, or the
command is missing, install says so in one line and changes nothing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ground import contract
from ground.errors import CheckFailed
from ground.paths import REPO_ROOT, home
from ground.units import parse_bytes, parse_duration, slurm_time
from idmctl.core.profile import ClusterProfile
from idmctl.job.render import check_name, check_sbatch_path, check_shell_path

BEGIN = "# idmctl controller begin: `idmctl controller remove` takes this block out"
END = "# idmctl controller end"
SCRON_JOB_NAME = "idmctl-scron"


def render_block(profile: ClusterProfile, cluster: str | None, python: str = sys.executable,
                 repo_root: Path = REPO_ROOT, idmctl_home: Path | None = None) -> str:
    """idmctl's scrontab block: ``#SCRON`` options (one CPU, the controller's QoS/partition/limits) and the
    cron line that runs ``idmctl sync`` for every chain."""
    settings = profile.controller
    where = "cluster profile"
    if settings.qos is not None:
        check_name(settings.qos, "controller.qos", where)
    if settings.partition is not None:
        check_name(settings.partition, "controller.partition", where)
    root = idmctl_home or home()
    log = check_sbatch_path(root / "controller-scron.out", "scrontab output", contract.ENV_HOME)
    for name, value in ((contract.ENV_HOME, root), ("python", Path(python)), ("repository", repo_root)):
        check_shell_path(str(value), name, "environment")
    options = [f"--job-name={SCRON_JOB_NAME}", *([f"--qos={settings.qos}"] if settings.qos else []),
               *([f"--partition={settings.partition}"] if settings.partition else []),
               "--cpus-per-task=1", f"--mem={-(-parse_bytes(settings.mem) // 2**20)}M",
               f"--time={slurm_time(parse_duration(settings.time_limit))}", f"--output={log}", "--open-mode=append"]
    q = shlex.quote
    env = [f"{contract.ENV_HOME}={q(str(root))}", *([f"{contract.ENV_CLUSTER}={q(cluster)}"] if cluster else [])]
    command = f"cd {q(str(repo_root))} && {' '.join(env)} {q(python)} -m idmctl sync"
    return "\n".join([BEGIN, *(f"#SCRON {option}" for option in options), f"{settings.schedule} {command}", END]) + "\n"


def without_block(crontab: str) -> str:
    """``crontab`` with idmctl's block (begin line to end line) taken out; everything else as it was."""
    kept, inside = [], False
    for line in crontab.splitlines():
        if line == BEGIN:
            inside = True
        elif inside and line == END:
            inside = False
        elif not inside:
            kept.append(line)
    return "\n".join(kept) + ("\n" if kept else "")


def install(block: str) -> str:
    """Put ``block`` into the user's scrontab in place of any earlier one; returns the new scrontab."""
    new = without_block(_current()) + block
    _write(new)
    return new


def remove() -> str:
    new = without_block(_current())
    _write(new)
    return new


def _scrontab() -> str:
    found = shutil.which("scrontab")
    if found is None:
        raise CheckFailed("scrontab is not installed on this host: the scheduled sync needs Slurm's scrontab "
                          "(and ScronParameters=enable in slurm.conf); run `idmctl sync` from cron instead")
    return found


def _current() -> str:
    result = subprocess.run([_scrontab(), "-l"], capture_output=True, text=True, timeout=30, env=os.environ.copy())
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        if "no crontab" in said.lower():
            return ""
        raise CheckFailed(f"scrontab -l: {said} (scrontab needs ScronParameters=enable in slurm.conf)")
    return result.stdout


def _write(crontab: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".scrontab", delete=False) as handle:
        handle.write(crontab)
    try:
        result = subprocess.run([_scrontab(), handle.name], capture_output=True, text=True, timeout=30,
                                env=os.environ.copy())
    finally:
        os.unlink(handle.name)
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        raise CheckFailed(f"scrontab refused the entry: {said} (scrontab needs ScronParameters=enable in slurm.conf)")

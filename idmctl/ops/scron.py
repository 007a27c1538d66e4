"""Running jobs looked at on a schedule: a ``scrontab`` entry that runs ``idmctl sync`` every few minutes
inside Slurm (the profile's ``controller.schedule``, on its controller QoS/partition), so a hang that the
job's own watchdog could not report (the node wedged, the watchdog killed with it) is still found by
sync's heartbeat check. ``idmctl controller install`` puts idmctl's block into the user's scrontab
(between its begin/end lines, the rest kept), ``… remove`` takes it out. Only the lines between those
markers are idmctl's; a table whose block lost its end line is refused with the fix, unchanged.

scrontab needs ``ScronParameters=enable`` in slurm.conf (an admin's setting); where it is off, or the
command is missing, install says so in one line and changes nothing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ground import contract
from ground.errors import CheckFailed, UserError
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
    return "\n".join([BEGIN, *(f"#SCRON {option}" for option in options), f"{' '.join(settings.schedule.split())} {command}", END]) + "\n"


def without_block(crontab: str) -> str:
    """``crontab`` with idmctl's block (begin line to end line) taken out; every other line as it was.

    Only the lines between idmctl's own markers are idmctl's: a begin line with no end line after it (a
    hand edit that lost the end) or a second begin line inside the block is refused with the fix, since
    where idmctl's lines stop is then unknown and the user's own entries would go with them."""
    lines = crontab.split("\n")  # not splitlines: a form feed or \x1c inside a user's line is theirs to keep
    if lines and lines[-1] == "":
        lines.pop()
    kept: list[str] = []
    began: int | None = None
    for number, line in enumerate(lines, 1):
        marker = line.rstrip()
        if marker == BEGIN:
            if began is not None:
                raise _unterminated(began, f"another begin line at line {number}")
            began = number
        elif began is not None and marker == END:
            began = None
        elif began is None:
            kept.append(line)
    if began is not None:
        raise _unterminated(began, "no end line after it")
    return "\n".join(kept) + ("\n" if kept else "")


def _unterminated(line: int, what: str) -> UserError:
    return UserError(f"your scrontab has idmctl's begin line at line {line} and {what}: where idmctl's block ends "
                     "is unknown, so nothing was changed", field="scrontab",
                     hint=f"run `scrontab -e` and put the line {END!r} where idmctl's block ends (or delete the "
                          "block's lines), then run this again")


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


SCRONTAB_DEADLINE_S = 30.0
"""How long one ``scrontab`` call may take: it asks slurmctld, which may not answer."""


def _call(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``scrontab`` with a deadline: past it, its whole process group is ended and the call is one line.
    (``subprocess.run``'s timeout kills the child only, then waits on pipes a grandchild may hold open.)"""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=os.environ.copy(), start_new_session=True)
    try:
        out, err = process.communicate(timeout=SCRONTAB_DEADLINE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.communicate()
        raise CheckFailed(f"scrontab did not answer within {SCRONTAB_DEADLINE_S:g} s (is slurmctld reachable?); "
                          "nothing was changed") from None
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def _current() -> str:
    result = _call([_scrontab(), "-l"])
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
        result = _call([_scrontab(), handle.name])
    finally:
        os.unlink(handle.name)
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        raise CheckFailed(f"scrontab refused the entry: {said} (scrontab needs ScronParameters=enable in slurm.conf)")

"""The user's Slurm associations (``sacctmgr show assoc``): which accounts may this user charge, with which
QoS. The ``qos`` check judges a job's account and QoS against them where they are readable: on the cluster
the profile names (``slurm_cluster``), with ``sacctmgr`` answering. Elsewhere (a laptop, a profile for
another cluster) nothing is read and the check says so; ``sbatch --test-only`` at submit still asks.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

ASSOC_FIELDS = ("cluster", "account", "user", "partition", "qos", "defaultqos")
"""``sacctmgr -n -P show assoc format=…``: one ``|``-separated line per association, in this order."""


@dataclass(frozen=True)
class Association:
    """One association row of the user: an account (and partition, when the row names one) and its QoS."""

    cluster: str
    account: str
    partition: str | None
    """None: the row holds for every partition."""
    qos: tuple[str, ...]
    """The QoS the user may ask for under this account."""


@dataclass(frozen=True)
class Associations:
    """What ``sacctmgr`` says of one user on one cluster, or why it could not be read."""

    user: str
    rows: tuple[Association, ...] = ()
    default_account: str | None = None
    unread: str | None = None
    """Why nothing was read (no sacctmgr, another cluster, an error); None when read."""

    @property
    def accounts(self) -> list[str]:
        return list(dict.fromkeys(row.account for row in self.rows))

    def qos_of(self, account: str, partition: str | None = None) -> list[str]:
        """QoS granted under ``account`` (the rows for ``partition`` or for every partition)."""
        return list(dict.fromkeys(q for row in self.rows if row.account == account
                                  and (row.partition is None or partition is None or row.partition == partition)
                                  for q in row.qos))


def parse_assoc(text: str, user: str) -> list[Association]:
    """The user's rows of ``sacctmgr -n -P show assoc format=cluster,account,user,partition,qos,defaultqos``."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < len(ASSOC_FIELDS) or parts[2] != user:
            continue  # an account's own row (no user) grants nothing to anyone
        cluster, account, _, partition, qos, _ = parts[:len(ASSOC_FIELDS)]
        rows.append(Association(cluster, account, partition or None, tuple(q for q in qos.split(",") if q)))
    return rows


def read(slurm_cluster: str | None, user: str | None = None) -> Associations:
    """The user's associations on ``slurm_cluster`` (the profile's ``slurm_cluster``), read once per process."""
    return _read(slurm_cluster, user or getpass.getuser(), os.environ.get("SLURM_CONF", ""))


@lru_cache(maxsize=8)
def _read(slurm_cluster: str | None, user: str, _conf: str) -> Associations:
    if slurm_cluster is None:
        return Associations(user, unread="the cluster profile names no slurm_cluster")
    if shutil.which("sacctmgr") is None:
        return Associations(user, unread="no sacctmgr on this machine")

    def ask(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sacctmgr", "-n", "-P", "show", *args], capture_output=True, text=True, timeout=20)

    try:
        found = ask("assoc", "where", f"user={user}", f"cluster={slurm_cluster}", f"format={','.join(ASSOC_FIELDS)}")
        if found.returncode != 0:
            words = (found.stderr.strip().splitlines() or [f"exit {found.returncode}"])[-1]
            return Associations(user, unread=f"sacctmgr: {words}")
        rows = parse_assoc(found.stdout, user)
        if not rows:
            # No row: the user has none on this cluster, or this sacctmgr's database does not hold the cluster.
            clusters = ask("cluster", "format=cluster")
            if slurm_cluster not in clusters.stdout.split():
                return Associations(user, unread=f"sacctmgr here knows no cluster {slurm_cluster}")
        default = ask("user", user, "format=defaultaccount")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Associations(user, unread=f"sacctmgr did not answer ({exc})")
    lines = default.stdout.strip().splitlines() if default.returncode == 0 else []
    return Associations(user, tuple(rows), default_account=(lines[0].strip() or None) if lines else None)

"""Job entry for the /dev/shm replay (card A 5845): the real trainer, inside a private mount
namespace whose /dev/shm is a tiny tmpfs (``IDMCTL_REPLAY_SHM``, default 1m) — the nearest real
equivalent of a node whose shared memory is smaller than the DataLoader workers' batches.
Needs root (Slurm jobs on the local test cluster run as root)."""

from __future__ import annotations

import os
import shlex
import sys


def main() -> None:
    size = os.environ.get("IDMCTL_REPLAY_SHM", "1m")
    trainer = shlex.join([sys.executable, "-m", "trainers.train", *sys.argv[1:]])
    script = f"mount --make-rprivate / && mount -t tmpfs -o size={shlex.quote(size)} tmpfs /dev/shm && exec {trainer}"
    os.execvp("unshare", ["unshare", "-m", "sh", "-c", script])


if __name__ == "__main__":
    main()

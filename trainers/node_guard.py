"""The node guard: before stage-in and before training, the job script checks the node it landed on.

``python -m trainers.node_guard --phase stage|train ...`` (rendered by idmctl/job/render.py, which
computes every need from the spec and passes it in: the shell does no arithmetic). Checks:

- ``shm``: free ``/dev/shm`` against the DataLoader's need (ranks × workers × prefetch × batch ×
  bytes per sample, idmctl/gate/shm.py), with the stale segments dead jobs left there (files no
  live process has open or mapped) as the evidence of why it is short (card A 5845: ENOSPC in
  /dev/shm an hour into the job);
- ``scratch``: free space under ``stage.dest`` (plus a copy of another key there, which stage-in
  replaces) against the stage-in bytes; skipped once a copy with this job's key is staged;
- ``gpus``: visible GPUs against ``--gres gpu:N`` (``nvidia-smi -L`` when present, else
  ``CUDA_VISIBLE_DEVICES``/``SLURM_JOB_GPUS``, as Slurm sets them even for the test cluster's fake GPUs);
- ``cache``: the cache mount (``data.cache_root``) is there.

A failing node prints ``IDMCTL_FAILURE cause=node_unfit node=... check=...`` with the numbers and
exits ``EXIT_NODE_UNFIT``; sync classifies it, excludes the node for a while and resubmits the chain.
Imports only the standard library and ``ground`` (it runs before anything heavy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ground.contract import CAUSE_NODE_UNFIT, ENV_SHM_DIR, EXIT_NODE_UNFIT, FAILURE_MARKER
from ground.stage import describe, stage_key, staged_as
from ground.units import format_bytes
from ground.paths import free_bytes

DEFAULT_SHM = "/dev/shm"


@dataclass
class Finding:
    check: str
    ok: bool
    line: str
    """What was found, with the numbers, for the job log."""
    fields: dict[str, object] = field(default_factory=dict)
    """The marker's key=value evidence (no spaces in values)."""


@dataclass(frozen=True)
class Segment:
    path: Path
    bytes: int
    uid: int




def segments(shm_dir: Path) -> list[Segment]:
    found = []
    for entry in shm_dir.iterdir() if shm_dir.is_dir() else []:
        try:
            stat = entry.lstat()
        except OSError:
            continue
        if entry.is_file() and not entry.is_symlink():
            found.append(Segment(entry, stat.st_blocks * 512, stat.st_uid))  # tmpfs pages in use, not the nominal size
    return found


def _live_references(shm_dir: Path) -> tuple[set[str], set[int]]:
    """Paths under ``shm_dir`` some process has open or mapped, and the uids with a live process."""
    prefix = str(shm_dir).rstrip("/") + "/"
    referenced: set[str] = set()
    uids: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            uids.add(proc.stat().st_uid)
        except OSError:
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(prefix):
                    referenced.add(target.removesuffix(" (deleted)"))
        except OSError:
            pass  # another user's process: unreadable, judged by its uid below
        try:
            with open(proc / "maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    start = line.find(prefix)
                    if start >= 0:
                        referenced.add(line[start:].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            pass
    return referenced, uids


def stale_segments(shm_dir: Path) -> list[Segment]:
    """Segments no live process holds: left by a job that died without unlinking them. A segment of
    another user counts only when none of that user's processes is alive (their /proc entries may be
    unreadable to us, so "not referenced" alone could be a live job's)."""
    referenced, uids = _live_references(shm_dir)
    me = os.getuid()
    return [s for s in segments(shm_dir)
            if str(s.path) not in referenced and (s.uid == me or me == 0 or s.uid not in uids)]


def _free(path: Path) -> int:
    free = free_bytes(path)
    if free is None:
        raise OSError(f"cannot read the free space of {path}")
    return free


def check_shm(shm_dir: Path, need: int) -> Finding:
    free = _free(shm_dir)
    stale = stale_segments(shm_dir)
    stale_bytes = sum(s.bytes for s in stale)
    numbers = {"shm_dir": shm_dir, "shm_free_bytes": free, "shm_need_bytes": need,
               "stale_segments": len(stale), "stale_bytes": stale_bytes}
    stale_text = (f"{len(stale)} stale segments of dead jobs hold {stale_bytes:,} B ({format_bytes(stale_bytes)})"
                  + (f", e.g. {stale[0].path.name}" if stale else ""))
    if free < need:
        return Finding("shm", False, f"shm: {free:,} B free on {shm_dir} < {need:,} B this job's loader needs; "
                                     f"{stale_text}", numbers)
    return Finding("shm", True, f"shm: {free:,} B free on {shm_dir} ≥ {need:,} B needed; {stale_text}", numbers)


def check_scratch(dest: Path, stage_bytes: int, key: dict[str, object] | None = None) -> Finding:
    """``key``: the copy this job stages (``ground.stage``); skipped only when ``dest`` holds exactly it.
    Whatever is already there counts as space: stage-in removes a copy of another key before copying,
    and keeps what an unfinished copy of this key finished (so it need not be copied again)."""
    if key is not None and staged_as(dest, key):
        return Finding("scratch", True, f"scratch: {dest} already staged ({describe(key)})", {"stage_dest": dest})
    free = _free(dest)
    held = _bytes_under(dest)
    numbers = {"stage_dest": dest, "scratch_free_bytes": free, "stage_bytes": stage_bytes}
    replaced = ""
    if held:
        numbers["replaced_copy_bytes"] = held
        replaced = f" + {held:,} B of an earlier copy there (stage-in replaces or resumes it)"
    verdict = "<" if free + held < stage_bytes else "≥"
    return Finding("scratch", free + held >= stage_bytes,
                   f"scratch: {free:,} B free under {dest}{replaced} {verdict} {stage_bytes:,} B to stage in", numbers)


def _bytes_under(path: Path) -> int:
    total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return total


def visible_gpus() -> tuple[int, str]:
    """How many GPUs this job can use, and where the number came from."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("SLURM_JOB_GPUS") or ""
    indices = [i for i in listed.split(",") if i.strip() and i.strip() != "-1"]
    source = "CUDA_VISIBLE_DEVICES" if os.environ.get("CUDA_VISIBLE_DEVICES") else "SLURM_JOB_GPUS"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        present = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        # nvidia-smi lists every GPU of the node; the job sees its share of the ones still on the bus.
        count = min(present, len(indices)) if indices else present
        return count, f"nvidia-smi -L ({present} on the node) ∩ {source}"
    return len(indices), source


def check_gpus(requested: int) -> Finding:
    if requested == 0:
        return Finding("gpus", True, "gpus: none requested", {})
    count, source = visible_gpus()
    numbers = {"gpus_visible": count, "gpus_requested": requested}
    verdict = "<" if count < requested else "="
    return Finding("gpus", count >= requested, f"gpus: {count} visible ({source}) {verdict} {requested} requested", numbers)


def check_cache(cache_root: Path) -> Finding:
    present = cache_root.is_dir() and any(cache_root.iterdir())
    return Finding("cache", present, f"cache: {cache_root} {'present' if present else 'missing or empty (mount absent?)'}",
                   {"cache_root": cache_root})


def _value(value: object) -> str:
    return str(value).replace(" ", "%20")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainers.node_guard", description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=("stage", "train"), required=True)
    parser.add_argument("--shm-need", type=int, default=0, help="Bytes of /dev/shm the loader needs per node.")
    parser.add_argument("--stage-bytes", type=int, default=None, help="Bytes stage-in copies (stage phase).")
    parser.add_argument("--stage-dest", type=Path, default=None)
    parser.add_argument("--stage-layers", default=None, help="The copy's layer set (ground.stage), with --stage-model.")
    parser.add_argument("--stage-model", default=None, help="The cache's model identity (ground.stage).")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs requested per node.")
    parser.add_argument("--cache-root", type=Path, default=None, help="The cache that must be mounted (stage phase).")
    args = parser.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    # {node}: the test cluster's two nodes share one host, so each gets its own stand-in tmpfs.
    shm_dir = Path((os.environ.get(ENV_SHM_DIR) or DEFAULT_SHM).replace("{node}", node))
    findings = [check_shm(shm_dir, args.shm_need), check_gpus(args.gpus)]
    if args.phase == "stage":
        if args.cache_root is not None:
            findings.append(check_cache(args.cache_root))
        if args.stage_dest is not None and args.stage_bytes is not None:
            key = None
            if args.cache_root is not None and args.stage_layers is not None and args.stage_model is not None:
                key = stage_key(args.cache_root, args.stage_layers, args.stage_model)
            findings.append(check_scratch(args.stage_dest, args.stage_bytes, key))
    for finding in findings:
        print(f"idmctl: node guard ({args.phase}) on {node}: {'ok' if finding.ok else 'UNFIT'} {finding.line}", flush=True)
    failed = [f for f in findings if not f.ok]
    if not failed:
        return 0
    evidence = {k: _value(v) for f in failed for k, v in f.fields.items()}
    marker = " ".join([FAILURE_MARKER, f"cause={CAUSE_NODE_UNFIT}", f"node={node}", f"phase={args.phase}",
                       f"check={','.join(f.check for f in failed)}", *(f"{k}={v}" for k, v in evidence.items())])
    print(marker, file=sys.stderr, flush=True)
    return EXIT_NODE_UNFIT


if __name__ == "__main__":
    sys.exit(main())

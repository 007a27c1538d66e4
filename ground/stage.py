"""What a staged copy of the cache is: its key, computed here for the job script, the node guard and preflight.

Experiments that differ in what they stage (``latent_c_n4`` routed to 4 blocks, ``latent_c_n12_dense``
with every layer, a cache rebuilt by another model) may share one ``stage.dest``. The marker
(``contract.STAGE_MARKER``) therefore records what the copy holds, not only that a copy finished:

- ``source``: the cache root it was copied from, as the job script names it;
- ``layers``: ``all`` (every file as it is) or ``blocks 5,14,23,32`` (``stage.layers: routed``);
- ``model``: the cache's model identity from the spec (format, layer ids, geometry, dtype, VAE and
  transformer ids: ``model_identity``);
- ``files``: every source file's relative path, size and mtime (a rebuild changes them).

A copy whose key differs from the job's is never reused: stage-in removes it and copies again. While a
copy is under way its key sits in ``contract.STAGE_PENDING``; a copy cut short (preemption) resumes
only for the same key, and the rename to the marker is what makes it finished.

``stage.dest`` may name the job's own scratch, as the node names it: a leading ``$SLURM_TMPDIR``,
``${TMPDIR}`` or site variable (``$LOCAL_SCRATCH/idm``) is expanded by the job script on the node, never
on the submitting host (``node_named``); such a copy cannot be measured or found before the job runs.

A copy in use is never emptied under a running job: each job holds a shared ``flock`` on a file of its own
under ``<dest>.users/`` (named by its job id) for its whole life, opened by the job script before
stage-in; ``prepare`` writes what the job reads into it once the copy is ready. A ``replace`` waits up to
``--wait`` seconds for every other live user (its file locked, its content naming a copy) to end, and
then fails naming those jobs: staging beside the copy (``<dest>.<jobid>``) would need a second copy's
bytes on a scratch the node guard sized for one, and leave it behind; the fix (a ``stage.dest`` per
experiment that runs beside another) is one line in the spec.

``python -m ground.stage prepare|commit`` is the job script's side (standard library and ``ground``
only: it runs on the node before anything heavy).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.contract import ENV_HOME, STAGE_MARKER, STAGE_PENDING
from ground.paths import atomic_write_text

if TYPE_CHECKING:
    from ground.spec.schema import DataSpec

ALL = "all"
USERS_SUFFIX = ".users"
"""``<dest>.users/<job id>``: the jobs using the copy at ``dest``, each file flocked shared by its job's script."""
REPLACE_WAIT_S = 120.0
"""How long a stage-in that would replace a copy waits for the jobs reading it to end (a requeued attempt's
predecessor exiting, a job in its last minutes) before it fails naming them."""

_NODE_VARIABLE = re.compile(r"^\$(?:\{([A-Z_][A-Z0-9_]*)\}|([A-Z_][A-Z0-9_]*))(?=/|$)")
PER_JOB_VARIABLES = ("SLURM_TMPDIR",)
"""Variables that name a directory of one job by definition: a copy there is gone when the job ends."""


@dataclass(frozen=True)
class NodePath:
    """A ``stage.dest`` the node names: a leading variable, expanded by the job script on the node."""

    variable: str
    """The upper-case variable name (``SLURM_TMPDIR``), without ``$`` or braces."""
    rest: str
    """What follows it: ``""`` or a path starting with ``/`` (``/idm``); checked by the renderer."""

    @property
    def shown(self) -> str:
        """``$SLURM_TMPDIR/idm``: the path as the spec means it, for plan and check lines."""
        return f"${self.variable}{self.rest}"

    @property
    def per_job(self) -> bool:
        """The variable names a directory of this one job: no copy there outlives the job."""
        return self.variable in PER_JOB_VARIABLES


def node_named(dest: str) -> NodePath | None:
    """``stage.dest`` as the node names it (a leading ``$NAME``/``${NAME}``, upper case), else None (a path
    of the submitting host, expanded there). ``$IDMCTL_HOME`` stays the host's: the job script exports the
    very value the submitting host resolved, so it names the same directory on both and can be measured."""
    match = _NODE_VARIABLE.match(dest)
    if match is None:
        return None
    variable = match.group(1) or match.group(2)
    if variable == ENV_HOME:
        return None
    return NodePath(variable, dest[match.end():])


def spec_identity(stage_layers: str, data: "DataSpec") -> tuple[str, str]:
    """(layer set, model identity) of what a spec stages: the two parts of the key the spec decides."""
    return layer_set(data.selected_blocks if stage_layers == "routed" else None), model_identity(data)


def layer_set(routed_blocks: list[int] | None) -> str:
    """``all``, or the routed block ids the copy holds: ``blocks 5,14,23,32``."""
    return ALL if routed_blocks is None else "blocks " + ",".join(str(b) for b in routed_blocks)


def model_identity(data: "DataSpec") -> str:
    """What the spec says the cache files are: format, cached block ids, geometry and the ids of the
    models that built them (``-`` where the spec records none, as legacy caches do)."""
    h, w = data.token_grid
    return _one_line(f"{data.cache_format} blocks={','.join(str(b) for b in data.cached_layers)} T={data.frames} "
            f"grid={h}x{w} C={data.channels} {data.dtype} vae={data.vae_id or '-'} "
            f"transformer={data.transformer_id or '-'}")


def _one_line(text: str) -> str:
    # The identity travels as one argument of the job script's stage-in: no control character in it.
    return re.sub(r"[\x00-\x1f\x7f]", " ", text)


def source_files(source: Path) -> list[list[Any]]:
    """``[relative path, size, mtime_ns]`` of every file under ``source``, sorted (our own bookkeeping
    files excluded)."""
    entries: list[list[Any]] = []
    for directory, _, names in os.walk(source):
        for name in names:
            if name.startswith(".idmctl_"):
                continue
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            entries.append([os.path.relpath(path, source), st.st_size, st.st_mtime_ns])
    return sorted(entries)


def stage_key(source: Path, layers: str, model: str) -> dict[str, Any]:
    key: dict[str, Any] = {"source": str(source), "layers": layers, "model": model, "files": source_files(source)}
    key["digest"] = hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return key


def read_key(path: Path) -> dict[str, Any] | None:
    """A marker's (or pending file's) key; None when absent or not a key (a marker of the date-only
    kind older job scripts wrote is no key: that copy is replaced)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("digest"), str) else None


def describe(key: dict[str, Any] | None) -> str:
    if key is None:
        return "no key"
    return f"{key.get('layers')} of {key.get('source')} ({len(key.get('files') or [])} files, {key.get('model')})"


def staged_as(dest: Path, key: dict[str, Any]) -> bool:
    """``dest`` holds a finished copy with exactly this key."""
    marker = read_key(dest / STAGE_MARKER)
    return marker is not None and marker["digest"] == key["digest"]


def staged_here(source: Path, dest: Path) -> dict[str, Any] | None:
    """The finished copy at ``dest``, for judging specs against it without walking the source per
    spec: its ``source``, ``layers`` and ``model``, and ``files_match`` (its file list is the one
    ``source`` has now). None when no marker is there; a marker that is no key (an older job
    script's date) matches nothing."""
    if not (dest / STAGE_MARKER).exists():
        return None
    marker = read_key(dest / STAGE_MARKER) or {}
    files = marker.get("files")
    return {"source": marker.get("source"), "layers": marker.get("layers"), "model": marker.get("model"),
            "files_match": files is not None and str(marker.get("source")) == str(source)
                           and files == source_files(source)}


def reuses(staged: dict[str, Any] | None, source: Path, layers: str, model: str) -> bool | None:
    """Whether a stage-in of (source, layers, model) would reuse the copy ``staged_here`` described:
    True (the same key), False (another key: it is replaced), None (no copy there)."""
    if staged is None:
        return None
    return (bool(staged.get("files_match")) and staged.get("source") == str(source)
            and staged.get("layers") == layers and staged.get("model") == model)


def copy_state(source: Path, dest: Path, layers: str, model: str) -> str | None:
    """What a stage-in of this key would do at ``dest`` now: ``reuse`` (a finished copy with this key),
    ``replace`` (a copy of another key is there), None (no finished copy there)."""
    verdict = reuses(staged_here(source, dest), source, layers, model)
    return None if verdict is None else "reuse" if verdict else "replace"


def _empty(dest: Path) -> None:
    """Remove everything under ``dest`` (not ``dest`` itself: it may be a mount point)."""
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def users_dir(dest: Path) -> Path:
    return dest.parent / (dest.name + USERS_SUFFIX)


def _alive(path: Path) -> bool:
    """Whether the job that made ``path`` still holds it (its script's shared flock)."""
    try:
        with open(path, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def users(dest: Path, me: str | None = None) -> list[str]:
    """The job ids of the live jobs using the copy at ``dest`` (``me`` left out), and the files of ended
    jobs removed. A live job's file that is still empty is a job waiting for its own stage-in, not a user."""
    found = []
    folder = users_dir(dest)
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name == me:
            continue
        if not _alive(path):
            path.unlink(missing_ok=True)  # its job ended: the lock went with its last process
        elif path.read_text(errors="replace").strip():
            found.append(path.name)
    return found


def _wait_for_users(dest: Path, me: str | None, wait_s: float, was: str) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        holding = users(dest, me)
        if not holding:
            return
        if time.monotonic() >= deadline:
            jobs = ", ".join(holding)
            raise SystemExit(f"{dest} is in use by job {jobs} (reading {was}): not replaced after waiting "
                             f"{wait_s:.0f} s; give experiments that run side by side their own stage.dest, or "
                             f"submit this one after job {jobs} ends")
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def prepare(source: Path, dest: Path, layers: str, model: str, me: str | None = None,
            wait_s: float = REPLACE_WAIT_S) -> tuple[str, str]:
    """Make ``dest`` ready for a copy of this key; returns (plan, words): ``staged`` (nothing to do),
    ``resume`` (an unfinished copy of this same key: finished files are kept), ``fresh`` or
    ``replace`` (a copy of another key was removed). The marker of the old copy goes first, so a
    crash mid-way never leaves a marker over files it does not describe. ``me``: this job's file under
    ``<dest>.users`` (its script holds it); a replace first waits for every other live user, and this
    job's file records what it reads once the copy is ready for it."""
    plan, words = _prepare(source, dest, layers, model, me, wait_s)
    if me is not None:  # on a node other than the batch script's, no script holds it: it counts until pruned
        users_dir(dest).mkdir(parents=True, exist_ok=True)
        (users_dir(dest) / me).write_text(f"{plan}\t{words}\n")
    return plan, words


def _prepare(source: Path, dest: Path, layers: str, model: str, me: str | None, wait_s: float) -> tuple[str, str]:
    key = stage_key(source, layers, model)
    marker = read_key(dest / STAGE_MARKER)
    if marker is not None and marker["digest"] == key["digest"]:
        return "staged", describe(key)
    pending = read_key(dest / STAGE_PENDING)
    if not (dest / STAGE_MARKER).exists() and pending is not None and pending["digest"] == key["digest"]:
        return "resume", describe(key)
    dest.mkdir(parents=True, exist_ok=True)
    plan, words = "fresh", describe(key)
    ours = (dest / STAGE_MARKER).exists() or (dest / STAGE_PENDING).exists()
    if any(dest.iterdir()) and not ours:
        # Only a copy stage-in made (it left a marker or a pending key) is removed: a stage.dest
        # pointed at a directory of other files must never be emptied.
        raise SystemExit(f"{dest} holds files no stage-in wrote (no {STAGE_MARKER} or {STAGE_PENDING}): "
                         "empty it or set stage.dest to a directory of its own")
    if any(dest.iterdir()):
        was = marker or pending
        _wait_for_users(dest, me, wait_s, f"the copy of {describe(was)}")
        plan, words = "replace", f"{describe(key)}; the copy there was {describe(was)}"
        (dest / STAGE_MARKER).unlink(missing_ok=True)
        _empty(dest)
    atomic_write_text(dest / STAGE_PENDING, json.dumps(key))
    return plan, words


def commit(dest: Path) -> None:
    """The copy finished: its pending key becomes the marker (with the time it finished)."""
    key = read_key(dest / STAGE_PENDING)
    if key is None:
        raise SystemExit(f"no {STAGE_PENDING} under {dest}: stage-in did not prepare this copy")
    key["staged_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    atomic_write_text(dest / STAGE_MARKER, json.dumps(key))
    (dest / STAGE_PENDING).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    import argparse  # only the job script's `python -m ground.stage`: submit imports this module too

    parser = argparse.ArgumentParser(prog="python -m ground.stage", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ready = commands.add_parser("prepare", help="print staged|resume|fresh|replace, then a tab and what the copy is")
    ready.add_argument("--source", type=Path, required=True)
    ready.add_argument("--dest", type=Path, required=True)
    ready.add_argument("--layers", required=True, help="all, or 'blocks 5,14'")
    ready.add_argument("--model", required=True)
    ready.add_argument("--me", help=f"this job's file under <dest>{USERS_SUFFIX} (its job id), held by its script")
    ready.add_argument("--wait", type=float, default=REPLACE_WAIT_S,
                       help="seconds a replace waits for the other jobs using the copy")
    done = commands.add_parser("commit", help="the copy finished: write the marker")
    done.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        plan, words = prepare(args.source, args.dest, args.layers, args.model, args.me, args.wait)
        print(f"{plan}\t{words}")
    else:
        commit(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())

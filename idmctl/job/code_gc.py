"""``idmctl gc``: what the code store's collector may remove, and the removal.

The collector owns only what submit wrote into the store (``ground.code_snapshot.materialize``):

- a snapshot is a folder of ``snapshots/`` named like a snapshot (16 hex digits) that holds a readable
  manifest; a folder without one (a user's notes, a half-built ``.….tmp`` folder of a submit running now,
  a symlink) is never removed;
- an object is a regular file of ``objects/`` at the path a manifest entry names (``<2 hex>/<62 hex>.<f|x>``);
  any other file there is not idmctl's and is never removed, and an object any remaining folder of
  ``snapshots/`` still links to (same inode) stays;
- a snapshot stays while ANY field of a job row that is not ended (or of an ACTIVE chain) names it: the
  whole row is read as text, so a record written before a field existed, or one that lacks a field the
  code reads (``code.env_digest``), or a field added later (the controller's ``code.directory``) keeps it
  as well. A row names a snapshot by its folder (``…/snapshots/<name>``) or by its manifest's version.

A store path that exists and is not a folder is refused (one line, exit 2), never walked.

In a team's shared store each member's submits write their own snapshots and objects: gc removes only
what belongs to the user running it (its owner), and leaves a colleague's, listed, whatever that
colleague's record says (their jobs may be in a store this user does not read). A removal the filesystem
refuses is listed too, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ground.code_snapshot import MANIFEST, OBJECTS_DIR, SNAPSHOTS_DIR, VERSION_LENGTH, _remove_tree
from ground.errors import UserError
from idmctl.record.jobs import unfinished_job_rows

SNAPSHOT_NAME = re.compile(rf"^[0-9a-f]{{{VERSION_LENGTH}}}$")
"""A snapshot folder's name: the tree digest's first hex digits (``Tree.snapshot_id``)."""
OBJECT_NAME = re.compile(r"^[0-9a-f]{62}\.[fx]$")
"""An object's file name in ``objects/<2 hex>/``: the rest of its sha256 and its kind (``_object_path``)."""
OBJECT_FOLDER = re.compile(r"^[0-9a-f]{2}$")
_NAMED = re.compile(rf"{SNAPSHOTS_DIR}/([0-9a-f]{{{VERSION_LENGTH}}})(?![0-9a-f])")
_TOKEN = re.compile(rf"(?<![0-9a-f])[0-9a-f]{{{VERSION_LENGTH}}}(?![0-9a-f])")


@dataclass(frozen=True)
class Collected:
    store: Path
    kept: list[str]
    """Snapshots an unfinished chain or a pending/running job names."""
    removed: list[str]
    freed_bytes: int
    foreign: list[str]
    """Entries of ``snapshots/`` and ``objects/`` that idmctl did not write: left as they are."""
    others: list[str] = ()  # type: ignore[assignment]
    """Snapshots another user wrote (a team's shared store): theirs to collect, left as they are."""
    refused: list[str] = ()  # type: ignore[assignment]
    """Entries the filesystem would not let this user remove, with the reason."""


def _ours(path: Path) -> bool:
    try:
        return path.lstat().st_uid == os.geteuid()
    except OSError:
        return False


def check_store(store: Path) -> None:
    """A store (and its ``snapshots/``, ``objects/``) that exists must be a folder: never walk a file."""
    for path in (store, store / SNAPSHOTS_DIR, store / OBJECTS_DIR):
        try:
            bad = path.exists() and not path.is_dir()
        except (OSError, ValueError) as exc:
            raise UserError(f"the code store cannot be read: {exc}", file=str(path), field="code_store",
                            hint="point the cluster profile's code_store at a folder") from None
        if bad:
            raise UserError("the code store is not a folder", file=str(path), field="code_store",
                            hint="point the cluster profile's code_store at a folder (gc removed nothing)")


def is_snapshot(folder: Path) -> bool:
    """Whether ``folder`` is a snapshot submit wrote: its name, a real folder, a manifest that is an object."""
    if not SNAPSHOT_NAME.match(folder.name) or folder.is_symlink() or not folder.is_dir():
        return False
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get("files"), dict)


def _version(folder: Path) -> str | None:
    try:
        version = json.loads((folder / MANIFEST).read_text()).get("version")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return version if isinstance(version, str) else None


def names_in_use(records: list[str]) -> tuple[set[str], set[str]]:
    """(snapshot folder names, bare 16-hex tokens) the rows' text names."""
    folders: set[str] = set()
    tokens: set[str] = set()
    for text in records:
        folders.update(_NAMED.findall(text))
        tokens.update(_TOKEN.findall(text))
    return folders, tokens


def collect(store: Path, dry_run: bool = False) -> Collected:
    """Remove the snapshots no unfinished job names, then every object nothing left in the store links to."""
    check_store(store)
    folders, tokens = names_in_use(unfinished_job_rows())
    kept: list[str] = []
    removed: list[str] = []
    foreign: list[str] = []
    remaining: list[Path] = []
    others: list[str] = []
    refused: list[str] = []
    root = store / SNAPSHOTS_DIR
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not is_snapshot(folder):
            foreign.append(f"{SNAPSHOTS_DIR}/{folder.name}")
            remaining.append(folder)
            continue
        if folder.name in folders or folder.name in tokens or _version(folder) in tokens:
            kept.append(folder.name)
            remaining.append(folder)
            continue
        if not _ours(folder):
            others.append(folder.name)
            remaining.append(folder)
            continue
        if not dry_run:
            try:
                _remove_tree(folder)
            except OSError as exc:
                refused.append(f"{SNAPSHOTS_DIR}/{folder.name} ({exc.strerror or exc})")
                remaining.append(folder)
                continue
        removed.append(folder.name)
    # An object is still needed while anything left under snapshots/ links to it (same inode).
    needed = set()
    for folder in remaining:
        if folder.is_symlink() or not folder.is_dir():
            continue
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                info = path.stat()
                needed.add((info.st_dev, info.st_ino))
    freed = 0
    objects = store / OBJECTS_DIR
    for sub in sorted(objects.iterdir()) if objects.is_dir() else []:
        if not OBJECT_FOLDER.match(sub.name) or sub.is_symlink() or not sub.is_dir():
            foreign.append(f"{OBJECTS_DIR}/{sub.name}")
            continue
        for obj in sorted(sub.iterdir()):
            if not OBJECT_NAME.match(obj.name) or obj.is_symlink() or not obj.is_file():
                if not obj.name.startswith("."):  # a submit's copy in flight is not foreign, only not done
                    foreign.append(f"{OBJECTS_DIR}/{sub.name}/{obj.name}")
                continue
            info = obj.stat()
            if (info.st_dev, info.st_ino) in needed or info.st_uid != os.geteuid():
                continue  # still linked, or a colleague's (their snapshot's contents; theirs to collect)
            if not dry_run:
                try:
                    obj.unlink()
                except OSError as exc:
                    refused.append(f"{OBJECTS_DIR}/{sub.name}/{obj.name} ({exc.strerror or exc})")
                    continue
            freed += info.st_size
        if not dry_run and not any(sub.iterdir()):
            try:
                sub.rmdir()
            except OSError:
                pass  # another user's submit may be writing into it right now
    return Collected(store, kept, removed, freed, foreign, others, refused)

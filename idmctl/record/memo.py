"""Remember what only changes with the code (or the files on disk), so repeat checks skip ``import torch``.

Two checks import the data plane: introspection (the trainer's registries: torch, ~1.5 s of a cold
process) and the cache inspection (reads every cache file's header through ``cache.hidden``). Their
verdicts depend only on:

- introspection: the code version and the spec sections that reach a constructor. The factories
  (``cache.registry.dataset_kwargs``, ``trainers.registry.model_kwargs``) never read ``resources``,
  which is all a submit flag can change, so ``resources`` is left out of the key and a ``--qos`` or
  ``--gres`` at submit reuses the preflight's introspection (tests/idmctl/gate/test_preflight_memo.py checks it);
- cache inspection: the code version, the spec's ``data`` section and the files themselves (every
  cache file's name, size and mtime, and the episodes file's).

Entries live in ``$IDMCTL_HOME/preflight_memo/`` as JSON (written atomically). A code version of
``unknown`` (outside git) is never memoised. The code version hashes tracked files only: an edit to
an untracked module that no tracked file's change accompanies is not seen (commit or ``git add -N`` it).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ground.paths import atomic_write_text, home
from ground.spec.loader import ResolvedSpec, canonical_json

DIRECTORY = "preflight_memo"


def _path(kind: str, key: str) -> Path:
    return home() / DIRECTORY / f"{kind}-{key}.json"


def load(kind: str, key: str | None) -> object:
    if key is None:
        return None
    try:
        return json.loads(_path(kind, key).read_text())
    except (OSError, ValueError):
        return None


def store(kind: str, key: str | None, value: object) -> None:
    if key is None:
        return
    try:
        atomic_write_text(_path(kind, key), json.dumps(value, default=str))
    except OSError:
        pass  # a memo is an optimisation: a read-only home just means the next run imports torch again


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def introspection_key(resolved: ResolvedSpec, code_version: str) -> str | None:
    if code_version == "unknown":
        return None
    sections = {name: value for name, value in resolved.canonical.items() if name != "resources"}
    return _digest("introspection", code_version, canonical_json(sections))


def tree_fingerprint(root: Path) -> tuple[int, int, str]:
    """(bytes, files, digest of every file's relative path, size and mtime): what ``du`` measures, and
    enough to tell that no cache file changed since the last inspection."""
    total = files = 0
    entries: list[str] = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            total += st.st_size
            files += 1
            entries.append(f"{os.path.relpath(path, root)}\t{st.st_size}\t{st.st_mtime_ns}")
    entries.sort()
    return total, files, hashlib.sha256("\n".join(entries).encode()).hexdigest()


def cache_key(resolved: ResolvedSpec, code_version: str, tree_digest: str, episodes: Path) -> str | None:
    if code_version == "unknown":
        return None
    try:
        st = os.stat(episodes)
        episodes_stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        episodes_stamp = "missing"
    return _digest("cache", code_version, canonical_json(resolved.canonical["data"]), tree_digest, episodes_stamp)

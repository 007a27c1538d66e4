"""What a job runs: an immutable, content-addressed snapshot of the code, and the identity of its Python.

Card A's job 5961 waited six days in the queue. A job that runs ``python -m trainers.train`` from the
live tree runs whatever the tree holds when it starts (a half-finished edit, another branch) under a
preflight that checked other code. So at submit the code is frozen:

- :func:`tree` lists every file a job could import from a code root (git's tracked files as they are
  on disk, modified or not, plus the untracked files git does not ignore; outside git, a walk that
  skips the usual build and environment folders) and digests their paths, modes and contents. That
  digest **is** the code version a preflight is recorded for.
- :func:`materialize` writes the snapshot under a code store (``$IDMCTL_HOME/code`` unless the cluster
  profile names one): file contents once in ``objects/`` (read-only), each snapshot a directory of hard
  links to them, published by one rename, so unchanged files are shared and a snapshot is never half there.
- :func:`environment` names the Python environment (interpreter and installed distributions).
- At job start, ``python -m ground.code_snapshot verify`` (the job script) and :func:`verify_running`
  (the trainer, after its imports) refuse to run code other than what was admitted: a hand-edited
  snapshot (``snapshot_modified``), a changed environment (``env_changed``), a module of a code root
  imported from outside the snapshot (``snapshot_modified``: the editable install pulled the live tree in).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ground import contract

if TYPE_CHECKING:
    from ground.spec.schema import ExperimentSpec

MANIFEST = ".idmctl_snapshot.json"
"""In each snapshot's root: its digest, commit, and every file with its content hash (not itself listed)."""
ENV_DIR = "envs"
OBJECTS_DIR = "objects"
SNAPSHOTS_DIR = "snapshots"
VERSION_LENGTH = 16
"""Hex digits of the tree digest used as the code version (64 bits: collisions are not a concern)."""
SKIPPED_DIRS = frozenset({".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".idmctl",
                          "node_modules", "build", "dist", ".hypothesis"})
"""Outside git, folders that hold environments, caches and state rather than code (git's own
``.gitignore`` decides inside a repository)."""
SKIPPED_SUFFIXES = (".pyc", ".pyo")
CHUNK = 1 << 20


@dataclass(frozen=True)
class TreeFile:
    path: str
    """POSIX path relative to the root."""
    sha256: str
    """Of the content; for a symlink, of its target text."""
    kind: str
    """``f`` a file, ``x`` an executable file, ``l`` a symlink."""


EXTERNAL_DIR = "_roots"
"""In a snapshot, where the code roots that lie outside the project go (``_roots/<name>/``)."""


@dataclass(frozen=True)
class Tree:
    """Code as it is now: its files, their digest, and the commit it was at (informative only). The
    project's files sit at the top; a code root outside the project sits under ``_roots/<name>/``."""

    root: Path
    files: tuple[TreeFile, ...]
    digest: str
    """Of every file: what the snapshot freezes, and the name of its folder."""
    commit: str | None
    external: tuple[tuple[str, Path], ...] = ()
    """(prefix, folder) of every code root outside the project."""
    key: str = ""
    """Of what runs (:func:`runs`) and of the Python environment: the code version, the gate's key."""

    @property
    def version(self) -> str:
        """The code version a preflight is recorded for and a job is admitted with (see :func:`code_key`)."""
        return (self.key or self.digest)[:VERSION_LENGTH]

    @property
    def snapshot_id(self) -> str:
        """The snapshot's folder name: the whole tree (a README edit is frozen too, and relocks nothing)."""
        return self.digest[:VERSION_LENGTH]

    def source(self, rel: str) -> Path:
        """Where file ``rel`` of the tree lives on disk now."""
        for prefix, folder in self.external:
            if rel.startswith(prefix + "/"):
                return folder / rel[len(prefix) + 1:]
        return self.root / rel

    def import_dirs(self, directory: Path, roots: list[Path]) -> list[Path]:
        """The snapshot's copies of ``roots``, in order: inside the project at their relative path,
        outside it under ``_roots/``."""
        external = {folder: prefix for prefix, folder in self.external}
        out = []
        for root in roots:
            root = root.resolve()
            out.append(directory / external[root] if root in external else directory / root.relative_to(self.root))
        return out


GIT_OVERRIDES = ("-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null")
"""A code root's own ``.git/config`` may name a command git runs (``core.fsmonitor`` runs on ``ls-files``,
hooks on others): the project's git never runs them. ``--no-optional-locks``: listing writes no index."""


def git(root: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    """``git -C root ARGS`` without the root's fsmonitor and hooks, in the caller's environment less every
    ``GIT_*`` variable (``GIT_DIR``, ``GIT_INDEX_FILE``, ``GIT_CONFIG_*`` would point git elsewhere)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    return subprocess.run(["git", *GIT_OVERRIDES, "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def _git_files(root: Path) -> tuple[list[str], str | None] | None:
    """Tracked and untracked-but-not-ignored paths, and HEAD; None outside a work tree or without git."""
    try:
        listed = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
        if listed.returncode != 0:
            return None
        head = git(root, "rev-parse", "--short", "HEAD")
    except (OSError, subprocess.TimeoutExpired):
        return None
    paths = sorted({p for p in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if p})
    return paths, (head.stdout.decode().strip() or None) if head.returncode == 0 else None


def _walked_files(root: Path) -> list[str]:
    out: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in files:
            if not name.endswith(SKIPPED_SUFFIXES):
                out.append(Path(folder, name).relative_to(root).as_posix())
    return sorted(out)


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


RACY_S = 2.0
"""A file modified this recently is hashed again even when its stat matches the cache (git's "racy"
rule: a write in the same clock tick as the cached stat would otherwise go unseen)."""


def _entry(root: Path, rel: str, known: dict[str, list] | None = None) -> TreeFile | None:
    """``known``: path → [size, mtime_ns, inode, sha256] from earlier digests; used and updated."""
    path = root / rel
    try:
        info = path.lstat()
    except FileNotFoundError:  # tracked, deleted in the work tree: not part of what runs
        return None
    if stat.S_ISLNK(info.st_mode):
        return TreeFile(rel, hashlib.sha256(os.readlink(path).encode()).hexdigest(), "l")
    if not stat.S_ISREG(info.st_mode):  # a submodule's folder, a socket: nothing a job imports
        return None
    kind = "x" if info.st_mode & 0o111 else "f"
    stamp = [info.st_size, info.st_mtime_ns, info.st_ino]
    cached = known.get(rel) if known is not None else None
    if cached is not None and cached[:3] == stamp:
        return TreeFile(rel, cached[3], kind)
    digest = _hash_file(path)
    if known is not None and time.time() - info.st_mtime_ns / 1e9 > RACY_S:
        known[rel] = [*stamp, digest]
    return TreeFile(rel, digest, kind)


def _hash_cache_path(root: Path) -> Path | None:
    """Per code root, beside the snapshots: hashes of files whose stat has not moved (every submit and
    preflight digests the tree; rereading 2 MB each time is most of its cost)."""
    try:
        store = default_store()
    except Exception:  # no home to keep it in: hash everything
        return None
    # Never the first thing written into a home: a command refused as bad input leaves none behind.
    return store / "hashes" / f"{hashlib.sha256(str(root).encode()).hexdigest()[:16]}.json" if store.parent.is_dir() else None


def _load_hashes(path: Path | None) -> dict[str, list]:
    if path is None:
        return {}
    try:
        loaded = json.loads(path.read_text())
        return loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        return {}


def digest_of(files: tuple[TreeFile, ...] | list[TreeFile]) -> str:
    """Over paths, kinds and contents, in path order: the same files give the same digest anywhere."""
    digest = hashlib.sha256()
    for item in sorted(files, key=lambda f: f.path):
        digest.update(f"{item.kind} {item.sha256} {item.path}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


DOC_SUFFIXES = (".md", ".rst")
DOC_DIRS = frozenset({"docs", "doc"})
SPEC_DIR = "experiments"


def runs(path: str) -> bool:
    """Whether file ``path`` of a tree is code a job could run: anything but documentation (``*.md``,
    ``*.rst``, a ``docs/`` folder) and experiment specs (a YAML under ``experiments/``: each spec is keyed
    by its own hash, extends included, so another spec's edit must not relock this one). The project's
    packages, the taxonomy, the job templates, tests a spec may name as its entry and every file of a code
    root count."""
    parts = path.split("/")
    if path.endswith(DOC_SUFFIXES) or DOC_DIRS.intersection(parts[:-1]):
        return False
    return not (path.endswith((".yaml", ".yml")) and SPEC_DIR in parts[:-1])


_ENV_DIGEST: list[str] = []


def _environment_key() -> str:
    """This interpreter's environment digest (``environment``), once per process: known by the install
    stamp when recorded, else listed (~0.2 s) and recorded where a home exists."""
    if not _ENV_DIGEST:
        try:
            store = default_store()
            digest = known_environment(store) or (record_environment(store) if store.parent.is_dir()
                                                  else environment_digest(environment()))
        except OSError:
            digest = environment_digest(environment())
        _ENV_DIGEST.append(digest)
    return _ENV_DIGEST[0]


def code_key(files: tuple[TreeFile, ...] | list[TreeFile]) -> str:
    """The gate's key: the digest of the files that run (:func:`runs`) and of the Python environment.
    Editing the README or another experiment's spec leaves it; editing ``trainers/model.py``, a file of a
    code root, the taxonomy, a job template or the installed packages changes it."""
    running = digest_of([f for f in files if runs(f.path)])
    return hashlib.sha256(f"code {running}\nenvironment {_environment_key()}\n".encode()).hexdigest()


def tree(root: Path | None = None) -> Tree:
    """The code root (the project by default) as it is on disk now."""
    from ground.paths import REPO_ROOT

    root = (root or REPO_ROOT).resolve()
    listed = _git_files(root)
    paths, commit = listed if listed is not None else (_walked_files(root), None)
    cache = _hash_cache_path(root)
    known = _load_hashes(cache)
    before = dict(known)
    files = tuple(f for f in (_entry(root, rel, known) for rel in paths if rel != MANIFEST) if f is not None)
    if cache is not None and known != before:
        listed_now = {f.path for f in files}
        try:
            from ground.paths import atomic_write_text

            atomic_write_text(cache, json.dumps({k: v for k, v in known.items() if k in listed_now}))
        except OSError:  # a read-only home: the digest is still right, only slower next time
            pass
    return Tree(root, files, digest_of(files), commit, key=code_key(files))


def code_tree(roots: list[Path] | tuple[Path, ...] = ()) -> Tree:
    """The project plus the code roots outside it (roots inside it are already among its files)."""
    from dataclasses import replace

    project = tree()
    outside = [r.resolve() for r in roots if not r.resolve().is_relative_to(project.root)]
    if not outside:
        return project
    files, external = list(project.files), []
    for folder in dict.fromkeys(outside):
        if not folder.is_dir():
            raise SnapshotError(f"code root {folder} is not a folder")
        part = tree(folder)
        prefix = f"{EXTERNAL_DIR}/{folder.name}-{hashlib.sha256(str(folder).encode()).hexdigest()[:8]}"
        files += [replace(f, path=f"{prefix}/{f.path}") for f in part.files]
        external.append((prefix, folder))
    return Tree(project.root, tuple(files), digest_of(files), project.commit, tuple(external), key=code_key(files))


def snapshot_paths(roots: list[Path] | tuple[Path, ...] = ()) -> set[Path]:
    """Every file (absolute, resolved) a snapshot of the project and ``roots`` would hold, listed as
    :func:`code_tree` lists them and hashing nothing: what a job can import."""
    from ground.paths import REPO_ROOT

    out: set[Path] = set()
    project = REPO_ROOT.resolve()
    for folder in dict.fromkeys([project, *(r.resolve() for r in roots if not r.resolve().is_relative_to(project))]):
        listed = _git_files(folder)
        paths = listed[0] if listed is not None else _walked_files(folder)
        out.update((folder / rel).resolve() for rel in paths)
    return out


def code_version(spec: "ExperimentSpec | None" = None) -> str:
    """The digest of the code a job submitted now would run, the preflight gate's key: 16 hex digits over
    every tracked and untracked-but-not-ignored file of the project, as it is on disk, and of the spec's
    ``code.roots`` that lie outside it. The one home of the code version: the trainer's (a job run outside
    a snapshot) and the gate's (``idmctl.record.preflights.version_for``) both call this."""
    if spec is None:
        return code_tree().version
    from ground.class_path import spec_roots  # start-up: the spec schema (pydantic), only for a spec's roots

    return code_tree(spec_roots(spec)).version


# -- the code store ----------------------------------------------------------------------------------------

def default_store() -> Path:
    from ground.paths import home

    return home() / "code"


def snapshot_dir(version: str, store: Path | None = None) -> Path:
    return (store or default_store()) / SNAPSHOTS_DIR / version


def _object_path(store: Path, item: TreeFile) -> Path:
    return store / OBJECTS_DIR / item.sha256[:2] / f"{item.sha256[2:]}.{item.kind}"


def _store_folder(store: Path, *parts: str) -> Path:
    """``store/<parts>``, made where missing; in a team's shared store (group- or other-writable: 1777 like
    /tmp, or a setgid 2775) each folder it makes gets the store's own mode. The first member's umask would
    otherwise make ``snapshots/``, ``objects/ab/`` or ``envs/`` theirs alone, and a colleague's submit of
    other code failed there (PermissionError, seen as two unprivileged users)."""
    try:
        mode = store.stat().st_mode & 0o7777
    except OSError:
        mode = 0  # made now, by this user's umask: a store of their own
    folder = store
    for part in parts:
        folder = folder / part
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        if mode & 0o022:
            os.chmod(folder, mode)
    return folder


def _store_object(store: Path, source: Path, item: TreeFile) -> Path:
    """The content once in ``objects/`` (read-only: a hard link into a snapshot cannot be edited in place)."""
    target = _object_path(store, item)
    if target.exists():
        return target
    _store_folder(store, OBJECTS_DIR, item.sha256[:2])
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copyfile(source, temp)
    if _hash_file(temp) != item.sha256:  # the file changed between hashing and copying: refuse, never mislabel
        temp.unlink()
        raise SnapshotError(f"{source} changed while the snapshot was taken; submit again")
    os.chmod(temp, 0o555 if item.kind == "x" else 0o444)
    os.replace(temp, target)
    return target


class SnapshotError(RuntimeError):
    """The code could not be frozen, or a job's code is not what was admitted (the message is the evidence)."""


def materialize(snapshot: Tree, store: Path | None = None) -> Path:
    """The snapshot's directory, created if absent; idempotent and safe against a concurrent submit."""
    store = store or default_store()
    final = snapshot_dir(snapshot.snapshot_id, store)
    if (final / MANIFEST).exists():
        return final
    _store_folder(store, SNAPSHOTS_DIR)
    building = store / SNAPSHOTS_DIR / f".{snapshot.snapshot_id}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    try:
        for item in snapshot.files:
            dest = building / item.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            if item.kind == "l":
                os.symlink(os.readlink(snapshot.source(item.path)), dest)
                continue
            obj = _store_object(store, snapshot.source(item.path), item)
            try:
                os.link(obj, dest)
            except OSError:  # a store on a filesystem without hard links: a read-only copy
                shutil.copy2(obj, dest)
        manifest = {"digest": snapshot.digest, "version": snapshot.version, "commit": snapshot.commit,
                    "source": str(snapshot.root), "created_at": time.time(),
                    "files": {f.path: f"{f.kind}:{f.sha256}" for f in snapshot.files}}
        (building / MANIFEST).write_text(json.dumps(manifest, indent=0, sort_keys=True))
        try:
            os.rename(building, final)
        except OSError:
            if not (final / MANIFEST).exists():
                raise
    finally:
        if building.exists():
            _remove_tree(building)
    return final


def _remove_tree(path: Path) -> None:
    def writable(func, target, _exc):  # read-only links and folders: make them removable, then retry
        os.chmod(os.path.dirname(target), 0o700)
        func(target)

    shutil.rmtree(path, onerror=writable)


_IN_SNAPSHOT = re.compile(rf"/{SNAPSHOTS_DIR}/[0-9a-f]{{{VERSION_LENGTH}}}/(?:{EXTERNAL_DIR}/[^/]+/)?(.+)$")


def path_in_code(path: str) -> str | None:
    """``cache/registry.py`` for a file of a snapshot (a job's traceback names the snapshot's copy); None
    for a path outside every snapshot."""
    match = _IN_SNAPSHOT.search(path)
    return match.group(1) if match else None


def read_manifest(directory: Path) -> dict:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{directory}: no readable snapshot manifest ({MANIFEST}): {exc}") from exc


def differences(directory: Path) -> tuple[str, list[str]]:
    """The snapshot's digest as it is on disk now, and what differs from its manifest (edited, missing,
    added files: Python's own ``__pycache__`` is not code the manifest lists)."""
    manifest = read_manifest(directory)
    listed: dict[str, str] = manifest.get("files") or {}
    now = _walked_files(directory)
    found = {rel: _entry(directory, rel) for rel in now if rel != MANIFEST}
    changes = [f"edited {rel}" for rel, item in found.items()
               if item is not None and rel in listed and listed[rel] != f"{item.kind}:{item.sha256}"]
    changes += [f"missing {rel}" for rel in listed if rel not in found]
    changes += [f"added {rel}" for rel in found if rel not in listed]
    return digest_of([f for f in found.values() if f is not None]), sorted(changes)


# -- the Python environment --------------------------------------------------------------------------------

def environment() -> dict:
    """The interpreter and every installed distribution with its version (what ``pip freeze`` would say)."""
    from importlib import metadata

    packages: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        if name:
            packages.setdefault(name.lower().replace("_", "-"), dist.version)
    return {"python": sys.version.split()[0], "prefix": sys.prefix, "packages": dict(sorted(packages.items()))}


def environment_digest(env: dict) -> str:
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:VERSION_LENGTH]


def _install_stamp() -> str:
    """Changes whenever a distribution is installed, removed or upgraded: pip adds and removes
    ``*.dist-info`` folders, which changes the modification time of the folder that holds them."""
    stamps = [sys.prefix, sys.version]
    for entry in sys.path:
        folder = entry or "."
        try:
            # Only folders that hold distributions count: a script's own folder (/tmp, the project) changes
            # with every file written there and would make every stamp new.
            holds = folder.endswith(("site-packages", "dist-packages")) or any(
                item.name.endswith((".dist-info", ".egg-info")) for item in os.scandir(folder))
            if holds:
                stamps.append(f"{entry}:{os.stat(folder).st_mtime_ns}")
        except OSError:
            continue
    return hashlib.sha256("\n".join(stamps).encode()).hexdigest()[:VERSION_LENGTH]


def known_environment(store: Path) -> str | None:
    """The digest recorded for this install stamp, without listing anything (None when not recorded)."""
    try:
        digest = (store / ENV_DIR / "by-stamp" / _install_stamp()).read_text().strip()
    except OSError:
        return None
    return digest if (store / ENV_DIR / f"{digest}.json").exists() else None


def record_environment(store: Path | None = None) -> str:
    """This process's environment written into the store once (``envs/<digest>.json``); its digest.
    Listing ~150 distributions costs ~0.2 s, so submit reuses the digest while the install stamp holds."""
    from ground.paths import atomic_write_text

    store = store or default_store()
    known = store / ENV_DIR / "by-stamp" / _install_stamp()
    if (digest := known_environment(store)) is not None:
        return digest
    env = environment()
    digest = environment_digest(env)
    target = store / ENV_DIR / f"{digest}.json"
    if not target.exists():
        _store_folder(store, ENV_DIR)
        atomic_write_text(target, json.dumps(env, indent=1, sort_keys=True))
    _store_folder(store, ENV_DIR, known.parent.name)
    atomic_write_text(known, digest)
    return digest


def environment_changes(recorded: dict, now: dict) -> list[str]:
    """``torch 2.13.0 → 2.14.0``, ``+ hypothesis 6.1``, ``- h5py 3.16.0``, ``python 3.11.2 → 3.11.9``."""
    out = [f"python {recorded.get('python')} → {now.get('python')}"] if recorded.get("python") != now.get("python") else []
    if recorded.get("prefix") != now.get("prefix"):
        out.append(f"environment {recorded.get('prefix')} → {now.get('prefix')}")
    before, after = recorded.get("packages") or {}, now.get("packages") or {}
    for name in sorted(set(before) | set(after)):
        if name not in after:
            out.append(f"- {name} {before[name]}")
        elif name not in before:
            out.append(f"+ {name} {after[name]}")
        elif before[name] != after[name]:
            out.append(f"{name} {before[name]} → {after[name]}")
    return out


# -- at job start ------------------------------------------------------------------------------------------

def _fail(cause: str, message: str, evidence: list[str]) -> SnapshotError:
    shown = "; ".join(evidence[:8]) + (f"; … {len(evidence) - 8} more" if len(evidence) > 8 else "")
    return SnapshotError(f"{contract.FAILURE_MARKER} cause={cause} {message}: {shown}")


def verify_snapshot(directory: Path, admitted: str) -> None:
    """The snapshot holds exactly the code its job was admitted for."""
    manifest = read_manifest(directory)
    digest, changes = differences(directory)
    # The version is the key of what runs; the folder holds the whole tree, whose digest the manifest keeps.
    if manifest.get("version") != admitted or digest != manifest.get("digest") or changes:
        evidence = changes or [f"digest {digest[:VERSION_LENGTH]} on disk, manifest {str(manifest.get('digest'))[:VERSION_LENGTH]} "
                               f"(code version {manifest.get('version')})"]
        raise _fail(contract.CAUSE_SNAPSHOT_MODIFIED, f"the code in {directory} is not the admitted {admitted}", evidence)


def verify_environment(expected: str, store: Path) -> None:
    """The Python environment is the one recorded at submit (packages that differ are the evidence)."""
    now = environment()
    if environment_digest(now) == expected:
        return
    try:
        recorded = json.loads((store / ENV_DIR / f"{expected}.json").read_text())
    except (OSError, ValueError):
        raise _fail(contract.CAUSE_ENV_CHANGED, f"the Python environment is not the admitted {expected}",
                    [f"its record {store / ENV_DIR / (expected + '.json')} is unreadable"]) from None
    raise _fail(contract.CAUSE_ENV_CHANGED, f"the Python environment changed since submit ({sys.prefix})",
                environment_changes(recorded, now) or ["the environment's digest differs"])


def code_packages(directory: Path) -> set[str]:
    """Top-level packages and modules of a snapshot (what, imported from elsewhere, would be the live tree)."""
    names = set()
    for rel in (read_manifest(directory).get("files") or {}):
        top = rel.split("/", 1)
        if len(top) == 2 and top[1] == "__init__.py":
            names.add(top[0])
        elif len(top) == 1 and top[0].endswith(".py"):
            names.add(top[0][:-3])
    return names


def stray_modules(directory: Path, modules: dict | None = None) -> list[str]:
    """Modules of the snapshot's packages whose file lies outside the snapshot: ``trainers.model from /repo/...``."""
    root = directory.resolve()
    packages = code_packages(directory)
    out = []
    for name, module in list((modules if modules is not None else sys.modules).items()):
        file = getattr(module, "__file__", None)
        if not file or name.split(".", 1)[0] not in packages:
            continue
        if not Path(file).resolve().is_relative_to(root):
            out.append(f"{name} from {file}")
    return sorted(out)


def verify_running(check_environment: bool = True) -> str | None:
    """Inside a job: the snapshot is the admitted one and every module of its packages came from it.
    Returns the admitted version, or None outside a snapshot job (``idmctl train``, tests)."""
    directory, admitted = os.environ.get(contract.ENV_SNAPSHOT), os.environ.get(contract.ENV_CODE_VERSION)
    if not directory or not admitted:
        return None
    verify_snapshot(Path(directory), admitted)
    stray = stray_modules(Path(directory))
    if stray:
        raise _fail(contract.CAUSE_SNAPSHOT_MODIFIED, f"modules were imported from outside the snapshot {directory}",
                    stray)
    expected_env = os.environ.get(contract.ENV_ENV_DIGEST)
    if check_environment and expected_env:
        verify_environment(expected_env, Path(os.environ.get(contract.ENV_CODE_STORE) or default_store()))
    return admitted


def refuse_unadmitted_code() -> int | None:
    """For an entry's first lines: None when this process runs the code its job was admitted for (or is
    no job), else the exit status to return, after the marker line the classifier reads. The job script
    checked the environment seconds before; here the question is what this interpreter imported."""
    try:
        verify_running(check_environment=False)
    except SnapshotError as exc:
        print(exc, file=sys.stderr, flush=True)
        return contract.EXIT_CODE_MISMATCH
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m ground.code_snapshot verify``: the job script's check before stage-in (minutes saved on a
    job that would stop anyway); the marker line is the classifier's evidence."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["verify"]:
        print("usage: python -m ground.code_snapshot verify", file=sys.stderr)
        return 2
    try:
        version = verify_running()
    except SnapshotError as exc:
        print(exc, flush=True)
        return contract.EXIT_CODE_MISMATCH
    print(f"idmctl: code {version or 'live tree (no snapshot)'} verified at {time.strftime('%Y-%m-%dT%H:%M:%S')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

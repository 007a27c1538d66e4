"""``idmctl doctor``: is this machine ready? One row per thing idmctl needs, each failing row with its fix.

Light by design: the standard library and ``ground`` only. Versions come from package metadata
(nothing imported), migration heads from the migration files, the stores are read with ``sqlite3`` (``idmctl.record.peek``),
and the one-frame render runs in a child process (it imports robosuite and MuJoCo, and a broken GL
stack must not take this process down).

Status: ``OK``; ``WARN`` (works, but something will bite later, or an optional piece is missing);
``FAIL`` (something required is missing: exit 1); ``SKIP`` (not checked on request).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ground.contract import ENV_CLUSTER, ENV_HOME
from ground.mlflow_store import sqlite_file
from ground.paths import REPO_ROOT, clusters_dir, db_path, home, mlflow_tracking_uri, nearest_existing, runs_root
from ground.units import format_bytes
from idmctl.record.peek import UnreadableStore, mlflow_experiment, shared_revision, sqlite_state
from ground.code_snapshot import default_store
from ground.contract import ENV_DB_URL
from ground.errors import UserError
from ground.redact import redacted
from ground.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, MLFLOW_EXPERIMENT
from idmctl.record.migrate import MIGRATIONS_DIR
from idmctl.record.url import scrubbed
from idmctl.record.url import shared_url

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"
PYTHON = (3, 11)
KEY_PACKAGES = ("torch", "lightning-fabric", "mlflow", "robosuite", "mujoco", "diffusers", "sqlmodel", "alembic",
                "h5py", "numpy")
"""Shown with their versions; every requirement of idmctl is checked."""
NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre", "gpfs",
                       "beegfs", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.glusterfs", "fuse.cephfs", "davfs"}
"""SQLite's locking is unreliable on these: a store on one of them corrupts under concurrent jobs."""
SHM_WARN_BYTES = 1 << 30
SCRATCH_WARN_BYTES = 10 * (1 << 30)
RENDER_TIMEOUT_S = 180.0
SLURM_TIMEOUT_S = 10.0
SYSTEM_DEPS = "scripts/system_deps.sh quickstart"


@dataclass
class Row:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class DoctorReport:
    rows: list[Row]
    seconds: float

    @property
    def failed(self) -> list[str]:
        return [row.name for row in self.rows if row.status == FAIL]

    def as_dict(self) -> dict:
        return {"ok": not self.failed, "failed": self.failed, "seconds": round(self.seconds, 2),
                "rows": [asdict(row) for row in self.rows]}


def check_python() -> Row:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] != PYTHON:
        return Row("python", FAIL, f"{version} at {sys.executable}; idmctl needs {PYTHON[0]}.{PYTHON[1]}",
                   "install Python 3.11, then `rm -rf .venv && scripts/setup.sh`")
    return Row("python", OK, f"{version} at {sys.executable}")


def _requirements() -> list[str]:
    try:
        return [r for r in importlib.metadata.requires("idmctl") or [] if "extra ==" not in r]
    except importlib.metadata.PackageNotFoundError:
        return []


def check_packages() -> Row:
    from packaging.requirements import Requirement

    try:
        own = importlib.metadata.version("idmctl")
    except importlib.metadata.PackageNotFoundError:
        return Row("packages", FAIL, "idmctl is not installed in this Python", "scripts/setup.sh")
    bad, versions = [], {}
    for text in _requirements():
        requirement = Requirement(text)
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            bad.append(f"{requirement.name} missing (needs {requirement.specifier or 'any'})")
            continue
        versions[requirement.name] = installed
        if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            bad.append(f"{requirement.name} {installed} (needs {requirement.specifier})")
    shown = ", ".join(f"{name} {versions[name]}" for name in KEY_PACKAGES if name in versions)
    if bad:
        return Row("packages", FAIL, "; ".join(bad), "scripts/setup.sh (reinstalls the pinned stack into .venv)")
    return Row("packages", OK, f"idmctl {own}; {len(versions)} requirements met: {shown}")


def mount_of(path: Path, mounts_text: str | None = None) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding ``path`` (the longest matching mount point)."""
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/mounts").read_text()
        except OSError:
            return "?", "unknown"
    target = str(path)
    best = ("", "unknown")
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best[0]):
            best = (point, fields[2])
    return best



def check_home(mounts_text: str | None = None) -> Row:
    path = home()
    if path.exists() and not path.is_dir():
        return Row(ENV_HOME, FAIL, f"{path} is a file, not a directory", f"point {ENV_HOME} at a directory")
    probe_dir = path if path.exists() else nearest_existing(path)
    resolved = probe_dir.resolve()
    point, fstype = mount_of(resolved, mounts_text)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Row(ENV_HOME, FAIL, f"{path} is not writable ({exc.strerror or exc})",
                   f"set {ENV_HOME} to a directory you can write on a local disk")
    where = f"{path} ({fstype} on {point})"
    if fstype in NETWORK_FILESYSTEMS or fstype.startswith("nfs"):
        sqlite_here = [name for name, local in (("the store", not os.environ.get(ENV_DB_URL)),
                                                ("MLflow's store", mlflow_tracking_uri().startswith("sqlite:")))
                       if local]
        if sqlite_here:
            return Row(ENV_HOME, FAIL, f"{where}: a network filesystem; {' and '.join(sqlite_here)} would be SQLite "
                       "on it, and SQLite on NFS corrupts",
                       f"set {ENV_HOME} to a local disk, or keep it here (compute nodes see run directories there) "
                       f"with the team's PostgreSQL ({ENV_DB_URL}) and an MLflow server (MLFLOW_TRACKING_URI)")
        return Row(ENV_HOME, OK, f"{where}, writable: a shared filesystem, as run directories need (the store is "
                   "PostgreSQL, MLflow a server)")
    return Row(ENV_HOME, OK, f"{where}, writable")


def migration_head(versions_dir: Path) -> str | None:
    """The Alembic head of a migrations folder, read from its files (the revision nothing revises)."""
    revisions, parents = set(), set()
    for path in versions_dir.glob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        revision = re.search(r"^revision\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if not revision:
            continue
        revisions.add(revision.group(1))
        down = re.search(r"^down_revision\s*(?::[^=]+)?=\s*(.+)$", text, re.M)
        if down:
            parents.update(re.findall(r"['\"]([^'\"]+)['\"]", down.group(1)))
    heads = sorted(revisions - parents)
    return heads[0] if len(heads) == 1 else None


def _store_row(name: str, path: Path, head: str | None, what_migrates: str) -> Row:
    if not path.exists():
        return Row(name, OK, f"{path} not created yet (created at {head or 'head'} on first use)")
    try:
        revision, check = sqlite_state(path)
    except UnreadableStore as exc:
        return Row(name, FAIL, f"{path} is not a readable SQLite database ({exc})",
                   f"move it aside; {what_migrates} creates a new one")
    if check != "ok":
        return Row(name, FAIL, f"{path}: integrity check says {check!r}",
                   "restore it from a backup or move it aside (was it on a network filesystem?)")
    if head is None:
        return Row(name, WARN, f"{path} at revision {revision}; the head could not be read from the migrations",
                   "reinstall with scripts/setup.sh")
    if revision == head:
        return Row(name, OK, f"{path} at migration head {head}")
    if revision is None:
        return Row(name, WARN, f"{path} has no migration level", f"{what_migrates} migrates it to {head}")
    return Row(name, WARN, f"{path} at revision {revision}, head is {head}",
               f"{what_migrates} upgrades it (older idmctl/MLflow versions then cannot read it)")


def check_store() -> Row:
    """The store the commands will use: the team's PostgreSQL when ``IDMCTL_DB_URL`` names one (a doctor
    that read the local SQLite file said "ready" while the shared server did not answer), else SQLite."""

    head = migration_head(MIGRATIONS_DIR / "versions")
    try:
        url = shared_url()
    except UserError as exc:
        return Row("store", FAIL, exc.line().removeprefix("error: "), exc.hint or "fix IDMCTL_DB_URL")
    if url is None:
        return _store_row("store", db_path(), head, "any idmctl command")
    return _shared_store_row(url, head)


def _shared_store_row(url: str, head: str | None) -> Row:
    """Connect (read-only, 5 s timeout) and compare the schema level with the head; migrates nothing."""

    shown = redacted(url)
    conninfo = "postgresql://" + url.split("://", 1)[1]  # libpq knows no SQLAlchemy "+driver" suffix
    try:
        revision = shared_revision(conninfo)
    except ImportError:
        return Row("store", FAIL, f"{shown}: the PostgreSQL driver is missing", "pip install 'psycopg[binary]'")
    except Exception as exc:  # psycopg.Error, or a conninfo libpq cannot parse: the row says what it said
        reason = scrubbed((str(exc).strip().splitlines() or [type(exc).__name__])[0], url)
        return Row("store", FAIL, f"{shown} does not answer: {reason}",
                   f"check the server and the user, password and database in {ENV_DB_URL}, or unset it for SQLite")
    if revision == head:
        return Row("store", OK, f"{shown} at migration head {head}")
    if revision is None:
        return Row("store", WARN, f"{shown} has no migration level", f"any idmctl command migrates it to {head}")
    return Row("store", WARN, f"{shown} at revision {revision}, head is {head}", "any idmctl command upgrades it")


def _mlflow_versions_dir() -> Path | None:
    spec = importlib.util.find_spec("mlflow")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "store" / "db_migrations" / "versions"


def check_mlflow() -> Row:
    uri = mlflow_tracking_uri()
    store = sqlite_file(uri)
    if store is None:
        return Row("mlflow store", WARN, f"{redacted(uri)} (a server or another backend: not checked here)",
                   "unset MLFLOW_TRACKING_URI to use the SQLite store beside idmctl's")
    versions = _mlflow_versions_dir()
    if versions is None:
        return Row("mlflow store", FAIL, f"{uri}; mlflow is not installed", "scripts/setup.sh")
    row = _store_row("mlflow store", store, migration_head(versions),
                     "the next training run (or `idmctl ui`)")
    if row.status == OK and "not created" not in row.detail:
        row.detail += _experiment_note(store)
    return row


def _experiment_note(path: Path) -> str:

    found = mlflow_experiment(path, MLFLOW_EXPERIMENT, EXPERIMENT_KIND_TAG)
    if found is None:
        return ""
    experiment_id, runs, kind = found
    if experiment_id is None:
        return f"; no {MLFLOW_EXPERIMENT!r} experiment yet"
    # MLflow 3.17 opens the page the browser's workflow switch says (GenAI until flipped); the kind tag
    # only stops it guessing the kind. idmctl's links ask for model training themselves.
    view = ("marked model training; idmctl's links open its runs" if kind == EXPERIMENT_KIND
            else "not marked model training (`idmctl ui` marks it)")
    return f"; experiment {MLFLOW_EXPERIMENT!r} (id {experiment_id}): {runs} runs, {view}"


def _cluster() -> tuple[str, str, str]:
    """(profile name, scheduler, where the choice came from), read without validating the profile."""
    chosen = os.environ.get(ENV_CLUSTER) or "local"
    source = f"${ENV_CLUSTER}" if os.environ.get(ENV_CLUSTER) else "default"
    path = Path(chosen) if chosen.endswith((".yaml", ".yml")) else clusters_dir() / f"{chosen}.yaml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return chosen, "?", source
    match = re.search(r"^scheduler:\s*(\S+)", text, re.M)
    return chosen, match.group(1) if match else "slurm", source


def _run(argv: list[str]) -> tuple[bool, str]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    text = (out.stdout + out.stderr).strip().splitlines()
    return out.returncode == 0, text[-1] if text else f"exit {out.returncode}"


def check_slurm() -> Row:
    profile, scheduler, source = _cluster()
    tools = {tool: shutil.which(tool) for tool in ("sbatch", "sacct", "squeue")}
    missing = [tool for tool, where in tools.items() if where is None]
    cluster = f"cluster profile {profile!r} ({source}, scheduler {scheduler})"
    if scheduler == "?":
        return Row("slurm", FAIL, f"{cluster}: no such profile", f"set {ENV_CLUSTER} to one of "
                   f"{', '.join(sorted(p.stem for p in clusters_dir().glob('*.yaml')))} or a profile's path")
    from idmctl.core.profile import load_profile  # pydantic only; a profile every command would refuse is a FAIL here

    try:
        load_profile(profile)
    except UserError as exc:
        return Row("slurm", FAIL, f"{cluster}: {exc.line().removeprefix('error: ')}", "fix the cluster profile")
    if scheduler != "slurm":
        found = "none of sbatch/sacct on PATH" if len(missing) == 3 else \
            f"{', '.join(t for t in tools if tools[t])} on PATH"
        return Row("slurm", OK, f"{cluster}: jobs run on this machine; {found}")
    if missing:
        return Row("slurm", FAIL, f"{cluster}: {', '.join(missing)} not on PATH",
                   f"load Slurm's environment (module load slurm, or `. /tmp/idmctl-slurm/env` for the local "
                   f"test cluster), or {ENV_CLUSTER}=local to run jobs here")
    ping_ok, ping = _run(["scontrol", "ping"]) if shutil.which("scontrol") else (True, "no scontrol")
    acct_ok, acct = _run(["sacct", "--noheader", "-X", "-j", "1", "--format=JobID"])
    if not ping_ok or not acct_ok:
        broken = "slurmctld" if not ping_ok else "accounting (slurmdbd)"
        return Row("slurm", FAIL, f"{cluster}: {broken} unreachable: {ping if not ping_ok else acct}",
                   "check the controller/slurmdbd (scripts/slurm/up.sh for the local test cluster); "
                   "`idmctl sync` needs sacct")
    return Row("slurm", OK, f"{cluster}: sbatch at {tools['sbatch']}; controller and accounting answer")


def check_cluster_settings() -> Row:
    """What the cluster's own settings (``scontrol show config``, QoS and partition grace times) mean for
    idmctl's jobs: whether a preempted job is signalled first and has time to checkpoint, and the rest."""
    from idmctl.gate.cluster_settings import WARN as SETTING_WARN, judge, read_cluster  # start-up: Slurm profiles only

    _, scheduler, _ = _cluster()
    if scheduler != "slurm" or not shutil.which("scontrol"):
        return Row("cluster settings", OK, "not read: no Slurm here (jobs run on this machine)")
    config, qos, partitions = read_cluster()
    if not config.strip():
        return Row("cluster settings", WARN, "`scontrol show config` gave nothing: preemption notice, GraceTime "
                   "and job containers unknown", "check that slurmctld answers (`scontrol ping`)")
    findings = judge(config, qos, partitions)
    warned = [f for f in findings if f.status == SETTING_WARN]
    detail = "; ".join(f"{f.setting} {'(WARN) ' if f.status == SETTING_WARN else ''}{f.meaning}" for f in findings)
    return Row("cluster settings", WARN if warned else OK, detail, "; ".join(dict.fromkeys(f.fix for f in warned)))


RENDER_CODE = """
import json, time
started = time.perf_counter()
from trainers.sim.env import render_check
print(json.dumps({**render_check(), "seconds": time.perf_counter() - started}))
"""


def check_render() -> Row:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    gl = os.environ.get("MUJOCO_GL", "egl")
    fix = f"`{SYSTEM_DEPS}` installs Mesa's EGL (or try MUJOCO_GL=osmesa with Debian's libosmesa6)"
    try:
        out = subprocess.run([sys.executable, "-c", RENDER_CODE], capture_output=True, text=True,
                             timeout=RENDER_TIMEOUT_S, env=env, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return Row("rendering", FAIL, f"no frame after {RENDER_TIMEOUT_S:.0f} s (MUJOCO_GL={gl})", fix)
    if out.returncode != 0:
        lines = [line for line in (out.stderr or out.stdout).strip().splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit {out.returncode}"
        return Row("rendering", FAIL, f"MUJOCO_GL={gl}: {last}", fix)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return Row("rendering", OK, f"{result['size']}×{result['size']} {result['camera']} frame in {result['seconds']:.1f} s, "
               f"mean gradient {result['gradient']:.1f} (noise > {result['noise_above']:.0f}); "
               f"MUJOCO_GL={result['mujoco_gl']}, {result['gl_renderer']}")


def _space_row(name: str, path: Path, warn_below: int, why: str) -> Row:
    target = nearest_existing(path)
    try:
        stat = os.statvfs(target)
    except OSError as exc:
        return Row(name, WARN, f"{path}: {exc.strerror}", why)
    free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    detail = f"{format_bytes(free)} free of {format_bytes(total)} at {target}"
    if free < warn_below:
        return Row(name, WARN, f"{detail} (under {format_bytes(warn_below)})", why)
    return Row(name, OK, detail)


def check_shm() -> Row:
    return _space_row("/dev/shm", Path("/dev/shm"), SHM_WARN_BYTES,
                      "DataLoader workers pass batches through /dev/shm: free it or use loader.num_workers 0")


def check_scratch() -> Row:
    from ground.spec.schema import StageSpec  # start-up: pulls pydantic and yaml

    dest = Path(StageSpec.model_fields["dest"].default)
    return _space_row("scratch", dest, SCRATCH_WARN_BYTES,
                      "stage-in copies the cache here (stage.dest): free space or point stage.dest elsewhere")


def check_code_store() -> Row:
    """What the code snapshots cost: distinct file contents (their hard links cost nothing more)."""
    from idmctl.job.code import store_for, usage  # start-up: 12 more project modules only this path needs
    from idmctl.core.profile import load_profile  # start-up: pulls pydantic

    try:
        store = store_for(load_profile(None)[0])
    except Exception:  # an unreadable profile is the slurm row's finding; count the default store

        store = default_store()
    target = nearest_existing(store)
    if not target.is_dir() or not os.access(target, os.W_OK | os.X_OK):
        return Row("code store", FAIL, f"{store}: {target} is not a writable folder: submit cannot freeze the code jobs run",
                   "point the cluster profile's code_store (or IDMCTL_HOME) at a writable folder every node mounts")
    used = usage(store)
    if not used.snapshots:
        return Row("code store", OK, f"{store}: no snapshots yet (submit writes one per code version)")
    return Row("code store", OK, f"{store}: {used.snapshots} snapshot(s), {used.objects} distinct files, "
                                 f"{format_bytes(used.object_bytes)} (`idmctl gc` removes those no unfinished chain uses)")


def check_runs(mounts_text: str | None = None) -> Row:
    """Where run directories live (``ground.paths.runs_root``: the profile's ``runs_root``, else
    ``$IDMCTL_HOME/runs``), checked from here: a folder this user can write, and, on a Slurm cluster, on a
    filesystem the compute nodes mount (``doctor --nodes`` then writes there from each node)."""
    from idmctl.core.profile import load_profile  # start-up: pulls pydantic

    try:
        profile = load_profile(None)[0]
    except Exception:  # an unreadable profile is the slurm row's finding; the runs are then $IDMCTL_HOME's

        profile = None
    configured = profile.runs_root if profile is not None else None
    path = runs_root(configured)
    if not configured:
        return Row("runs", OK, f"{path}: under {ENV_HOME} (the cluster profile sets no runs_root)")
    fix = "point the cluster profile's runs_root at a folder on the shared filesystem every compute node mounts"
    if path.exists() and not path.is_dir():
        return Row("runs", FAIL, f"{path} (the profile's runs_root) is a file, not a folder", fix)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Row("runs", FAIL, f"{path} (the profile's runs_root) is not writable ({exc.strerror or exc})", fix)
    point, fstype = mount_of(path.resolve(), mounts_text)
    where = f"{path} (the profile's runs_root; {fstype} on {point}), writable"
    if fstype in NETWORK_FILESYSTEMS or fstype.startswith("nfs"):
        return Row("runs", OK, f"{where}: a shared filesystem, as jobs on the compute nodes need "
                               "(`doctor --nodes` writes there from each node)")
    if profile is not None and profile.scheduler == "slurm":
        return Row("runs", WARN, f"{where}: a local filesystem; jobs on other hosts cannot write their run "
                                 "directories there (fine only where the nodes are this host)", fix)
    return Row("runs", OK, where)


CHECKS: tuple[tuple[str, Callable[[], Row]], ...] = (
    ("python", check_python), ("packages", check_packages), (ENV_HOME, check_home), ("store", check_store),
    ("mlflow store", check_mlflow), ("slurm", check_slurm), ("cluster settings", check_cluster_settings),
    ("rendering", check_render), ("/dev/shm", check_shm),
    ("scratch", check_scratch), ("code store", check_code_store), ("runs", check_runs),
)


@dataclass(frozen=True)
class NodeProbe:
    """``doctor --nodes``: probe every node of a partition from the node itself."""

    partition: str | None = None
    """The partition whose nodes are probed (None: the cluster's default)."""
    qos: str | None = None
    """The QoS the probe jobs run under (None: the user's default)."""
    deadline_s: float = 120.0
    """How long to wait for every node's answer before reporting a node as never started."""
    cache: str | None = None
    """A cache mount every node must see (e.g. the spec's cache root); None: not checked."""
    scratch: str | None = None
    """Where jobs stage (``$SLURM_TMPDIR`` expanded on the node); None: stage.dest's default."""


def check_nodes(request: NodeProbe) -> list[Row]:
    """One row per node: what a job there can read, write and reach (idmctl.ops.node_probe)."""
    from ground.spec.schema import StageSpec  # start-up: pydantic and yaml, only for this option
    from idmctl.core.profile import load_profile  # start-up: pydantic, only for this option
    from idmctl.job.code import store_for  # start-up: 12 more project modules, only for this option
    from idmctl.ops.node_probe import probe_nodes  # start-up: only for this option

    _, scheduler, _ = _cluster()
    if scheduler != "slurm" or not shutil.which("sbatch"):
        return [Row("nodes", FAIL, "--nodes needs a Slurm cluster profile and sbatch on PATH",
                    f"set {ENV_CLUSTER} to the cluster's profile and load Slurm's environment")]
    scratch = request.scratch or str(StageSpec.model_fields["dest"].default)
    profile = load_profile(None)[0]
    code_store = store_for(profile)
    code_store.mkdir(parents=True, exist_ok=True)
    # The probe reads and writes where run directories live, and answers there: the profile's runs_root
    # when it names one (on the shared filesystem, while $IDMCTL_HOME may be the login node's own disk).
    probe_home = runs_root(profile.runs_root) if profile.runs_root else home()
    probe_home.mkdir(parents=True, exist_ok=True)
    found = probe_nodes(home=probe_home, code_store=code_store, scratch=scratch, cache=request.cache,
                        partition=request.partition, qos=request.qos, deadline_s=request.deadline_s)
    return [Row(f"node {row.node}", row.status, row.detail, row.fix) for row in found]


def run_doctor(*, render: bool = True, debug: bool = False, nodes: NodeProbe | None = None) -> DoctorReport:
    started = time.perf_counter()
    rows = []
    for name, check in CHECKS:
        if name == "rendering" and not render:
            rows.append(Row(name, SKIP, "not checked (--no-render)"))
            continue
        try:
            rows.append(check())
        except Exception as exc:  # a check that breaks is itself a finding, not a crash of the doctor
            if debug:
                raise
            rows.append(Row(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}",
                            "run `idmctl --debug doctor` and report it"))
    if nodes is not None:
        rows.extend(check_nodes(nodes))
    return DoctorReport(rows, time.perf_counter() - started)

"""Storage and services as a compute node sees them: ``idmctl doctor --nodes``.

A login node seeing a folder proves nothing about the nodes that run the jobs. So doctor submits a tiny
job per node (one task, two minutes, 100 MB) that runs :func:`probe` there and writes one JSON object
beside the run directories: can the node read and write ``$IDMCTL_HOME`` (run directories, job logs),
read the code store (the snapshot jobs run), see the cache mount, reach the store and the MLflow
server, write its own scratch (``$SLURM_TMPDIR`` and other variables expanded on the node), and is that
scratch its own or shared. The login side (:func:`probe_nodes`) waits for every answer with a deadline,
and a node whose probe never started is a row too, naming the partition and Slurm's reason.

The node side imports the standard library and ``ground.contract`` only: it runs before anything else works there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ground.contract import ENV_DB_URL

OK, WARN, FAIL = "OK", "WARN", "FAIL"
PROBE_TIME = "0:02:00"
PROBE_MEM = "100M"
CONNECT_TIMEOUT_S = 5.0
MARKER_PREFIX = ".idmctl-probe-"


def _node_name() -> str:
    """Slurm's name of this node (several slurmd may share one host, as on the local test cluster)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


@dataclass(frozen=True)
class NodeRow:
    """What one node could do."""

    node: str
    status: str
    """OK / WARN / FAIL: the worst of the node's checks; FAIL also when its probe never ran."""
    detail: str
    """Each check in a few words, ``;``-separated."""
    fix: str = ""


# ----- on the node -------------------------------------------------------------------------------------

def _check_dir(path: str, *, write: bool) -> tuple[str, str]:
    target = Path(os.path.expandvars(path))
    if not target.is_dir():
        return FAIL, f"{target} is not a folder here"
    if not os.access(target, os.R_OK | os.X_OK):
        return FAIL, f"{target} is not readable here"
    if write:
        try:
            probe = target / f"{MARKER_PREFIX}{_node_name()}-{os.getpid()}"
            probe.write_text("probe")
            probe.unlink()
        except OSError as exc:
            return FAIL, f"{target} is not writable here ({exc.strerror or exc})"
    return OK, f"{target} {'read/write' if write else 'readable'}"


def _reach(url: str) -> tuple[str, str]:
    """A TCP connection to the URL's host and port (PostgreSQL, MLflow) within a few seconds; a
    ``sqlite:///`` or ``file:`` URL is a file that must be readable here. Never prints credentials."""
    if url.startswith(("sqlite:", "file:")):
        path = url.split(":///", 1)[-1] if ":///" in url else url.split(":", 1)[-1]
        path = "/" + path.lstrip("/")
        return (OK, f"{path} readable") if os.access(path, os.R_OK) else (FAIL, f"{path} not readable here")
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or {"postgresql": 5432, "http": 80, "https": 443}.get(parts.scheme.split("+")[0], 0)
    where = f"{parts.scheme}://{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        return FAIL, f"{where} unreachable ({exc.strerror or exc})"
    if parts.scheme in ("http", "https"):
        try:
            urllib.request.urlopen(f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/health",
                                   timeout=CONNECT_TIMEOUT_S).read(64)
        except (urllib.error.URLError, OSError) as exc:
            return FAIL, f"{where} connects but /health fails ({getattr(exc, 'reason', exc)})"
    return OK, f"{where} reachable"


def probe(home: str, code_store: str, scratch: str, cache: str | None, store_url: str | None,
          mlflow_url: str | None, marker: str) -> dict:
    """Every check from this node; ``marker`` names this run of probes so that a scratch shared between
    nodes (or with the login host) is seen: each node leaves a marker file and looks for the others'."""
    checks: dict[str, tuple[str, str]] = {
        "home": _check_dir(home, write=True),
        "code store": _check_dir(code_store, write=False),
    }
    if cache:
        checks["cache"] = _check_dir(cache, write=False)
    checks["store"] = _reach(store_url) if store_url else _reach(f"sqlite:///{Path(home) / 'idmctl.sqlite'}") \
        if (Path(home) / "idmctl.sqlite").exists() else (OK, "embedded SQLite: read on the login node only")
    if mlflow_url:
        checks["mlflow"] = _reach(mlflow_url)
    scratch_dir = Path(os.path.expandvars(scratch))
    try:
        scratch_dir.mkdir(parents=True, exist_ok=True)
        (scratch_dir / f"{MARKER_PREFIX}{marker}-{_node_name()}").write_text(_node_name())
        free = shutil.disk_usage(scratch_dir).free
        checks["scratch"] = (OK, f"{scratch_dir} writable, {free / 1e9:,.1f} GB free")
    except OSError as exc:
        checks["scratch"] = (FAIL, f"{scratch_dir} not writable here ({exc.strerror or exc})")
    return {"node": _node_name(), "scratch": str(scratch_dir),
            "checks": {name: {"status": status, "detail": detail} for name, (status, detail) in checks.items()}}


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m idmctl.ops.node_probe")
    for flag in ("--out", "--home", "--code-store", "--scratch", "--marker"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--cache")
    args = parser.parse_args(argv)
    from_env = os.environ.get(ENV_DB_URL) or None
    tracking = os.environ.get("MLFLOW_TRACKING_URI") or None
    result = probe(args.home, args.code_store, args.scratch, args.cache, from_env,
                   tracking if tracking and not tracking.startswith("sqlite:") else None, args.marker)
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)  # never a half-written answer read as a whole one
    return 0


# ----- on the login node --------------------------------------------------------------------------------

def partition_nodes(partition: str | None) -> list[str]:
    """The partition's nodes (the default partition's when None), one name each."""
    args = ["sinfo", "-h", "-N", "-o", "%N"] + (["-p", partition] if partition else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=30)
    return sorted(set(out.stdout.split()))


def _sbatch(node: str, out: Path, log: Path, argv: list[str], partition: str | None, qos: str | None,
            extra: list[str]) -> str:
    command = " ".join([sys.executable, "-m", "idmctl.ops.node_probe", *argv, "--out", str(out)])
    args = ["sbatch", "--parsable", "-J", "idmctl-probe", "-w", node, "-N", "1", "-n", "1", "-c", "1",
            f"--time={PROBE_TIME}", f"--mem={PROBE_MEM}", "-o", str(log), "--chdir", str(Path(__file__).resolve()
                                                                                      .parents[2])]
    args += ([f"--partition={partition}"] if partition else []) + ([f"--qos={qos}"] if qos else []) + extra
    done = subprocess.run([*args, "--wrap", f"exec {command}"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError((done.stderr or done.stdout).strip().splitlines()[-1])
    return done.stdout.strip().split(";")[0]


def _pending_reason(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or "not in the queue"


def probe_nodes(*, home: Path, code_store: Path, scratch: str, cache: str | None, partition: str | None,
                qos: str | None, deadline_s: float, extra_sbatch: list[str] | None = None,
                poll_s: float = 1.0) -> list[NodeRow]:
    """One probe job per node of the partition, each answer judged; every job still queued at the
    deadline is cancelled and reported. ``extra_sbatch`` is for tests (e.g. a begin time in the future)."""
    nodes = partition_nodes(partition)
    where = f"partition {partition}" if partition else "the default partition"
    if not nodes:
        return [NodeRow("-", FAIL, f"no nodes in {where}", "name a partition with `--partition`")]
    marker = f"{os.getpid()}-{int(time.time())}"
    folder = home / "probes" / marker
    folder.mkdir(parents=True, exist_ok=True)
    argv = ["--home", str(home), "--code-store", str(code_store), "--scratch", scratch, "--marker", marker]
    argv += ["--cache", cache] if cache else []
    jobs: dict[str, str] = {}
    rows: dict[str, NodeRow] = {}
    for node in nodes:
        try:
            jobs[node] = _sbatch(node, folder / f"{node}.json", folder / f"{node}.log", argv, partition, qos,
                                 extra_sbatch or [])
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            rows[node] = NodeRow(node, FAIL, f"probe job refused: {exc}", f"check {where} and the QoS")
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and any((folder / f"{n}.json").exists() is False for n in jobs):
        time.sleep(poll_s)
    for node, job_id in jobs.items():
        answer = folder / f"{node}.json"
        if answer.exists():
            rows[node] = _judge(json.loads(answer.read_text()), marker, scratch)
            continue
        reason = _pending_reason(job_id)
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
        rows[node] = NodeRow(node, FAIL, f"probe job {job_id} gave no answer after {deadline_s:.0f} s in {where} "
                             f"({reason})", "the node may be busy or down (`sinfo -N`); run again with a longer "
                             "`--nodes-deadline`, or another `--partition`")
    _remove_markers(scratch, marker)
    return [rows[node] for node in nodes]


def _judge(answer: dict, marker: str, scratch: str) -> NodeRow:
    """One node's row from its answer (the worst check wins)."""
    checks = answer["checks"]
    parts = [f"{name}: {c['detail']}" for name, c in checks.items()]
    failed = [name for name, c in checks.items() if c["status"] == FAIL]
    fix = ""
    status = FAIL if failed else OK
    if failed:
        fix = (f"{', '.join(failed)} must be reachable from every compute node: put IDMCTL_HOME and the code store "
               "on a filesystem the nodes mount, open the store's and MLflow's ports to the nodes")
    # Every probe of this run left a marker named after its node in its own scratch: seen from here, one
    # folder holding two nodes' markers is one folder the nodes share (NFS, or one host), not node-local.
    scratch_dir = Path(answer.get("scratch") or scratch)
    seen = sorted(p.name.removeprefix(f"{MARKER_PREFIX}{marker}-") for p in scratch_dir.glob(f"{MARKER_PREFIX}{marker}-*")) \
        if "scratch" not in failed and scratch_dir.is_dir() else []
    if len(seen) > 1:
        parts.append(f"scratch {scratch_dir} is shared by {', '.join(seen)}")
        if status == OK:
            status = WARN
            fix = "stage to node-local disk ($SLURM_TMPDIR or the node's NVMe): a shared scratch is not a stage-in"
    return NodeRow(answer.get("node", "?"), status, "; ".join(parts), fix)


def _remove_markers(scratch: str, marker: str) -> None:
    folder = Path(os.path.expandvars(scratch))
    for path in folder.glob(f"{MARKER_PREFIX}{marker}-*") if folder.is_dir() else []:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(_main())

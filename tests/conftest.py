"""Shared fixtures: every test gets its own ``$IDMCTL_HOME``; CLI tests drive typer's CliRunner; tests on
the shared local Slurm cluster take ``local_slurm`` (or ``slurm_home``) and run one at a time.

scripts/test.sh runs the suite on four pytest-xdist workers (``--dist loadgroup``), each with a local
Slurm cluster of its own (tests/slurm_support.py points worker gwK at the K-th of ``IDMCTL_SLURM_ROOTS``).
Each worker is its own process with its own temporary directory, so environment variables, the working
directory and module-level caches never cross workers; what the workers do share is the machine:
PostgreSQL (each test gets a database of its own: tests/pg_support.py), ports (always picked free, never
fixed) and /dev/shm. A worker runs one test at a time, so a test that stops slurmdbd, changes a QoS or
fills the queue never overlaps another job test on its cluster. With one cluster for all workers (a run
that brought up one by hand, or ``-n 3``), every ``slurm``-marked test that runs jobs joins one
``xdist_group`` (slurm_support.SLURM_GROUP) instead: one worker runs them one after another. A test that
only reads the cluster is marked ``cluster_reader``: it stays out of the group and runs on either worker,
beside the job tests, holding the cluster's state lock shared so that it never runs during a change
(slurm_support.cluster_changing).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ground.startup import settled, starting

# OpenMP threads that finish a parallel region sleep at once instead of spinning, waiting for the next.
# libgomp's default is to spin (up to 300,000 iterations a wait while threads ≤ cores), and on this
# suite's two cores, shared by four workers and the trainers, builders and jobs they start, a spinning
# thread only takes the core from another process: perf over a whole run (2026-12-07) found 10 % of all
# CPU samples spinning in libgomp, most in the workers' in-process builds and the latent builders.
# Set before any test module loads torch (libgomp reads it once, at load), and inherited by every process
# the tests start, Slurm jobs included (sbatch exports the submitting environment).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Collection imports torch, MLflow, diffusers and robosuite through the test modules: each worker starts
# as a trainer does, with the collector off until then (ground/startup.py), and collects again afterwards.
starting()

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from ground.contract import ENV_CLUSTER, ENV_EXPERIMENTS, ENV_HOME, ENV_NOTIFY  # noqa: E402
from slurm_support import cluster_group_marks, cluster_reading  # noqa: E402

# Tests share helpers by module name across the mirrored folders (tests/idmctl/ops/test_eval_jobs.py:
# `from test_train import run_trainer`, which lives in tests/trainers/): every test folder is on sys.path
# before collection starts, so the order in which pytest reaches the folders does not matter. Appended,
# so nothing here can shadow a package.
for _folder in sorted({str(found.parent) for found in Path(__file__).parent.rglob("test_*.py")}):
    if _folder not in sys.path:
        sys.path.append(_folder)

REPO = Path(__file__).resolve().parent.parent


# xdist's workers start with COLUMNS=80 and LINES=24 in their environment where the main process has
# neither: the CLI's console would wrap at 80 columns instead of the 200 it uses when piped
# (idmctl/cli/output.py), and a test reading a long line (`cache inspect` on a deep tmp path) failed only
# on two workers. Each worker gets the main process's values back before any test module imports idmctl.
TERMINAL_SIZE = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    node.workerinput["terminal_size"] = {name: os.environ.get(name) for name in TERMINAL_SIZE}


def pytest_configure(config: pytest.Config) -> None:
    sizes = getattr(config, "workerinput", {}).get("terminal_size")
    for name, value in (sizes or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    # Before every other implementation: `-m` deselects by these marks, xdist reads the groups.
    for item in items:
        if "local_slurm" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slurm") is None:
            item.add_marker(pytest.mark.slurm)
        if (item.get_closest_marker("slurm") is not None and item.get_closest_marker("xdist_group") is None
                and item.get_closest_marker("cluster_reader") is None):
            for mark in cluster_group_marks():
                item.add_marker(mark)
    yield
    _longest_first(items)
    if config.getoption("loadgroup", default=False):
        for item in items:
            _group_in_node_id(item)


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _import_what_every_worker_imports()
    settled()


def _import_what_every_worker_imports() -> None:
    """MLflow, Fabric, diffusers and robosuite, imported the way the product imports them. The product keeps
    them out of start-up (inside the functions that need them), so collection leaves them out too; but every
    worker's tests import them all within its first minutes: ~4,200 modules, whose ~330,000 objects every
    later full collection walked again (25.9 s of the four workers' CPU in full collections on c182c3f, with
    ~790,000 unfrozen objects each at the end). Imported here, with the collector still off, they join what
    ``settled()`` freezes. Only in a worker: a run of one test here (``-k``) imports no more than it needs."""
    import lightning_fabric  # noqa: F401  (torch._dynamo and sympy come with it)
    import mlflow  # noqa: F401
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel  # noqa: F401  (scipy.stats with them)
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: F401

    from trainers.sim.env import prepare_robosuite

    prepare_robosuite()  # as make_env does before its first import of robosuite: renderer and log filter
    from robosuite.controllers import load_composite_controller_config  # noqa: F401


def _longest_first(items: list[pytest.Item]) -> None:
    """The `slow` and `slurm` tests first, each part in its collection order. xdist hands a worker its next
    test when it runs low, in this order, so a long test collected last (the trainer tests sit at the end of
    the tree) ran alone while the other workers had finished: the 84 such tests held 2,750 s of the suite's
    3,530 s of test time (-n 3, 80 tests ≥ 15 s). Started first, they finish beside the short ones."""
    def is_long(item: pytest.Item) -> bool:
        return item.get_closest_marker("slow") is not None or item.get_closest_marker("slurm") is not None

    items[:] = [item for item in items if is_long(item)] + [item for item in items if not is_long(item)]


def _group_in_node_id(item: pytest.Item) -> None:
    """xdist's loadgroup scheduler reads a test's group from its node id (``…::test@local_slurm``), which
    xdist 3.8 writes into ``item._nodeid``; pytest 9.2's structured node ids no longer read that field
    (a pytest-xdist bug), so every group was silently ignored and two cluster tests ran at once on
    the two workers (seen: test_build_jobs' preempted and parallel builds side by side). Write the
    suffix where pytest reads the id, as the upstream fix does; a no-op where xdist already did."""
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    suffix = "@" + "_".join(names)
    if not names or item.nodeid.endswith(suffix):
        return
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(item.nodeid + suffix)
    else:
        item._nodeid = item.nodeid + suffix


@pytest.fixture(autouse=True)
def idmctl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "idmctl_home"
    monkeypatch.setenv(ENV_HOME, str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(ENV_CLUSTER, raising=False)
    monkeypatch.delenv(ENV_EXPERIMENTS, raising=False)
    return home


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Run the test on the embedded SQLite store and on a fresh database of the real PostgreSQL
    (IDMCTL_DB_URL, as a team sets it): yields the backend's name."""
    from ground.contract import ENV_DB_URL

    if request.param == "sqlite":
        monkeypatch.delenv(ENV_DB_URL, raising=False)
        yield "sqlite"
        return
    from pg_support import fresh_database

    with fresh_database() as url:
        monkeypatch.setenv(ENV_DB_URL, url)
        yield "postgresql"


@pytest.fixture(autouse=True)
def _no_shared_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own IDMCTL_DB_URL must never receive test rows.
    from ground.contract import ENV_DB_URL

    monkeypatch.delenv(ENV_DB_URL, raising=False)
    # Nor a developer's own notification URLs (IDMCTL_NOTIFY) any test message.
    monkeypatch.delenv(ENV_NOTIFY, raising=False)


@pytest.fixture(autouse=True)
def signal_dispositions_kept():
    """Every subprocess a test starts inherits the pytest process's signal dispositions: a test that
    leaves SIGTERM ignored makes every later trainer, job script and CPU hog unstoppable by TERM."""
    import signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    changed = [sig.name for sig, handler in before.items() if signal.getsignal(sig) is not handler]
    for sig, handler in before.items():
        signal.signal(sig, handler)
    assert not changed, f"the test left {', '.join(changed)} handled differently in the pytest process"


@pytest.fixture(autouse=True)
def torch_threads_kept() -> Iterator[None]:
    """A data-plane function called in the test's process may size torch's threads for the whole process
    (a builder rank takes one per CPU it may use; a benchmark measures on one): the worker's later tests,
    and any child it forks, get the count it had. A forked child computing on more threads than the
    parent had set up hangs."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    if before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture
def cli():
    """Invoke the real CLI in-process: ``cli("exp", "list")`` → click Result."""
    from idmctl.cli.app import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory):
    """A tiny real data set for the routed DiT, shared by the session: a robomimic HDF5 (8 demos of 12
    steps; mask/train 6, mask/valid 2) and safetensors hidden caches (4 layers × 6 frames × 2×2 × 16,
    float32), written with cache.episodes / cache.hidden. ``.spec_path`` is a runnable spec over it;
    ``.spec_file(dir, name, train={...}, ...)`` writes variants. See trainers/tiny_data.py."""
    from trainers.tiny_data import TinyCache

    return TinyCache.create(tmp_path_factory.mktemp("tiny_cache"))


@pytest.fixture
def local_slurm(monkeypatch: pytest.MonkeyPatch) -> str:
    """The shared local Slurm cluster (scripts/slurm/up.sh) for this test: ``SLURM_CONF`` and
    ``IDMCTL_CLUSTER=local-slurm`` set; returns the conf's path. Without the cluster the test is skipped,
    in CI (``$CI`` set) it fails. A test taking this fixture is a ``slurm`` test (marked at collection)."""
    from slurm_support import slurm_conf

    conf = slurm_conf()
    monkeypatch.setenv("SLURM_CONF", conf)
    monkeypatch.setenv(ENV_CLUSTER, "local-slurm")
    return conf


@pytest.fixture(autouse=True)
def cluster_reader(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``cluster_reader`` only reads the shared cluster (squeue/sacct/sacctmgr queries,
    ``sbatch --test-only``, a copy of slurm.conf with dead ports): it runs outside the job tests' xdist
    group, on either worker, and holds the cluster's state lock shared for its run, so that no test stops
    a daemon, edits a QoS or takes a node down while it reads. Every other test passes straight through."""
    if request.node.get_closest_marker("cluster_reader") is None:
        yield
        return
    with cluster_reading():
        yield


@pytest.fixture
def slurm_home(local_slurm: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``local_slurm`` with an ``$IDMCTL_HOME`` of this test's own outside pytest's temporary tree,
    removed afterwards: jobs outlive a test's assertions by seconds, and other pytest sessions on a
    shared host prune old pytest-of-<user> directories under a running job's feet."""
    home = Path(tempfile.mkdtemp(prefix="idmctl-slurm-test-"))
    monkeypatch.setenv(ENV_HOME, str(home))
    yield home
    shutil.rmtree(home, ignore_errors=True)

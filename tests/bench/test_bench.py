"""The benchmark suite stays runnable: ``python -m bench.run --fast`` writes every section, each with a
table or a "not measured: why" line. No timing is asserted (shared CI machines drift)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.common import Figure
from bench.run import MODULES, _section
from slurm_support import cluster_group_marks

REPO = Path(__file__).resolve().parents[2]


def test_section_states_medians_ratio_and_what_was_not_measured():
    figure = Figure("idmctl failures", "s", [0.3, 0.1, 0.2], "mlflow runs list", [0.9, 0.6, 0.3], target="< 0.5 s")
    lines = _section("CLI latency", [figure, "not measured: submitit is not installed"])
    assert lines[:4] == ["## CLI latency", "",
                         "| figure | median | min | max | n | reference (median) | ratio | target | verdict | note |",
                         "|---|---|---|---|---|---|---|---|---|---|"]
    assert lines[4] == ("| idmctl failures | 200.0 ms | 100.0 ms | 300.0 ms | 3 | mlflow runs list: 600.0 ms | 0.33× | "
                        "< 0.5 s | met |  |")
    assert lines[-2:] == ["not measured: submitit is not installed", ""]


@pytest.mark.parametrize(("figure", "verdict"), [
    (Figure("f", "s", [0.4], target="< 0.5 s"), "met"),
    (Figure("f", "s", [0.6], target="< 500 ms"), "MISSED"),
    (Figure("f", "s", [0.4], "mlflow", [1.0], target="< 0.5 s and ≥ 3× faster than the mlflow listing"), "MISSED"),
    (Figure("f", "s", [0.3], "mlflow", [1.0], target="< 0.5 s and ≥ 3× faster than the mlflow listing"), "met"),
    (Figure("f", "MB/s", [70.0], "sequential", [100.0], higher_is_better=True, target="≥ 0.8× sequential"), "MISSED"),
    (Figure("f", "×", [1.9, 1.95], target="≥ 1.8× on two cores"), "met"),
    (Figure("f", "s", [0.27], "submitit", [0.13], target="idmctl ≤ submitit + 0.15 s, all checks included"), "met"),
    (Figure("f", "s", [0.30], "submitit", [0.13], target="idmctl ≤ submitit + 0.15 s, all checks included"), "MISSED"),
    (Figure("f", "s", [0.3], target="interactive (a few × interpreter start)"), ""),
    (Figure("f", "%", [3.0, 4.9], target="≤ 5%"), "met"),
    (Figure("f", "%", [3.0, 5.1, 6.0], target="≤ 5%"), "MISSED"),
    (Figure("f", "fraction", [0.03], target="≤ 5%"), ""),
])
def test_targets_that_are_comparisons_get_a_verdict(figure: Figure, verdict: str) -> None:
    assert figure.verdict == verdict


def test_counts_print_as_whole_numbers_with_their_unit():
    lines = _section("Hidden-cache reads", [Figure("bytes from disk", "B", [1_327_104.0], "slice bytes", [1_310_720.0])])
    assert "| bytes from disk | 1,327,104 B | 1,327,104 B | 1,327,104 B | 1 | slice bytes: 1,310,720 B | 1.01× |" in lines[4]


def test_gpu_module_says_why_without_a_gpu():
    import torch

    from bench import gpu

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: bench.gpu measures instead")
    result = gpu.run(fast=True)
    if gpu.RECORDED.exists():
        assert [f.name for f in result][0] == "latent_c_n4 peak GPU memory (training step)"
    else:
        assert result == "no GPU on this machine (bench/gpu.sh is the prepared script for a lent device)"


def test_gpu_proof_says_why_without_a_gpu(monkeypatch: pytest.MonkeyPatch):
    import torch

    from bench import gpu, gpu_proof

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: bench.gpu_proof measures instead")
    monkeypatch.delenv(gpu.RESULTS_ENV, raising=False)
    result = gpu_proof.run(fast=True)
    if gpu_proof.RECORDED.exists() and json.loads(gpu_proof.RECORDED.read_text())["measured_on_gpu"]:
        assert [f.name for f in result][0] == "latent_c_n4 smoke peak memory (B=2)"
    else:
        assert result == gpu_proof.NO_GPU


# The modules that time real sbatch/sacct calls on the shared cluster (the others never reach it). Those
# that put jobs on it join the cluster tests' xdist group unless each worker has a cluster of its own
# (submit_overhead's real submissions ask for core-own, which may preempt a job test's sub job); one that
# only reads the cluster (sync_jobs: one sacct and one scontrol per sync of recorded jobs, nothing
# submitted) holds the cluster's state lock shared and runs on either worker, like the other modules.
ON_THE_SHARED_CLUSTER = {"bench.build_jobs", "bench.sync_jobs", "bench.submit_overhead"}
READS_THE_SHARED_CLUSTER = {"bench.sync_jobs"}


def _cluster_marks(module: str) -> list[pytest.MarkDecorator]:
    if module in READS_THE_SHARED_CLUSTER:
        return [pytest.mark.cluster_reader]
    return cluster_group_marks() if module in ON_THE_SHARED_CLUSTER else []


def test_the_modules_on_the_shared_cluster_are_the_ones_that_read_slurm_conf() -> None:
    reads = {name for _, name in MODULES if "SLURM_CONF" in (REPO / (name.replace(".", "/") + ".py")).read_text()}
    assert reads == ON_THE_SHARED_CLUSTER and READS_THE_SHARED_CLUSTER <= ON_THE_SHARED_CLUSTER


def _assert_one_section(out: Path, title: str) -> None:
    """``out`` is a fast-mode BENCHMARKS file holding exactly the section ``title``, with a table or a
    "not measured" line, and its JSON holds no module error."""
    text = out.read_text()
    assert text.startswith("# Benchmarks\n") and "- command: `python -m bench.run --fast`" in text
    sections = text.split("\n## ")[1:]
    assert [s.splitlines()[0] for s in sections] == [title]
    body = sections[0].split("\n", 1)[1]
    assert "| figure | median |" in body or "\nnot measured: " in "\n" + body.strip(), sections[0]
    assert "not measured: `bench." not in body, f"a bench module failed to import:\n{sections[0]}"
    results = json.loads(out.with_suffix(".json").read_text())
    assert not [name for name, value in results.items() if isinstance(value, dict) and "error" in value], results


@pytest.fixture
def process_state_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A benchmark run in the test's process may set ``$IDMCTL_HOME`` and other variables for the
    commands it times: every later test on this worker gets the environment and the working directory
    back (torch's thread count, which the read benchmarks set to one, comes back for every test:
    tests/conftest.py)."""
    environ = dict(os.environ)
    monkeypatch.chdir(REPO)  # bench.run names the commit of the working directory's tree
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the commands the modules time, as `bench.run` in CI
    yield
    os.environ.clear()
    os.environ.update(environ)


@pytest.mark.slow
@pytest.mark.parametrize(("title", "module"), [
    pytest.param(title, module, id=module.removeprefix("bench."), marks=_cluster_marks(module))
    for title, module in MODULES])
def test_fast_mode_writes_each_section(title: str, module: str, tmp_path: Path, process_state_restored: None) -> None:
    """`bench.run --fast --only` per module: the same loop as the whole run, one module a test, so
    the modules (519 s as one test on 2 cores at load 5) spread over the suite's workers. The loop runs
    in this process: a `python -m bench.run` of its own cost ~8 CPU s of imports per module, which the
    worker has already paid (the command line itself is the next test's)."""
    from bench.run import main

    out = tmp_path / "B.md"
    assert main(["--fast", "--only", module.removeprefix("bench."), "--out", str(out)]) == 0
    _assert_one_section(out, title)


def test_the_command_line_writes_the_sections_it_is_given(tmp_path: Path) -> None:
    """``python -m bench.run --fast --only gpu``, the command CI's fast mode is, as its own process: the
    module without a GPU says why in one line."""
    out = tmp_path / "B.md"
    done = subprocess.run([sys.executable, "-m", "bench.run", "--fast", "--only", "gpu", "--out", str(out)], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_one_section(out, dict((module, title) for title, module in MODULES)["bench.gpu"])


def test_a_pending_job_in_the_way_of_the_build_rounds_is_named_with_how_to_clear_it(local_slurm: str,
                                                                                    tmp_path: Path) -> None:
    """bench.build_jobs waits for idle n1/n2 and an empty queue before each round; a held job (a script
    killed before its scancel left one) must be named by id, owner and reason, not counted."""
    from bench.build_jobs import _idle_nodes

    held = subprocess.run(["sbatch", "--parsable", "--hold", "-J", "bench-in-the-way", "-o", str(tmp_path / "o.log"),
                           "--wrap", "true"], capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    job = held.split(";")[0]
    try:
        with pytest.raises(RuntimeError) as raised:
            _idle_nodes(timeout_s=0)
    finally:
        subprocess.run(["scancel", job], timeout=60, check=True)
    message = str(raised.value)
    assert message.startswith("n1/n2 not idle within 0 s: ")
    assert f"pending: job {job} (" in message and "bench-in-the-way" in message, message
    assert message.endswith(f"(release or cancel them: scancel {job})"), message

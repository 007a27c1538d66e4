"""``idmctl doctor --nodes``: a probe job per node of the local cluster (n1, n2) reports what a job there
can read, write and reach; a probe that never starts is a row naming the partition after its deadline."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ground.contract import ENV_DB_URL


def _node_rows(result) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {row["name"]: row for row in json.loads(result.output)["rows"] if row["name"].startswith("node ")}


@pytest.mark.slow
def test_every_node_reaches_the_shared_store_and_reads_the_cache_and_its_scratch_is_shared(
        cli, slurm_home: Path, tmp_path: Path, monkeypatch) -> None:
    pg_url = os.environ.get("IDMCTL_TEST_PG_URL")
    if pg_url:
        monkeypatch.setenv(ENV_DB_URL, pg_url)
    cache = tmp_path / "cache"
    cache.mkdir()
    scratch = slurm_home / "scratch"  # this test's own: other tests' probes may be using the default one now
    result = cli("doctor", "--json", "--no-render", "--nodes", "--cache", str(cache), "--scratch", str(scratch),
                 "--nodes-deadline", "90s")
    rows = _node_rows(result)
    assert sorted(rows) == ["node n1", "node n2"], result.output
    for row in rows.values():
        assert f"home: {slurm_home} read/write" in row["detail"]
        assert f"cache: {cache} readable" in row["detail"]
        if pg_url:
            assert "store: postgresql://127.0.0.1:15432 reachable" in row["detail"]
        # both nodes are slurmd processes of this one host: their /tmp is one folder, and the probe says so
        assert f"scratch {scratch} is shared by n1, n2" in row["detail"]
        assert row["status"] == "WARN" and "node-local disk" in row["fix"]
    assert not list(scratch.glob(".idmctl-probe-*"))  # markers removed


@pytest.mark.slow
def test_a_store_the_nodes_cannot_reach_and_a_missing_cache_fail_with_the_fix_and_no_secret(
        cli, slurm_home: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_DB_URL, "postgresql://idmctl:s3cret-pw@127.0.0.1:1/idmctl")
    result = cli("doctor", "--json", "--no-render", "--nodes", "--cache", str(tmp_path / "no-such-mount"),
                 "--scratch", str(slurm_home / "scratch"), "--nodes-deadline", "90s")
    assert result.exit_code == 1, result.output
    assert "s3cret-pw" not in result.output
    for row in _node_rows(result).values():
        assert row["status"] == "FAIL"
        assert "store: postgresql://127.0.0.1:1 unreachable" in row["detail"]
        assert f"cache: {tmp_path / 'no-such-mount'} is not a folder here" in row["detail"]
        assert row["fix"].startswith("cache, store must be reachable from every compute node")


def test_a_probe_that_never_starts_is_reported_after_its_deadline_naming_the_partition(
        slurm_home: Path) -> None:
    from idmctl.ops.node_probe import FAIL, probe_nodes

    code = slurm_home / "code"
    code.mkdir()
    rows = probe_nodes(home=slurm_home, code_store=code, scratch=str(slurm_home / "scratch"), cache=None,
                       partition="main", qos=None, deadline_s=3, extra_sbatch=["--begin=now+1hour"])
    assert [row.node for row in rows] == ["n1", "n2"]
    for row in rows:
        assert row.status == FAIL
        assert "gave no answer after 3 s in partition main (PENDING BeginTime)" in row.detail
    left = subprocess.run(["squeue", "-h", "-n", "idmctl-probe", "-o", "%i %T"], capture_output=True, text=True)
    assert "PENDING" not in left.stdout  # the probes that never started were cancelled


def test_a_deadline_that_is_no_time_is_one_line(cli) -> None:
    result = cli("doctor", "--nodes", "--nodes-deadline", "0s")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["error: --nodes-deadline: '0s' is no time to wait (e.g. 90s or 2m)"]

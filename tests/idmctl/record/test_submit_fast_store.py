"""The submit path writes its rows with plain sqlite3 (idmctl/record/fast.py) and never imports the ORM
or torch; the ORM reads those rows exactly as if it had written them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from ground.contract import ENV_HOME

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import json, runpy, sys
sys.argv = ["idmctl", *sys.argv[1:]]
try:
    runpy.run_module("idmctl", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"modules": sorted(m for m in ("sqlalchemy", "sqlmodel", "torch") if m in sys.modules)}))
"""


def _run(home: Path, *argv: str) -> tuple[str, list[str]]:
    env = {**os.environ, ENV_HOME: str(home), "PYTHONPATH": str(REPO), "IDMCTL_TEST_BEHAVIOR": "steps:1:0.01"}
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    out, probe = done.stdout.strip().rsplit("\n", 1)
    return out, json.loads(probe)["modules"]


def test_submit_uses_neither_the_orm_nor_torch_and_the_orm_reads_its_rows(tiny_cache, idmctl_home: Path) -> None:
    from ground.spec.loader import load_spec
    from idmctl.record.preflights import code_version, latest_run, record_run
    from idmctl.core.profile import load_profile
    from idmctl.record.db import session
    from idmctl.record.models import Chain, Job, SpecVersion

    spec = str(tiny_cache.spec_path)
    # One static preflight fills the memo (and, store at head, is itself written with sqlite3).
    _run(idmctl_home, "preflight", spec, "--no-smoke", "--json")
    resolved = load_spec(spec)
    profile, profile_hash = load_profile("local")
    passed = record_run(resolved, profile.name, profile_hash, code_version(), [], with_smoke=True, seconds=0.1,
                        job={"smoke_flags": {"--entry": "tests.jobs_entry"}})
    assert latest_run(resolved.hash, code_version(), profile_hash, smoke_flags={"--entry": "tests.jobs_entry"}).id == passed.id

    before = datetime.now(timezone.utc)
    out, modules = _run(idmctl_home, "submit", spec, "--entry", "tests.jobs_entry", "--json")
    assert modules == [], f"submit imported {modules}"
    submitted = json.loads(out)
    with session() as db:
        job = db.get(Job, submitted["job"])
        chain = db.get(Chain, submitted["chain"])
        version = db.get(SpecVersion, resolved.hash)
    assert (job.state, job.preflight_id, job.executor, job.attempt, job.restarts, job.imported) == (
        "PENDING", passed.id, "local", 1, 0, False)
    assert job.submitted_at.tzinfo is not None and before <= job.submitted_at <= datetime.now(timezone.utc)
    assert job.log_path == submitted["log"] and job.scheduler_id == submitted["scheduler_id"]
    assert (chain.experiment, chain.spec_hash, chain.status, chain.retries_used) == ("tiny_routed", resolved.hash, "ACTIVE", 0)
    assert version is not None and json.loads(version.resolved_json) == resolved.canonical
    assert job.admitted["admission"]["failed"] == []


def test_a_submit_the_gate_refuses_does_not_import_torch_to_say_so(tiny_cache, idmctl_home: Path) -> None:
    """No pass for this code version: nothing is remembered either, so introspection and the cache
    inspection are SKIPped (the refusal stands on the gate) instead of importing torch to refuse."""
    env = {**os.environ, ENV_HOME: str(idmctl_home), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", PROBE, "submit", str(tiny_cache.spec_path), "--qos", "sub"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert "preflight required: no preflight for tiny_routed" in done.stderr, done.stderr
    assert "torch" not in json.loads(done.stdout.strip().splitlines()[-1])["modules"]

"""`idmctl jobs` links each job to its chain's MLflow run (one run per chain)."""

from __future__ import annotations

import json

from idmctl.record import session
from idmctl.record.models import Chain, Job


def test_jobs_link_to_the_chains_mlflow_run(cli):
    with session() as db:
        chain = Chain(experiment="quickstart", spec_hash="h", mlflow_run_id="abc123")
        db.add(chain)
        db.flush()
        db.add(Job(experiment="quickstart", chain_id=chain.id, scheduler_id="41", state="PREEMPTED"))
        db.add(Job(experiment="quickstart", chain_id=chain.id, attempt=2, scheduler_id="42", state="RUNNING"))
        db.add(Job(experiment="other", scheduler_id="43", state="FAILED"))
    rows = json.loads(cli("jobs", "--json", "--ui-url", "http://host:5001/").output)
    by_id = {row["scheduler_id"]: row for row in rows}
    assert by_id["41"]["run_url"] == by_id["42"]["run_url"] == "http://host:5001/#/runs/abc123"
    assert by_id["43"]["run_url"] is None and by_id["43"]["mlflow_run_id"] is None
    table = cli("jobs").output
    assert table.count("http://127.0.0.1:5000/#/runs/abc123") == 2

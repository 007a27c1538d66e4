"""The team's own repository (examples/team_repo) under idmctl's gate, on the real local Slurm: card A's
job 6321 (a kwarg added to the look-alike class) is an introspection FAIL naming the sibling; job 6262
(``persistent_workers=True`` hard-coded against ``--dataloader_num_workers 0``) is a smoke FAIL with
Python's own ValueError at the team's line; fixed, the preflight passes and a real job runs their launch
script from the snapshot, logs to MLflow, is preempted by a core-own job and resumes from its checkpoint.

Everything runs in a copy of the project, where the fixes are applied as the team would commit them."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from ground.contract import ENV_CLUSTER
from ground.tracking import TAG_CODE_VERSION
from slurm_support import release_requeued, sh, text_so_far, wait_until
from snapshot_support import chain_rows, home, idmctl, job_row, project, submitted, sync_until_chain_ends  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SPEC = "examples/team_repo/experiments/team_n4.yaml"
TEAM = Path("examples/team_repo")


def _checks(result) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    report = json.loads(result.stdout)
    return {check["name"]: check for check in report["checks"]}


def _preflight(project: Path, home: Path, env: dict[str, str]):  # type: ignore[no-untyped-def]
    return idmctl(project, home, "preflight", SPEC, "--json", **env)


def test_the_team_repo_fails_as_6321_then_6262_and_once_fixed_runs_and_resumes_on_slurm(
        tiny_cache, project: Path, home: Path) -> None:
    env = {"IDMCTL_TEAM_DATA": str(Path(tiny_cache.data["episodes"]).parent)}
    data_py, train_py = project / TEAM / "team_idm" / "data.py", project / TEAM / "team_idm" / "train.py"

    # 6321: the spec passes selected_layer_indices to HiddenMultiLayer; only HiddenRaw takes it.
    shipped = _preflight(project, home, env)
    assert shipped.returncode == 1, shipped.stdout + shipped.stderr
    checks = _checks(shipped)
    raw_line = 1 + data_py.read_text().splitlines().index(
        next(line for line in data_py.read_text().splitlines() if line.startswith("class RobocasaLatentIDMDatasetHiddenRaw")))
    assert checks["introspection"]["status"] == "FAIL"
    assert (f"`selected_layer_indices` is accepted by RobocasaLatentIDMDatasetHiddenRaw "
            f"(examples/team_repo/team_idm/data.py:{raw_line}), not by RobocasaLatentIDMDatasetHiddenMultiLayer "
            "(examples/team_repo/team_idm/data.py:") in checks["introspection"]["summary"], checks["introspection"]
    assert checks["smoke"]["status"] == "SKIP"

    # The dataset fixed: now the smoke runs their launch script, which crashes as job 6262 did.
    shutil.copy(project / TEAM / "fixes" / "data_fixed.py", data_py)
    crashed = _preflight(project, home, env)
    checks = _checks(crashed)
    assert checks["introspection"]["status"] == "PASS", checks["introspection"]
    smoke = checks["smoke"]
    assert smoke["status"] == "FAIL"
    assert re.search(r"team_idm/train\.py:\d+ in main → ValueError: persistent_workers option needs num_workers > 0",
                     smoke["summary"]), smoke["summary"]

    # Both fixed: the preflight passes on the job's own entry, measured from its own step lines.
    shutil.copy(project / TEAM / "fixes" / "train_fixed.py", train_py)
    spec_file = project / SPEC
    document = yaml.safe_load(spec_file.read_text())
    document["train"].update(steps=10_000, log_every=1000)  # ~30 s at ~3 ms/step: long enough to be preempted
    spec_file.write_text(yaml.safe_dump(document, sort_keys=False))
    slurm_env = {**env, ENV_CLUSTER: "local-slurm"}
    passed = _preflight(project, home, slurm_env)
    assert passed.returncode == 0, passed.stdout[-3000:]
    smoke = _checks(passed)["smoke"]
    assert smoke["status"] == "PASS" and smoke["numbers"]["entry"].startswith("bash scripts/") and \
        len(smoke["numbers"]["losses"]) == 3, smoke

    # The preemptor is submitted first, held, and released once the team's job is under way: a submit is a
    # whole `idmctl` process, and under a CPU hog one took longer than the team's 10,000 steps had left
    # (the job COMPLETED 3 s before the preemptor reached Slurm); a release is one RPC.
    blocker = submitted(idmctl(project, home, "submit", "quickstart", "--entry", "tests.jobs_entry", "--qos", "core-own",
                               "-c", "2", "--mem", "300MB", "--exclude", "n2", "--force", "--reason", "the preemptor",
                               "--hold", "--json", **{**slurm_env, "IDMCTL_TEST_BEHAVIOR": "steps:3:0.2"}))
    # On the preemptible QoS, holding both of n1's CPUs: the core-own job, which needs n1, can only run by
    # preempting it. No --force: the gate let the team's job in (--qos/-c/--exclude re-checked at submit).
    job = submitted(idmctl(project, home, "submit", SPEC, "--qos", "sub", "-c", "2", "--exclude", "n2", "--json",
                           **slurm_env))
    log = Path(job["log"])

    def steps_logged() -> list[int]:
        return [int(n) for n in re.findall(r"^IDMCTL_STEP step=(\d+)", text_so_far(log), re.M)]

    wait_until(lambda: max(steps_logged(), default=0) >= 50, 180, "the team's trainer to report step 50 in the job log")
    sh("scontrol", "release", blocker["scheduler_id"])

    def released_and_resumed() -> bool:
        release_requeued(job["scheduler_id"])
        return "resumed from checkpoint-" in text_so_far(log)

    def seen() -> str:
        states = {name: sh("sacct", "-n", "-X", "-P", "-j", ran["scheduler_id"], "-o", "State", check=False).split()
                  for name, ran in (("team job", job), ("preemptor", blocker))}
        return (f"the preempted team job to be requeued and resume from its checkpoint (Slurm states {states}; "
                f"log tail: {text_so_far(log)[-600:]!r})")

    wait_until(released_and_resumed, 240, seen)
    assert sync_until_chain_ends(project, home, job["chain"], timeout_s=300) == "COMPLETED", text_so_far(log)[-3000:]
    assert sync_until_chain_ends(project, home, blocker["chain"], timeout_s=60) == "COMPLETED"
    row = job_row(home, job["job"])
    assert (row["state"], row["restarts"]) == ("COMPLETED", 1), row
    text = log.read_text()
    resumed_at = int(re.search(r"resumed from checkpoint-(\d+)", text).group(1))
    assert 50 <= resumed_at < 10_000 and steps_logged()[-1] == 10_000
    runs = json.loads(row["runs"])
    assert runs[0]["state"] in ("PREEMPTED", "REQUEUED") and runs[-1]["state"] == "COMPLETED", runs
    code = json.loads(row["code"])
    assert f"idmctl: code {code['version']} verified" in text
    assert f"(cd {code['directory']}/examples/team_repo" in Path(row["script_path"]).read_text()
    # MLflow: the chain's one run, its loss every log_every steps across both runs, and the admitted code.
    with sqlite3.connect(home / "mlflow.sqlite") as db:
        (run_id, status), = db.execute("SELECT run_uuid, status FROM runs").fetchall()
        steps = sorted({s for (s,) in db.execute("SELECT step FROM metrics WHERE key = 'loss' AND run_uuid = ?", (run_id,))})
        tags = dict(db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)).fetchall())
    assert status == "FINISHED" and steps == list(range(1000, 10_001, 1000)), (status, steps)
    assert tags[TAG_CODE_VERSION] == code["version"]

"""The whole batch script, byte for byte, for a few representative jobs (golden files in tests/golden/).

Any change to what a job runs shows here as a diff. After an intended change, regenerate and review:
``IDMCTL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/idmctl/job/test_render_golden.py`` (then ``git diff tests/golden``).

Everything that differs between machines is fixed here: the home, the interpreter, the code snapshot
(version, folder, environment digest) and the node guard's stage bytes. The options come from the real
effective-job path (spec + flags + cluster profile + the limits derivation) over an empty home, so the
derivation lines are the spec-and-profile arithmetic, never a measurement of this machine.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import replace
from pathlib import Path

import pytest

from ground import contract
from idmctl.job.code import JobCode
from idmctl.job.effective import build
from idmctl.core.job_options import JobOptions, JobRequest
from idmctl.job.render import RenderContext, render_script, with_exclusions

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).parents[2] / "golden"
SPECS = GOLDEN / "specs"
UPDATE = os.environ.get("IDMCTL_UPDATE_GOLDEN") == "1"

HOME = Path("/home/operator/idmctl")
PYTHON = "/opt/idmctl/venv/bin/python"
VERSION = "0123456789abcdef0123456789abcdef01234567"
CODE = JobCode(version=VERSION, directory=f"{HOME}/code/{VERSION}", store=f"{HOME}/code", env_digest="e" * 64)
"""The snapshot as ``jobs.code.planned`` gives it for a spec without ``code.roots``."""
TEAM_CODE = JobCode(version=VERSION, directory=CODE.directory, store=CODE.store, env_digest=CODE.env_digest,
                    import_dirs=(f"{CODE.directory}/examples/team_repo",))
"""A snapshot holding a team's repository too (``code.roots: [examples/team_repo]``)."""
CARD_STAGE_BYTES = 7_151_073_361_920
"""latent_c_n4's cache as the disk check counts it: 1,871 files × 3,822,059,520 B."""

CASES: dict[str, dict] = {
    # `idmctl quickstart`'s job on the local executor: CPU, no stage-in, no snapshot roots beyond the tree.
    "quickstart_local": dict(experiment="quickstart", request=JobRequest(), cluster="local"),
    # Card A: latent_c_n4, 8 GPUs on core-own, the 7.2 TB cache staged to each node's NVMe.
    "card_a_latent_c_n4": dict(experiment="latent_c_n4", request=JobRequest(), cluster="card", stage_bytes=CARD_STAGE_BYTES),
    # The same model on two nodes: rendezvous, per-node stage-in and node guard through srun.
    "card_a_latent_c_n4_2node": dict(experiment=str(SPECS / "latent_c_n4_2node.yaml"), request=JobRequest(), cluster="card",
                                     stage_bytes=CARD_STAGE_BYTES),
    # A cache build job (one task launching one builder per GPU), submitted held.
    "build_rgb_card": dict(experiment="latent_c_n4", cluster="card",
                           request=JobRequest(build="rgb", time_limit="12:00:00", hold=True)),
    # A resubmission: attempt 2 of card A's chain 7 after a node failure, from the options as stored,
    # with the failed node excluded and the retry reason exported.
    "card_a_latent_c_n4_resubmit": dict(experiment="latent_c_n4", request=JobRequest(qos="sub", gpus_per_node=4),
                                        cluster="card", stage_bytes=CARD_STAGE_BYTES, chain_id=7, attempt=2,
                                        resubmit_excluding=["worker-3"],
                                        extra_env={contract.ENV_RETRY_REASON: "node_failure"}),
    # Card A on sub with the fix for a stage-in longer than the preempt cycle: only the 4 routed blocks staged.
    "card_a_sub_routed_stage_in": dict(experiment=str(SPECS / "latent_c_n4_routed.yaml"), request=JobRequest(qos="sub"),
                                       cluster="card", stage_bytes=CARD_STAGE_BYTES * 4 // 12),  # 4 of 12 blocks
    # Card A staging to the job's own scratch: stage.dest $SLURM_TMPDIR/idm, expanded on the node.
    "card_a_stage_slurm_tmpdir": dict(experiment=str(SPECS / "latent_c_n4_slurm_tmpdir.yaml"), request=JobRequest(),
                                      cluster="card", stage_bytes=CARD_STAGE_BYTES),
    # The team's own launch script (a command-line entry) from their repository in the snapshot.
    "team_launch_script": dict(experiment=str(REPO / "examples" / "team_repo" / "experiments" / "team_n4.yaml"),
                               request=JobRequest(), cluster="local-slurm", code=TEAM_CODE,
                               env={"IDMCTL_TEAM_DATA": "/data/team"}),
    # The team's launch script that starts its own ranks with torchrun (code.launch: per_node, card A's
    # `bash run.sh` shape): once per node with its 8 GPUs and 112 CPUs, told how many ranks to start.
    "team_torchrun_per_node": dict(experiment=str(REPO / "examples" / "team_repo" / "experiments" / "team_torchrun_8gpu.yaml"),
                                   request=JobRequest(), cluster="card", code=TEAM_CODE,
                                   env={"IDMCTL_TEAM_DATA": "/data/team"}),
    # A chain submitted before code snapshots existed, resubmitted after a preemption: it runs the live tree.
    "pre_snapshot_chain_resubmit": dict(experiment="quickstart", request=JobRequest(), cluster="local-slurm",
                                        chain_id=3, attempt=3, code=None,
                                        extra_env={contract.ENV_CODE_VERSION: VERSION,
                                                   contract.ENV_RETRY_REASON: "preempted"}),
    # `submit latent_c_n4 --eval last`: the eval job of the final checkpoint, its own chain 8, in training
    # chain 7's run directory, waiting on that chain's Slurm job 4242 (killed by Slurm if it fails).
    "card_a_eval_last": dict(experiment="latent_c_n4", request=JobRequest(), cluster="card", stage_bytes=CARD_STAGE_BYTES,
                             chain_id=8, eval_of=dict(chain=7, after="4242")),
}


def render_case(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    case = CASES[name]
    for key, value in case.get("env", {}).items():
        monkeypatch.setenv(key, value)
    # The effective job over an empty home of this test (no store, no runs, no cache: nothing measured).
    job = build(case["experiment"], case["request"], case["cluster"], VERSION)
    options = job.options
    if options.build:  # sized as submit sizes a build job (nothing measured here: the spec's and the flags')
        from idmctl.gate.build import sized  # here: only the build case sizes a build job

        options = sized(job, VERSION)
    if "resubmit_excluding" in case:
        stored = options.as_dict()  # what the job row keeps; a resubmission reads it back
        options = with_exclusions(replace(JobOptions(**stored), hold=False), case["resubmit_excluding"])
    if "eval_of" in case:
        from idmctl.ops.eval_jobs import _eval_options

        options = _eval_options(options, job.resolved.spec.train.steps, case["eval_of"]["after"],
                                job.resolved.spec.eval.resources)
    # The script itself, as on the operator's machine.
    monkeypatch.setenv(contract.ENV_HOME, str(HOME))
    chain_id = case.get("chain_id", 1)
    run_dir = HOME / "runs" / job.resolved.name / str(case.get("eval_of", {}).get("chain", chain_id))
    log_name = "slurm-%j.out" if job.profile.scheduler == "slurm" else "local-%j.out"
    if "eval_of" in case:
        log_name = f"eval-step-{options.eval_step}-%j.out"
    code = case.get("code", CODE)
    where = {"repo_root": Path(code.directory), "extra_env": {**code.env(), **case.get("extra_env", {})}} if code \
        else {"repo_root": Path("/opt/idmctl/src"), "extra_env": case.get("extra_env", {})}
    ctx = RenderContext(run_dir=run_dir, chain_id=chain_id, attempt=case.get("attempt", 1), idmctl_home=HOME,
                        log_path=str(run_dir / log_name), python=PYTHON, stage_bytes=case.get("stage_bytes"), **where)
    return render_script(job.resolved, options, ctx)


def golden_diff(expected: str, actual: str, name: str) -> str:
    """The unified diff of a golden file against the script rendered now (empty when identical)."""
    return "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                        fromfile=f"tests/golden/{name}.sh", tofile=f"{name} as rendered now"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_script_matches_its_golden_file(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = render_case(name, tmp_path, monkeypatch)
    path = GOLDEN / f"{name}.sh"
    if UPDATE:
        path.write_text(script)
    assert path.exists(), f"no golden file {path}: run IDMCTL_UPDATE_GOLDEN=1 pytest {Path(__file__).name}"
    diff = golden_diff(path.read_text(), script, name)
    assert not diff, f"the rendered script differs from its golden file " \
                     f"(if intended: IDMCTL_UPDATE_GOLDEN=1 pytest {Path(__file__).name}):\n{diff}"


def test_a_changed_template_shows_as_a_diff_of_the_golden_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from idmctl.job import template

    original = template.TEMPLATE.read_text()
    line = "trap 'notice TERM' TERM"
    assert original.count(line) == 1
    edited = tmp_path / "job.sh.tmpl"
    edited.write_text(original.replace(line, "trap 'notice TERM' TERM INT"))
    monkeypatch.setattr(template, "TEMPLATE", edited)
    diff = golden_diff((GOLDEN / "quickstart_local.sh").read_text(), render_case("quickstart_local", tmp_path, monkeypatch),
                       "quickstart_local")
    changed = [d for d in diff.splitlines() if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    assert changed == [f"-{line}", f"+{line} INT"], diff


def test_every_part_of_the_template_is_rendered_by_some_golden_job() -> None:
    """A part no representative job uses would change unseen: each part's first line is in some golden."""
    from idmctl.job.template import parts

    goldens = "".join(path.read_text() for path in GOLDEN.glob("*.sh"))
    unseen = [name for name, body in parts().items()
              if body.split("\n")[0].split("{{")[0].strip() not in goldens]
    assert not unseen, f"template parts no golden job renders: {unseen} (add a case to CASES)"


def test_controller_script_matches_its_golden_file() -> None:
    """The controller job after attempt 2 (Slurm job 6108) of card A's chain 7, under the card's profile."""
    from idmctl.core.profile import load_profile
    from idmctl.job.controller_script import ControllerContext, controller_request, render_controller_script

    settings = load_profile("card")[0].controller
    run_dir = HOME / "runs" / "latent_c_n4" / "7"
    ctx = ControllerContext(chain_id=7, attempt=2, after="6108", log_path=str(run_dir / "controller-%j.out"),
                            idmctl_home=HOME, cluster="/opt/idmctl/src/clusters/card.yaml", partition=settings.partition,
                            python=PYTHON, repo_root=Path("/opt/idmctl/src"))
    script = render_controller_script(controller_request(ctx, "share", settings.time_limit, settings.mem), ctx)
    path = GOLDEN / "controller_card_a.sh"
    if UPDATE:
        path.write_text(script)
    diff = golden_diff(path.read_text(), script, "controller_card_a")
    assert not diff, f"the controller script differs from its golden file:\n{diff}"

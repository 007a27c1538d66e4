"""Submit overhead: what idmctl adds on top of sbatch.

Figures: rendering the batch script from a spec (``submit --dry-run`` in-process: load spec, resolve
options, validate, render) against a bare ``python -c pass``; and the rendered script through
``sbatch --test-only`` against a bare ``sbatch --test-only --wrap true`` (needs the local Slurm
cluster). ``python -m bench.submit_overhead [--fast]`` prints the figures as a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Figure, print_figures, restore_environ, saved_environ, time_call
from ground.contract import ENV_HOME


def run(fast: bool = False) -> list[Figure] | str:
    from idmctl.core.job_options import JobRequest
    from idmctl.ops.submit import dry_run

    repeats = 3 if fast else 15
    saved = saved_environ(ENV_HOME)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="idmctl-bench-submit-") as tmp:
        os.environ[ENV_HOME] = str(Path(tmp) / "home")
        try:
            script = dry_run("quickstart", JobRequest(), "local-slurm").script
            render = time_call(lambda: dry_run("quickstart", JobRequest(), "local-slurm"), repeats)
            interpreter = time_call(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), repeats)
            figures.append(Figure("render the batch script (submit --dry-run, in-process)", "s", render,
                                  reference_name="python -c pass", reference_samples=interpreter,
                                  target="well under a second: submit is dominated by sbatch"))
            if os.environ.get("SLURM_CONF") and shutil.which("sbatch"):
                path = Path(tmp) / "job.sbatch"
                path.write_text(script)
                ours = time_call(lambda: subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, check=True), repeats)
                bare = time_call(lambda: subprocess.run(["sbatch", "--test-only", "--wrap", "true"], capture_output=True, check=True), repeats)
                figures.append(Figure("sbatch --test-only of the rendered script", "s", ours,
                                      reference_name="sbatch --test-only --wrap true", reference_samples=bare,
                                      target="ratio ≈ 1: the script adds nothing to the scheduler's work"))
        finally:
            restore_environ(saved)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true")
    print_figures(run(parser.parse_args().fast))


if __name__ == "__main__":
    main()


# -- bench.run adapter: a real submit on the local Slurm with a cached preflight,
# as whole processes side by side — `idmctl submit` vs raw `sbatch` of the very script it wrote vs
# submitit submitting the same command. Every job is cancelled right after it is submitted, outside
# the timed span, so the shared test cluster's queue is left as it was. -----------------------------

_render_figures = run

SUBMITIT_SCRIPT = """
import sys, submitit
executor = submitit.AutoExecutor(folder=sys.argv[1], cluster="slurm")
executor.update_parameters(timeout_min=10, cpus_per_task=1, slurm_mem="1G", slurm_qos="core-own", name="bench_submitit")
job = executor.submit(submitit.helpers.CommandFunction(sys.argv[2:]))
print(job.job_id)
"""


def _timed_submission(argv: list[str], env: dict[str, str], parse_id: "collections.abc.Callable[[str], str]") -> float:
    import time

    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}… exited {done.returncode}: {done.stderr.strip()[-300:]}")
    subprocess.run(["scancel", parse_id(done.stdout)], capture_output=True, timeout=60)
    return seconds


def _submit_figures(fast: bool) -> list[Figure | str] | str:
    import statistics

    from bench.preflight_static import write_quickstart_data

    if not (os.environ.get("SLURM_CONF") and shutil.which("sbatch")):
        return "not measured: no local Slurm cluster (scripts/slurm/up.sh, then source its env file)"
    try:
        import submitit  # noqa: F401
    except ImportError:
        submitit_missing = True
    else:
        submitit_missing = False
    repeats = 1 if fast else 5
    idmctl = str(Path(sys.executable).parent / "idmctl")
    with tempfile.TemporaryDirectory(prefix="idmctl-bench-submit-real-") as tmp:
        env = {**os.environ, ENV_HOME: str(Path(tmp) / "home"), "CUDA_VISIBLE_DEVICES": ""}
        spec = write_quickstart_data(Path(tmp))

        def preflight() -> None:
            done = subprocess.run([idmctl, "preflight", str(spec), "--cluster", "local-slurm", "--json"],
                                  capture_output=True, text=True, env=env, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"the quickstart preflight on local-slurm did not pass: {done.stdout[-300:]}")

        submit = [idmctl, "submit", str(spec), "--cluster", "local-slurm", "--json"]
        scripts: list[str] = []

        def idmctl_id(stdout: str) -> str:
            row = json.loads(stdout)
            scripts.append(row["script"])
            return row["scheduler_id"]

        def submit_with_cached_preflight() -> float:
            # The code version hashes the working tree's diff; in a tree others are editing it can move
            # between preflight and submit. Then preflight again (untimed) and resubmit.
            for _ in range(3):
                try:
                    return _timed_submission(submit, env, idmctl_id)
                except RuntimeError as exc:
                    if "preflight" not in str(exc):
                        raise
                    preflight()
            raise RuntimeError("the working tree kept changing between preflight and submit")

        preflight()
        checks_figure = _checks_in_process(spec, Path(env[ENV_HOME]), 3 if fast else 15)
        ours = [submit_with_cached_preflight() for _ in range(repeats)]
        script = scripts[0]
        raw = [_timed_submission(["sbatch", "--parsable", script], env, lambda out: out.strip().split(";")[0])
               for _ in range(repeats)]
        overhead = statistics.median(ours) - statistics.median(raw)
        figures: list[Figure | str] = [
            Figure("idmctl submit quickstart (whole process, cached preflight)", "s", ours, "raw sbatch of the same script",
                   raw, target="overhead on top of sbatch, in seconds",
                   note=f"overhead: median {overhead:.2f} s = CLI start, spec + profile load, preflight gate "
                        "(git diff for the code version), store rows, script render, sbatch"),
        ]
        figures.append(checks_figure)
        if submitit_missing:
            return [*figures, "submitit: not installed (pip install -e '.[bench]')"]
        command = [sys.executable, "-m", "trainers.train", "--run-dir", str(Path(script).parent)]
        theirs = [_timed_submission([sys.executable, "-c", SUBMITIT_SCRIPT, str(Path(tmp) / "submitit"), *command], env,
                                    lambda out: out.strip().splitlines()[-1]) for _ in range(repeats)]
        figures.append(Figure("submitit submitting the same command (whole process)", "s", theirs,
                              "raw sbatch of the same script", raw, note="AutoExecutor(cluster='slurm') + CommandFunction"))
        margin = statistics.median(ours) - statistics.median(theirs)
        figures.append(Figure("idmctl submit vs submitit, side by side (whole process)", "s", ours,
                              "submitit submitting the same command", theirs,
                              target="idmctl ≤ submitit + 0.15 s, all submit-time checks included",
                              note=f"idmctl − submitit: median {margin:+.3f} s → "
                                   f"{'met' if margin <= 0.15 else 'MISSED'}"))
    return figures


def _checks_in_process(spec: Path, home: Path, repeats: int) -> Figure:
    """The submit-time checks: every static check on the effective job plus the smoke
    re-judged from the preflight's measurement, in-process, as ``submit`` runs them."""
    import statistics

    saved = saved_environ(ENV_HOME)
    os.environ[ENV_HOME] = str(home)
    try:
        from ground.code_snapshot import code_version
        from idmctl.core.job_options import JobRequest
        from idmctl.job.effective import build
        from idmctl.gate.admission import judge
        from idmctl.record.preflights import latest_passing

        job = build(str(spec), JobRequest(), "local-slurm")
        version = code_version()
        passing = latest_passing(job.declared, job.profile_hash, job.smoke_flags, version)
        admissions = []
        samples = time_call(lambda: admissions.append(judge(job, passing, version)), repeats)
    finally:
        restore_environ(saved)
    per_check = {name: statistics.median(a.check_ms[name] for a in admissions) for name in admissions[0].check_ms}
    shown = ", ".join(f"{name} {ms:.2f}" for name, ms in per_check.items())
    return Figure("submit-time checks on the effective job (in-process, quickstart data)", "s", samples,
                  target="tens of ms (~40 ms)", note=f"median ms per part: {shown}")


def _snapshot_figures(fast: bool) -> list[Figure]:
    """What freezing the code costs submit: the tree's digest (the code version, every submit and
    preflight), a snapshot into an empty store (every file copied once), and a snapshot after one file
    changed (the rest hard-linked from the store: the usual submit)."""
    from ground.code_snapshot import materialize, tree
    from ground.paths import REPO_ROOT

    repeats = 3 if fast else 15
    interpreter = time_call(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), repeats)
    listed = tree()
    digest = time_call(tree, repeats)
    size = sum((REPO_ROOT / f.path).stat().st_size for f in listed.files if f.kind != "l")
    with tempfile.TemporaryDirectory(prefix="idmctl-bench-snapshot-") as tmp:
        stores = iter(range(10**6))
        cold = time_call(lambda: materialize(tree(), Path(tmp) / f"cold-{next(stores)}"), repeats)
        warm_store = Path(tmp) / "warm"
        materialize(listed, warm_store)
        root = Path(tmp) / "tree"
        shutil.copytree(REPO_ROOT, root, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info"))
        marker = root / "bench_marker.txt"
        counter = iter(range(10**6))

        def one_file_changed() -> None:
            marker.write_text(str(next(counter)))
            materialize(tree(root), warm_store)

        warm = time_call(one_file_changed, repeats)
    what = f"{len(listed.files)} files, {size:,} B"
    return [
        Figure("code version: digest of the tree (git ls-files + sha256 of every file)", "s", digest,
               reference_name="python -c pass", reference_samples=interpreter, target="tens of ms", note=what),
        Figure("code snapshot into an empty store (every file copied once)", "s", cold,
               reference_name="python -c pass", reference_samples=interpreter, target="well under a second", note=what),
        Figure("code snapshot, warm (one file changed; the rest hard-linked from the store)", "s", warm,
               reference_name="python -c pass", reference_samples=interpreter,
               target="well under a second (the usual submit)", note=f"{what}; digest included (outside git: a walk)"),
    ]


def run(fast: bool = False) -> list[Figure | str] | str:  # type: ignore[no-redef]
    rendered: list[Figure | str] = [*_render_figures(fast), *_snapshot_figures(fast)]
    submitted = _submit_figures(fast)
    if isinstance(submitted, str):
        return [*rendered, f"real submit: {submitted.removeprefix('not measured:').strip()}"]
    return rendered + submitted

"""A cache build as a job: what ``idmctl submit EXP --build hidden|rgb|pt|ff`` runs.

``python -m trainers.build_job --run-dir RUN_DIR --mode MODE --processes N``: the job script
(idmctl/job/render.py) starts it once, in the batch shell on the job's first node. It

- refuses to start, with the failure marker the classifier knows, when the spec's VAE weights are
  missing (``missing_weights``) or an FF build has no PT norm file (``pt_norm_missing``): the very
  checks the build preflight runs (``cache.build_plan``);
- launches the builder as N ranks over the allocation (``trainers.build_ranks.builder_command``):
  under Slurm one srun task per rank (``--ntasks=N``, the job's ``--ntasks-per-node`` = GPUs per node,
  so a 2-node job's ranks span both nodes), each on ``cuda:SLURM_LOCALID`` (the CPU where CUDA does
  not work) with the job's ``--cpus-per-task`` threads; without Slurm (the local executor) torchrun
  with N workers, or a plain process for N = 1. The builders print ``disk_full`` on ENOSPC;
- on the preemption or time-limit notice (USR1) or TERM stops the builders and exits 75: the job
  script requeues itself, and the next attempt skips every finished file (writes are temp + rename,
  so a killed write never leaves a file that reads as built);
- logs the build to MLflow as the chain's own run: files built, files/s, bytes written, per attempt.

``python -m trainers.build_job --smoke --spec-json FILE --mode MODE``: preflight's 1-sample encode
into a scratch directory; prints one JSON line (load seconds, encode seconds per file, bytes per
file, peak RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cache.build_plan import norm_problem, plan, weights_problem, written_since
from ground import tracking as names
from ground.code_snapshot import refuse_unadmitted_code
from ground.contract import (BUILD_MODES, ENV_CODE_VERSION, EXIT_OK, EXIT_REQUEUE, FAILURE_MARKER, SPEC_FILE)
from ground.errors import UserError
from ground.paths import REPO_ROOT
from ground.spec.loader import ResolvedSpec
from ground.startup import settled, starting


def builder_argv(run_dir: Path, mode: str, processes: int, port: int,
                 env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The builder command line (and its environment) for ``processes`` ranks over this allocation."""
    if mode == "hidden":
        builder = ["trainers.build_hidden_cache", "--spec-json", str(run_dir / SPEC_FILE),
                   "--expect-processes", str(processes)]
    else:
        builder = ["trainers.build_latent_cache", "--run-dir", str(run_dir), "--mode", mode, "--no-progress"]
    from trainers.build_ranks import builder_command

    return builder_command(builder, processes, port, env)


def _port(job_id: str | None) -> int:
    """A rendezvous port per job: two builds on one host (RGB ‖ PT on n1/n2 here) must not collide."""
    if job_id and job_id.isdigit():
        return 20000 + int(job_id) % 20000
    from trainers.build_ranks import free_port

    return free_port()


class _Stop:
    """USR1 (preemption / time-limit notice) or TERM: stop the builders' process group."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.child: subprocess.Popen[bytes] | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.signal = signal.Signals(signum).name
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _logger(run_dir: Path, resolved: ResolvedSpec, mode: str) -> Any:
    from trainers.tracking import RunLogger

    logger = RunLogger(run_dir, resolved.name, resolved.hash, resolved.canonical,
                       os.environ.get(ENV_CODE_VERSION, "unknown"))
    logger.set_tag(names.TAG_BUILD, mode)
    return logger


def run_job(run_dir: Path, mode: str, processes: int) -> int:
    from trainers.build_latent_cache import run_dir_spec

    # First of all: a notice during the seconds of imports and MLflow set-up must not kill us by default
    # (SIGUSR1's default action), or the job ends FAILED instead of being requeued.
    stop = _Stop()
    signal.signal(signal.SIGUSR1, stop)
    signal.signal(signal.SIGTERM, stop)
    resolved = run_dir_spec(run_dir)
    for problem in (weights_problem(resolved, mode), norm_problem(resolved, mode)):
        if problem is not None:
            print(f"{FAILURE_MARKER} cause={problem.cause} field={problem.field}: {problem.message} ({problem.fix})",
                  file=sys.stderr, flush=True)
            return 1
    before = plan(resolved, mode)
    print(f"build_job: {mode} of {resolved.name}: {before.total} files, {before.present} already built, "
          f"{processes} process(es) → {before.output_dir}", flush=True)
    logger = _logger(run_dir, resolved, mode)
    settled()  # MLflow is set up: from here the job waits on its builders
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.time()
    argv, env = builder_argv(run_dir, mode, processes, _port(os.environ.get("SLURM_JOB_ID")), env)
    print(f"build_job: {processes} rank(s): {shlex.join(argv)}", flush=True)
    if stop.signal is not None:  # the notice came during set-up: nothing started, nothing to stop
        status = -signal.SIGTERM
    else:
        # Its own session, so one killpg stops srun (which passes TERM to its tasks) or torchrun and its workers.
        stop.child = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, start_new_session=True)
        if stop.signal is not None:  # a notice between the check and Popen
            stop(signal.Signals[stop.signal].value, None)
        status = stop.child.wait()
    seconds = time.time() - started
    after = plan(resolved, mode)
    files, size = written_since(after.output_dir, started)
    metrics = {"build_files_built": files, "build_bytes_written": size, "build_seconds": seconds,
               "build_files_per_s": files / seconds if seconds > 0 else 0.0,
               "build_files_skipped": before.present, "build_files_total": after.total or 0,
               "build_files_present": after.present}
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1
    logger.log_metrics(metrics, step=attempt)
    print(f"build_job: wrote {files} files, {size} bytes in {seconds:.1f} s ({metrics['build_files_per_s']:.2f} "
          f"files/s); {after.present}/{after.total} present; builders exited {status}", flush=True)
    if stop.signal is not None:
        print(f"build_job: {stop.signal} received: builders stopped, exiting {EXIT_REQUEUE} to be requeued "
              "(finished files are kept and skipped next time)", flush=True)
        logger.finish("KILLED")
        return EXIT_REQUEUE
    logger.finish("FINISHED" if status == 0 else "FAILED")
    return EXIT_OK if status == 0 else (status if status > 0 else 1)


# -- preflight's 1-sample encode smoke -----------------------------------------------------------

def smoke(resolved: ResolvedSpec, mode: str) -> dict[str, Any]:
    """Encode one file of ``mode`` into a scratch directory: seconds to load the models, seconds per file,
    bytes per file, and this process's peak RSS. The cache itself is never touched."""
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="idmctl_build_smoke_") as scratch:
        started = time.perf_counter()
        if mode == "hidden":
            timings, path = _smoke_hidden(resolved, Path(scratch))
        else:
            timings, path = _smoke_latent(resolved, mode, Path(scratch))
        size = path.stat().st_size
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"ok": True, "mode": mode, **timings, "bytes_per_file": size, "peak_rss_bytes": peak,
            "smoke_s": time.perf_counter() - started}


def _smoke_latent(resolved: ResolvedSpec, mode: str, scratch: Path) -> tuple[dict[str, float], Path]:
    from cache.episodes import EpisodeFile
    from cache.latent.dataset import LatentCacheDataset
    from cache.latent.pointmaps import compute_norm_stats, write_norm_file
    from cache.latent.pt_hash import norm_path_for
    from ground.paths import expand_path

    latent = resolved.spec.latent
    assert latent is not None
    changes: dict[str, Any] = {"cache_root": str(scratch), "pt_cache_root": None}
    timings: dict[str, float] = {}
    if mode in ("pt", "ff") and latent.use_pointmap:
        real = norm_path_for(latent)
        if real.exists():
            changes["pt_norm_path"] = str(real)
        else:  # PT: the extractor's statistics pass on one demo (the build runs it on all; timed per demo)
            episodes = EpisodeFile(expand_path(resolved.spec.data.episodes))
            try:
                demos = episodes.demos(latent.split)
                tick = time.perf_counter()
                stats = compute_norm_stats(episodes, demos[:1], latent.cameras, latent.frame_stride, latent.pt_max_depth)
                timings["norm_s_per_demo"] = time.perf_counter() - tick
                timings["norm_demos"] = float(len(demos))
            finally:
                episodes.close()
            changes["pt_norm_path"] = str(scratch / "pt_norm.json")
            write_norm_file(scratch / "pt_norm.json", stats, latent.extractor_version)
    spec = resolved.spec.model_copy(update={"latent": latent.model_copy(update=changes)})
    tick = time.perf_counter()
    dataset = LatentCacheDataset(spec, build_only_slot=mode)
    if not dataset.samples:
        raise UserError("the spec yields no samples to encode", field="latent.frames",
                        hint="episodes shorter than (frames-1)·frame_stride+1 give none")
    dataset.encoder  # noqa: B018 (loads the VAE: the load time is measured apart from the encode)
    timings["load_s"] = time.perf_counter() - tick
    key, start = dataset.samples[0]
    tick = time.perf_counter()
    dataset.ensure(mode, key, start)
    timings["encode_s"] = time.perf_counter() - tick
    return timings, dataset.sample_path(mode, key, start)


def _smoke_hidden(resolved: ResolvedSpec, scratch: Path) -> tuple[dict[str, float], Path]:
    from cache.episodes import EpisodeFile
    from cache.hidden import cache_file, write_hidden
    from ground.paths import expand_path
    from trainers.build_hidden_cache import encode_demo
    from trainers.cosmos_encode import CACHE_TIMESTEP, load_models
    from trainers.text_condition import TextConditioning

    spec, data = resolved.spec, resolved.spec.data
    tick = time.perf_counter()
    vae, transformer, vae_id, tr_id = load_models(data, None)
    text = TextConditioning(spec, transformer.config.text_embed_dim, None)
    load_s = time.perf_counter() - tick
    episodes = EpisodeFile(expand_path(data.episodes))
    try:
        demo = episodes.demos("all")[0]
        tick = time.perf_counter()
        hidden, stride = encode_demo(vae, transformer, text.for_demo(episodes, demo), episodes, demo, data)
        path = cache_file(scratch, demo, "safetensors")
        write_hidden(path, hidden, list(data.cached_layers),
                     {"encoder": "wan-vae+cosmos", "vae": str(vae_id), "transformer": str(tr_id),
                      "text_conditioning": text.source, "demo": demo, "frame_stride": stride, "timestep": CACHE_TIMESTEP})
        encode_s = time.perf_counter() - tick
    finally:
        episodes.close()
    return {"load_s": load_s, "encode_s": encode_s}, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", required=True, choices=BUILD_MODES)
    parser.add_argument("--run-dir", type=Path, help="the job's run directory (spec.json)")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="encode one file into a scratch dir; print JSON")
    parser.add_argument("--spec-json", type=Path, help="--smoke: a run-directory style spec.json")
    args = parser.parse_args(argv)
    if not args.smoke and (refused := refuse_unadmitted_code()) is not None:
        return refused
    try:
        if args.smoke:
            if args.spec_json is None:
                parser.error("--smoke needs --spec-json")
            document = json.loads(args.spec_json.read_text())
            from ground.spec.schema import ExperimentSpec

            resolved = ResolvedSpec(name=document["name"], path=args.spec_json,
                                    spec=ExperimentSpec.model_validate(document["spec"]))
            print(json.dumps(smoke(resolved, args.mode)), flush=True)
            return 0
        if args.run_dir is None or args.processes < 1:
            parser.error("give --run-dir and --processes >= 1 (or --smoke)")
        return run_job(args.run_dir, args.mode, args.processes)
    except UserError as exc:
        print(exc.line(), file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    starting()  # before MLflow: its import is most of a build job's start
    sys.exit(main())


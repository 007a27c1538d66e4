"""Standalone builder of card B's latent cache: ``--mode rgb|pt|ff|all``, resumable, shardable.

Single process::

    python -m trainers.build_latent_cache --spec latent_rgbpt_smoke --mode rgb

One rank per device, each on its own (``trainers.build_ranks``: srun tasks in a build job, or
torchrun, or ``accelerate launch``, which runs torchrun)::

    torchrun --nproc-per-node 2 -m trainers.build_latent_cache --spec EXP --mode pt

Window ``k`` of the dataset's (demo, start) list goes to rank ``k mod world``: one writer per file, and
the files N ranks write are the files one process writes (bitwise on the CPU, where the encode is fp32;
bf16 autocast on CUDA). Only the slot being built is touched (no empty ``_rgb/`` in a PT build). The
one figure over all demos, the PT norm file, is computed by rank 0 alone when missing (or with
``--recompute-norm``, the "PT extractor re-run"), over every demo whatever the world size, and rank
0's PT hash is broadcast so every rank writes into the same ``_pt__<hash>/``. Existing files are
skipped; every write is atomic, so a killed build is finished by running it again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.startup import settled, starting

if TYPE_CHECKING:
    from ground.spec.loader import ResolvedSpec

MODES = ("rgb", "pt", "ff", "all")


def mode_slots(mode: str, slots: tuple[str, ...]) -> tuple[str, ...]:
    return slots if mode == "all" else (mode,)


def build(spec_name: "str | ResolvedSpec", mode: str, *, rank: int = 0, world_size: int = 1, recompute_norm: bool = False,
          progress: bool = True, barrier: Callable[[], None] = lambda: None,
          share: Callable[[Any], Any] = lambda value: value, device: Any = None) -> dict[str, Any]:
    """Build this rank's share of ``mode``'s slots on ``device`` (the CPU when None); a JSON-able report.

    ``barrier`` and ``share`` (rank 0's value to every rank) come from ``trainers.build_ranks`` when
    sharded. ``spec_name`` may be a resolved spec (a build job's run-directory ``spec.json``).
    """
    from cache.latent.dataset import LatentCacheDataset, latent_section, needs_pt_hash, prepare_pt_norm
    from cache.latent.files import remove_dead_temp_files
    from cache.latent.pt_hash import pt_meta_for
    from ground.errors import UserError
    from ground.spec import load_spec

    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r}", field="--mode", hint=f"one of {', '.join(MODES)}")
    resolved = spec_name if not isinstance(spec_name, str) else load_spec(spec_name)
    latent = latent_section(resolved.spec)
    if mode == "pt" and not latent.use_pointmap:
        raise UserError("mode pt but the spec has use_pointmap: false", file=str(resolved.path),
                        field="latent.use_pointmap", hint="set it to true or build rgb/ff only")
    if mode == "ff" and latent.skip_ff:
        raise UserError("mode ff but the spec has skip_ff: true", file=str(resolved.path), field="latent.skip_ff",
                        hint="set skip_ff: false to build first frames")
    slots = mode_slots(mode, latent.slots)
    if device is None:
        from trainers.build_ranks import local_device

        device = local_device()
    pt_meta = None
    if needs_pt_hash(latent, slots):
        # Only PT builds run the extractor; FF waits for PT's norm file (card B: ff after pt).
        if rank == 0 and mode in ("pt", "all"):
            prepare_pt_norm(resolved.spec, recompute=recompute_norm)
        barrier()
        pt_meta = share(pt_meta_for(latent) if rank == 0 else None)
    dataset = LatentCacheDataset(resolved.spec, build_only_slot=None if mode == "all" else mode, pt_meta=pt_meta,
                                 device=device)
    settled()  # the encoders are loaded: the loop below is the build
    if rank == 0:  # alone, before anyone writes: a writer on another node has a pid this node cannot see
        for slot in slots:
            remove_dead_temp_files(dataset.layout.slot_dir(slot))
    barrier()
    mine = dataset.samples[rank::world_size]
    events: list[dict[str, Any]] = []
    skipped = {slot: 0 for slot in slots}
    with _progress_bar(progress and rank == 0, f"{mode} ({len(dataset.samples)} samples, {world_size} ranks)",
                       len(mine)) as advance:
        for key, start in mine:
            for slot in slots:
                began = time.time()
                if dataset.ensure(slot, key, start):
                    events.append({"slot": slot, "key": key, "start": start, "began": began, "ended": time.time()})
                else:
                    skipped[slot] += 1
            advance()
    barrier()
    return {
        "spec": resolved.name, "mode": mode, "rank": rank, "world_size": world_size,
        "pt_hash": pt_meta.short if pt_meta else None,
        "samples": len(dataset.samples), "my_samples": len(mine), "device": str(dataset.encoder.device),
        "slots": {slot: {"dir": str(dataset.layout.slot_dir(slot)), "encoded": dataset.encoded[slot],
                         "skipped": skipped[slot]} for slot in slots},
        "events": events,
    }


class _progress_bar:
    """A rich progress bar on stderr for rank 0; a no-op elsewhere."""

    def __init__(self, enabled: bool, title: str, total: int):
        self.enabled, self.title, self.total = enabled, title, total

    def __enter__(self) -> Callable[[], None]:
        if not self.enabled:
            return lambda: None
        from rich.console import Console
        from rich.progress import Progress

        self._progress = Progress(console=Console(stderr=True), transient=False)
        self._progress.start()
        task = self._progress.add_task(self.title, total=self.total)
        return lambda: self._progress.advance(task)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._progress.stop()


def run_dir_spec(run_dir: Path) -> "ResolvedSpec":
    """The spec a build job was submitted with (its run directory's ``spec.json``), as a resolved spec."""
    from ground.contract import SPEC_FILE
    from ground.run_dir import read_run_spec
    from ground.spec.loader import ResolvedSpec

    run = read_run_spec(run_dir)
    return ResolvedSpec(name=run.name, path=Path(run_dir) / SPEC_FILE, spec=run.spec)


def disk_full_exit(exc: OSError) -> int:
    """ENOSPC while writing the cache: print the failure marker (the classifier's ``disk_full``) and exit 1;
    any other OSError is re-raised (a traceback is the evidence then)."""
    import errno

    from ground.contract import CAUSE_DISK_FULL, FAILURE_MARKER

    if exc.errno != errno.ENOSPC:
        raise exc
    print(f"{FAILURE_MARKER} cause={CAUSE_DISK_FULL} path={exc.filename or '?'}: {exc.strerror}", file=sys.stderr,
          flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="experiment name or YAML path")
    parser.add_argument("--run-dir", type=Path, help="a build job's run directory: build its spec.json")
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--recompute-norm", action="store_true", help="re-run the PT statistics pass")
    parser.add_argument("--report", type=Path, help="write the JSON report here (rank N appends .rankN)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    from ground.errors import UserError
    from ground.paths import atomic_write_text

    if (args.spec is None) == (args.run_dir is None):
        parser.error("give exactly one of --spec and --run-dir")
    from trainers.build_ranks import build_rank, rank_line

    try:
        with build_rank() as context:
            rank, world_size = context.ranks.rank, context.ranks.world
            spec: Any = args.spec if args.run_dir is None else run_dir_spec(args.run_dir)
            report = build(spec, args.mode, rank=rank, world_size=world_size, recompute_norm=args.recompute_norm,
                           progress=not args.no_progress, barrier=context.barrier, share=context.share,
                           device=context.device)
            report["threads"] = context.threads
            print(rank_line(context, mode=args.mode, samples=report["my_samples"],
                            encoded=sum(row["encoded"] for row in report["slots"].values())), flush=True)
    except UserError as exc:
        print(exc.line(), file=sys.stderr)
        return 2
    except OSError as exc:
        return disk_full_exit(exc)
    if args.report:
        path = args.report if world_size == 1 else args.report.with_name(f"{args.report.name}.rank{rank}")
        atomic_write_text(path, json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    starting()  # before torch and diffusers: their imports are most of a builder's start
    sys.exit(main())


def launch(spec_path: str, mode: str, *, processes: int, recompute_norm: bool = False,
           env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run the builder as ``processes`` ranks (1: a plain subprocess); one report per rank."""
    import subprocess
    import tempfile

    from ground.errors import CheckFailed
    from ground.paths import REPO_ROOT
    from trainers.build_ranks import builder_command

    with tempfile.TemporaryDirectory(prefix="latent_build_") as tmp:
        report = Path(tmp) / "report.json"
        builder = ["trainers.build_latent_cache", "--spec", spec_path, "--mode", mode, "--report", str(report)]
        if recompute_norm:
            builder.append("--recompute-norm")
        argv, run_env = builder_command(builder, processes, env=env)
        result = subprocess.run(argv, cwd=REPO_ROOT, env=run_env)
        if result.returncode != 0:
            raise CheckFailed(f"latent cache build failed (exit {result.returncode}): {' '.join(argv)}")
        paths = [report] if processes == 1 else [report.with_name(f"report.json.rank{r}") for r in range(processes)]
        return [json.loads(p.read_text()) for p in paths]

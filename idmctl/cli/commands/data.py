"""``idmctl data demos|scenes``: real robosuite demos (camera frames included) and synthetic depth scenes, in the robomimic layout."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from idmctl.cli.commands import options

from ground.errors import UserError
from idmctl.cli.output import console, emit_json
from ground.units import format_bytes

if TYPE_CHECKING:
    from trainers.sim.demos import RecordedDemo

app = typer.Typer(help="Episode data: scripted robosuite demos, synthetic depth scenes.", no_args_is_help=True)

PATCH_PIXELS = 16
"""Video models want frame sizes that are multiples of 16 (84 px silently becomes an 80 px grid)."""


def validate_demo_args(env: str, n: int, out: Path, camera_size: int, steps: int, valid: int | None = None) -> None:
    """Every bad argument is a one-line error before anything runs or is written."""
    from trainers.sim.demos import SUPPORTED_ENVS  # numpy only; robosuite loads later

    if env not in SUPPORTED_ENVS:
        raise UserError(f"no scripted policy for env {env!r}", field="--env", hint=f"use one of: {', '.join(SUPPORTED_ENVS)}")
    if n < 2:
        raise UserError(f"--n {n} leaves no held-out demo", field="--n", hint="use at least 2 (one train, one valid)")
    if valid is not None and not 1 <= valid < n:
        raise UserError(f"--valid {valid} must leave at least one demo on each side of {n}", field="--valid",
                        hint=f"use 1..{n - 1}")
    if camera_size < PATCH_PIXELS or camera_size % PATCH_PIXELS:
        raise UserError(f"camera size {camera_size} px is not a positive multiple of {PATCH_PIXELS}",
                        field="--camera-size", hint="e.g. 64")
    if steps < 2:
        raise UserError(f"--steps {steps} is too short to compare EEF tracks", field="--steps", hint="e.g. 49")
    if out.suffix not in (".hdf5", ".h5"):
        raise UserError("output must be an .hdf5 file", file=str(out), field="--out", hint="e.g. demos.hdf5")
    if out.exists() and out.is_dir():
        raise UserError("output is a directory", file=str(out), field="--out", hint="name a file")


def demos_progress(demo: "RecordedDemo", index: int, total: int) -> None:
    verdict = "lifted" if demo.lifted else "NOT lifted"
    fps = len(demo.actions) / demo.seconds if demo.seconds > 0 else 0.0
    console.print(f"      {demo.name:8s} {len(demo.actions)} steps  {verdict:10s} {demo.seconds:5.1f} s "
                  f"({fps:.0f} frames/s)  [{index + 1}/{total}]")


def describe(summary: dict[str, Any]) -> str:
    splits = ", ".join(f"{k} {v}" for k, v in summary["splits"].items())
    return (f"{summary['demos']} {summary['env']} demos × {summary['steps_per_demo']} steps, "
            f"{summary['lifted']}/{summary['demos']} lifted, {summary['camera']}, splits {splits}, "
            f"{format_bytes(summary['bytes'])} in {summary['seconds']:.1f} s → {summary['path']}")


@app.command("demos")
def demos(
    out: Annotated[Path, typer.Option("--out", help="HDF5 file to write (robomimic layout).")],
    env: Annotated[str, typer.Option("--env", help="robosuite environment.")] = "Lift",
    n: Annotated[int, typer.Option("--n", **options.COUNT, help="Number of demos.")] = 8,
    valid: Annotated[int | None, typer.Option("--valid", **options.COUNT, help="Last demos held out as mask/valid; default n // 4.")] = None,
    seed: Annotated[int, typer.Option("--seed", **options.SEED, help="Seeds robosuite's placement: same seed, same demos.")] = 0,
    camera_size: Annotated[int, typer.Option("--camera-size", **options.FRAME_PX, help="Square camera frames, px (multiple of 16).")] = 64,
    steps: Annotated[int, typer.Option("--steps", **options.COUNT, help="Steps per demo.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable summary.")] = False,
) -> None:
    """Scripted robosuite demos (Panda, OSC pose controller, agentview camera), deterministic per seed."""
    validate_demo_args(env, n, out, camera_size, steps, valid)
    from trainers.sim.demos import make_demos  # start-up: pulls numpy

    if not as_json:
        console.print(f"robosuite {env}: {n} demos × {steps} steps, camera {camera_size}×{camera_size}, seed {seed}")
    summary = make_demos(out, env, n, seed=seed, camera_size=camera_size, horizon=steps, valid=valid,
                         progress=None if as_json else demos_progress)
    if as_json:
        emit_json(summary)
    else:
        console.print(describe(summary))


@app.command("scenes")
def scenes(
    out: Annotated[Path, typer.Option("--out", help="HDF5 file to write (robomimic layout).")],
    n: Annotated[int, typer.Option("--n", **options.COUNT, help="Number of episodes (the last is held out as mask/valid).")] = 3,
    steps: Annotated[int, typer.Option("--steps", **options.COUNT, help="Steps per episode.")] = 9,
    size: Annotated[int, typer.Option("--size", **options.FRAME_PX, help="Square frames, px (multiple of 16).")] = 32,
    seed: Annotated[int, typer.Option("--seed", **options.SEED, help="Same seed, same episodes.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable summary.")] = False,
) -> None:
    """Synthetic table scenes with exact depth on two cameras (a box sliding on a table; the second
    camera carries card B's invalid-depth block): the episodes of experiments/latent_rgbpt_smoke.yaml."""
    import time

    if n < 2:
        raise UserError(f"--n {n} leaves no held-out episode", field="--n", hint="use at least 2")
    if steps < 2:
        raise UserError(f"--steps {steps} is too short", field="--steps", hint="e.g. 9")
    if size < PATCH_PIXELS or size % PATCH_PIXELS:
        raise UserError(f"frame size {size} px is not a positive multiple of {PATCH_PIXELS}", field="--size",
                        hint="e.g. 32")
    if out.suffix not in (".hdf5", ".h5"):
        raise UserError("output must be an .hdf5 file", file=str(out), field="--out", hint="e.g. scenes.hdf5")
    if out.exists() and out.is_dir():
        raise UserError("output is a directory", file=str(out), field="--out", hint="name a file")
    from cache.latent.scenes import write_scene_episodes  # start-up: pulls h5py and numpy

    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_scene_episodes(out, demos=n, steps=steps, size=size, seed=seed)
    summary = {"path": str(out), "episodes": n, "steps_per_episode": steps, "size": size, "seed": seed,
               "cameras": ["robot0_agentview_left", "robot0_agentview_right"],
               "splits": {"train": n - 1, "valid": 1}, "bytes": out.stat().st_size,
               "seconds": time.perf_counter() - started}
    if as_json:
        emit_json(summary)
    else:
        console.print(f"{n} synthetic scenes × {steps} steps, 2 cameras {size}×{size} with depth, splits train "
                      f"{n - 1}, valid 1, {format_bytes(summary['bytes'])} in {summary['seconds']:.1f} s → {out}",
                      markup=False)

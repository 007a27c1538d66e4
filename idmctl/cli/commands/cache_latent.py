"""``idmctl cache build|status``: card B's RGB / PT / FF video-latent cache of an experiment.

Decorated onto the ``idmctl cache`` sub-app of :mod:`idmctl.cli.commands.cache`; importing this module
registers the commands. Nothing heavy is imported until a command runs.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from idmctl.cli.commands import options
from idmctl.cli.commands.cache import app
from ground.errors import UserError
from idmctl.cli.output import console, emit_json, make_table

MODES = ("rgb", "pt", "ff", "all")


@app.command("build")
def build_cmd(
    experiment: options.Experiment,
    mode: Annotated[str, typer.Option("--mode", help="Slot to build: rgb, pt, ff, or all (the lazy-fill flow).")] = "all",
    processes: Annotated[int, typer.Option("--processes", **options.PROCESSES, help="builder ranks (torchrun); work is sharded "
                                           "by process index.")] = 1,
    recompute_norm: Annotated[bool, typer.Option("--recompute-norm", help="Re-run the PT statistics pass (new "
                                                 "norm file → new _pt__<hash>/ dir).")] = False,
    as_json: options.Json = False,
) -> None:
    """Build latent slots of EXP; resumable (skips what exists), atomic writes, only the slot asked for."""
    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r}", field="--mode", hint=f"one of {', '.join(MODES)}")
    from ground.spec import load_spec  # pydantic loads only when the command runs

    resolved = load_spec(experiment)
    if resolved.spec.latent is None:
        raise UserError("the spec has no latent section", file=str(resolved.path), field="latent",
                        hint="add `latent:` (see experiments/latent_rgbpt_smoke.yaml)")
    if processes == 1:
        from trainers.build_latent_cache import build  # imports torch only when building

        reports = [build(str(resolved.path), mode, recompute_norm=recompute_norm, progress=not as_json)]
    else:
        from trainers.build_latent_cache import launch  # start-up: only this command needs it (2 more project modules)

        reports = launch(str(resolved.path), mode, processes=processes, recompute_norm=recompute_norm)
    summary = _merge(reports)
    if as_json:
        emit_json({"experiment": resolved.name, **summary})
        return
    table = make_table("slot", "encoded", "skipped", "directory")
    for slot, row in summary["slots"].items():
        table.add_row(slot, str(row["encoded"]), str(row["skipped"]), row["dir"])
    console.print(table)
    console.print(f"{summary['samples']} samples over {summary['world_size']} process(es); PT hash "
                  f"{summary['pt_hash'] or '—'}", markup=False)


def _merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    slots: dict[str, dict[str, Any]] = {}
    for report in reports:
        for slot, row in report["slots"].items():
            merged = slots.setdefault(slot, {"dir": row["dir"], "encoded": 0, "skipped": 0})
            merged["encoded"] += row["encoded"]
            merged["skipped"] += row["skipped"]
    first = reports[0]
    return {"mode": first["mode"], "pt_hash": first["pt_hash"], "samples": first["samples"],
            "world_size": first["world_size"], "slots": slots,
            "per_rank": [{"rank": r["rank"], "samples": r["my_samples"],
                          "encoded": {s: v["encoded"] for s, v in r["slots"].items()}} for r in reports]}


@app.command("status")
def status_cmd(experiment: options.Experiment, as_json: options.Json = False) -> None:
    """Per latent slot: directory, hash, files present / expected; and stale PT directories."""
    from cache.latent.status import latent_status  # start-up: pulls pydantic and yaml

    from ground.spec import load_spec  # pydantic loads only when the command runs

    resolved = load_spec(experiment)
    if resolved.spec.latent is None:
        raise UserError("the spec has no latent section", file=str(resolved.path), field="latent",
                        hint="add `latent:` (see experiments/latent_rgbpt_smoke.yaml)")
    status = latent_status(resolved)
    if as_json:
        emit_json(status)
        return
    console.print(f"# latent cache of {status['experiment']} ({status['geometry']}) under {status['base']}",
                  markup=False)
    table = make_table("slot", "directory", "hash", "present / expected", "temp files")
    for row in status["slots"]:
        expected = "?" if row["expected"] is None else str(row["expected"])
        name = row["dir"].rpartition("/")[2] if row["dir"] else "(needs the PT norm file)"
        table.add_row(row["slot"], name, row["hash"] or "—", f"{row['present']} / {expected}", str(row["temp_files"]))
    console.print(table)
    console.print(f"PT norm file: {status['norm_file']}", markup=False)
    if status["stale_pt_dirs"]:
        console.print("stale PT dirs (older norm file or extractor; safe to delete when unused):", markup=False)
        for stale in status["stale_pt_dirs"]:
            console.print(f"  {stale['dir']}  {stale['files']} files  extractor {stale['extractor_version']}",
                          markup=False)
    else:
        console.print("stale PT dirs: none", markup=False)
    for note in status["notes"]:
        console.print(f"note: {note}", markup=False)

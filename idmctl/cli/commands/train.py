"""``idmctl train EXP`` (run the trainer here) and ``idmctl model summary EXP`` (parameters, routing).

The trainer runs as a subprocess (``python -m trainers.train --run-dir DIR``), exactly as a Slurm
job runs it, so this module never imports torch at import time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from idmctl.cli.commands import options
from ground.contract import EXIT_NAN, EXIT_REQUEUE, FAILURE_FILE
from ground.errors import CheckFailed, UserError
from idmctl.cli.output import console, emit_json, make_table
from ground.paths import REPO_ROOT, home


def default_run_dir(name: str, short_hash: str) -> Path:
    """``$IDMCTL_HOME/runs/<experiment>-<hash12>``: one directory per spec version."""
    return home() / "runs" / f"{name}-{short_hash}"


def train(
    experiment: options.Experiment,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Run directory (default: $IDMCTL_HOME/runs/EXP-HASH).")] = None,
) -> None:
    """Train EXP on this machine with the real trainer; re-running resumes from the newest checkpoint."""
    from ground.run_dir import write_run_spec  # start-up: pulls pydantic and yaml

    from ground.spec import load_spec  # pydantic loads only when the command runs

    resolved = load_spec(experiment)
    directory = run_dir or default_run_dir(resolved.name, resolved.short_hash)
    write_run_spec(directory, resolved)
    console.print(f"training {resolved.name} {resolved.short_hash} in {directory}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "trainers.train", "--run-dir", str(directory)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO_ROOT)
    assert process.stdout is not None
    for line in process.stdout:
        console.print(line.rstrip("\n"), markup=False)
    code = process.wait()
    seconds = time.perf_counter() - started
    if code == 0:
        console.print(f"finished in {seconds:.1f} s; checkpoints in {directory / 'checkpoints'}")
        return
    if code == EXIT_REQUEUE:
        raise CheckFailed(f"interrupted after {seconds:.1f} s (checkpoint saved): run `idmctl train {experiment}` again to resume")
    if code == EXIT_NAN:
        failure = (directory / FAILURE_FILE).read_text().strip() if (directory / FAILURE_FILE).exists() else "?"
        raise CheckFailed(f"training stopped on a non-finite loss: {failure}")
    raise CheckFailed(f"trainer exited {code} after {seconds:.1f} s (see the output above)")


model_app = typer.Typer(help="Inspect the model a spec builds.", no_args_is_help=True)


@model_app.command("summary")
def summary(
    experiment: options.Experiment,
    as_json: options.Json = False,
) -> None:
    """Parameters by part and the routing map, built on the meta device (instant at full size)."""
    document = model_summary(experiment)
    if as_json:
        emit_json(document)
        return
    _print_summary(document)


def model_summary(experiment: str) -> dict[str, Any]:
    from trainers.registry import CARD_PARAMS_N4, CARD_SHAPE, build_model, model_class, parameter_table, routing_rows  # start-up: pulls pydantic and yaml

    from ground.spec import load_spec  # pydantic loads only when the command runs

    resolved = load_spec(experiment)
    spec = resolved.spec
    try:
        model_class(spec)  # import torch and the model module first: the timing below is the build alone
        started = time.perf_counter()
        model = build_model(spec, device="meta")
    except UserError as exc:
        exc.file = exc.file or str(resolved.path)
        raise
    build_s = time.perf_counter() - started
    n, c, kv = spec.data.routing_n, spec.data.channels, spec.model.kv_dim
    params = parameter_table(model)
    card_shape = (n, spec.model.depth) == CARD_SHAPE
    return {
        "name": resolved.name, "hash": resolved.short_hash, "class": type(model).__name__, "build_s": build_s,
        "routing_n": n, "depth": spec.model.depth, "params": params,
        "total_minus_card": params["total"] - CARD_PARAMS_N4["total"] if card_shape else None,
        "kv_projector_formula": f"{n} × ({c} × {kv} + {kv}) = {n * (c * kv + kv):,}",
        "card_n4": CARD_PARAMS_N4, "card_shape": list(CARD_SHAPE), "routing": routing_rows(spec),
    }


def _card_difference(doc: dict[str, Any]) -> str:
    """The computed total against the card's, for the card's own shape only (N=4, depth 4)."""
    total, card = doc["params"]["total"], doc["card_n4"]["total"]
    n, depth = doc["card_shape"]
    if [doc["routing_n"], doc["depth"]] != [n, depth]:
        return f"total {total:,} computed; card A's {card / 1e6:.1f}M (card) is for N={n}, depth {depth}: no difference shown"
    difference = total - card
    return (f"total {total:,} computed − {card / 1e6:.1f}M (card) = {difference / 1e6:+.2f}M "
            f"({difference / card:+.2%}); why they differ: runbook, The routed DiT")


_PARTS = (("dit", "DiT blocks"), ("kv_projectors", "KV projectors"),
          ("action_io", "action enc/dec, timestep, position, out-norm"), ("total", "total trainable"))


def _print_summary(doc: dict[str, Any]) -> None:
    console.print(f"# {doc['name']} {doc['hash']}: {doc['class']}, N={doc['routing_n']} routed layers, "
                  f"depth {doc['depth']} (meta device, built in {doc['build_s']:.2f} s)")
    table = make_table("part", "params (computed)", "", "card A (N=4)")
    for key, label in _PARTS:
        value, card = doc["params"][key], doc["card_n4"][key]
        card_text = f"~{card / 1e6:.0f}M (card)" if key == "action_io" else f"{card / 1e6:.1f}M (card)"
        table.add_row(label, f"{value:,}", f"{value / 1e6:.1f}M", card_text)
    console.print(table)
    console.print(_card_difference(doc))
    console.print(f"KV projectors: {doc['kv_projector_formula']} exactly (the card lists 20.5M for its "
                  f"4 × 5120 → 1024 projectors; the exact product is 20,975,616)")
    console.print("routing: every block cross-attends to one layer, block i → layer ⌊i·N/D⌋")
    routing = make_table("block", "layer", "cache index", "Cosmos block")
    for row in doc["routing"]:
        routing.add_row(str(row["block"]), str(row["layer"]), str(row["cache_index"]), str(row["cosmos_block"]))
    console.print(routing)

"""``idmctl eval import FILE --name NAME --protocol PROTOCOL``: record the team's own per-episode evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ground.errors import UserError
from idmctl.cli.commands import options
from idmctl.cli.output import console, emit_json

app = typer.Typer(help="Evaluations run elsewhere: per-episode files recorded as baselines with a spread.",
                  no_args_is_help=True)


def _where(items: list[str]) -> dict[str, str]:
    parsed = {}
    for item in items:
        column, sep, value = item.partition("=")
        if not sep or not column:
            raise UserError(f"not COLUMN=VALUE: {item[:60]!r}", field="--where", hint="e.g. --where arm=poca")
        parsed[column] = value
    return parsed


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="CSV/TSV/JSON, one row per episode: episode, [seed], metric columns.")],
    name: Annotated[str, typer.Option("--name", help="What decide and compare call it (a baseline name).")],
    protocol: Annotated[str, typer.Option("--protocol", help="The evaluation it ran under, e.g. card-A/MG-30-held-out:24ep.")],
    metric: Annotated[list[str] | None, typer.Option("--metric", help="A metric column (repeat); default: every numeric column.")] = None,
    where: Annotated[list[str] | None, typer.Option("--where", help="Keep only rows with COLUMN=VALUE (repeat).")] = None,
    episode_column: Annotated[str | None, typer.Option("--episode-column", help="The episode id column (default: episode).")] = None,
    seeds_share_episodes: Annotated[bool, typer.Option(
        "--seeds-share-episodes", help="The seeds repeat the same scenes (else each (seed, episode) is its own scene).")] = False,
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite an evaluation of the same name.")] = False,
    as_json: options.Json = False,
) -> None:
    """Judge every row (one line naming the file, row and column for a bad one; nothing recorded), then record it."""
    from idmctl.track.evalfile import import_eval  # start-up: the track floor loads only for this command

    record = import_eval(file, name=name, protocol=protocol, metrics=metric or None, where=_where(where or []),
                         episode_column=episode_column, seeds_share_episodes=seeds_share_episodes, replace=replace)
    means = {m: sum(v) / len(v) for m, v in record.metrics.items()}
    if as_json:
        emit_json({"name": record.name, "protocol": record.protocol, "source": record.source, "sha256": record.sha256,
                   "rows": record.rows, "episodes": len(set(record.keys())), "seeds": sorted(set(record.seeds) - {""}),
                   "seeds_share_episodes": record.seeds_share_episodes, "means": means})
        return
    seeds = sorted(set(record.seeds) - {""})
    console.print(f"eval import: {record.name} under {record.protocol}: {record.rows:,} rows from {file}"
                  + (f" ({len(seeds)} seeds" + (", sharing their episodes)" if record.seeds_share_episodes else ")") if seeds else ""),
                  markup=False, soft_wrap=True)
    for metric_name, mean in means.items():
        console.print(f"  {metric_name}: mean {mean:.4g} over {len(record.metrics[metric_name]):,} rows", markup=False)
    console.print(f"decide it: idmctl decide {record.name} --goal \"<metric> <op> <value>\"", markup=False)


@app.command("list")
def list_(as_json: options.Json = False) -> None:
    """The imported evaluations: name, protocol, rows, file."""
    from idmctl.track.evalfile import list_evals, load_eval  # start-up: the track floor loads only for this command

    records = [r for r in (load_eval(n) for n in list_evals()) if r is not None]
    if as_json:
        emit_json([{"name": r.name, "protocol": r.protocol, "rows": r.rows, "source": r.source} for r in records])
        return
    if not records:
        console.print("no imported evaluations (idmctl eval import FILE --name NAME --protocol PROTOCOL)", markup=False)
    for r in records:
        console.print(f"{r.name}  {r.protocol}  {r.rows:,} rows  {', '.join(r.metrics)}  {r.source}", markup=False, soft_wrap=True)

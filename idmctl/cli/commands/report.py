"""``idmctl report EXP… [--markdown | --html OUT | --json]``: the progress card, written from the record."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ground.errors import UserError
from idmctl.cli.commands import options
from idmctl.cli.output import console, emit_json


def report(
    experiments: Annotated[list[str], typer.Argument(help="The experiment(s) the card covers (card A: latent_c_n12_dense latent_c_n4).")],
    as_markdown: Annotated[bool, typer.Option("--markdown", help="The card as markdown (the default text).")] = False,
    html_out: Annotated[Path | None, typer.Option("--html", help="Write the card, plots embedded, to this one .html file.")] = None,
    as_json: options.Json = False,
) -> None:
    """TL;DR with the decision and its interval, the plan's arithmetic, every attempt with its cause, fix and the
    check that catches it now, GPU-hours charged/useful/lost, the baselines under their protocols, what is open."""
    from idmctl.track.card import build_card, card_json  # start-up: pulls sqlalchemy (and mlflow when runs exist)

    if html_out is not None and html_out.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"{html_out.name} is not an .html file", field="--html", hint="e.g. --html card.html")
    card = build_card(experiments, with_figures=html_out is not None)
    if html_out is not None:
        from ground.paths import atomic_write_text  # start-up: only --html writes

        atomic_write_text(html_out, card.html())
        console.print(f"report: {html_out} ({html_out.stat().st_size:,} B, {len(card.figures)} plots embedded)", markup=False)
        return
    if as_json:
        emit_json(card_json(card))
        return
    sys.stdout.write(card.markdown())  # not through rich: a markdown table row must never wrap
    del as_markdown  # markdown is the text form; the flag says so explicitly for scripts

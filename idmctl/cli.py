"""The ``idmctl`` command line: thin typer commands that call library functions.

Contract for every command: ``--json`` where it reports; exit 0 ok, 1 a check or job failed, 2 bad
input; bad input is one line ``error: <file>:<field>: <what> (<hint>)`` with no traceback unless
``--debug``, and nothing written.
"""

from __future__ import annotations

from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from ground.errors import EXIT_BAD_INPUT, EXIT_FAILED, CheckFailed, UserError

_debug = {"on": False}


class _ContractGroup(TyperGroup):
    """Turns UserError/CheckFailed from any subcommand into the one-line contract."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            if _debug["on"]:
                raise
            click.echo(exc.line(), err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except CheckFailed as exc:
            if _debug["on"]:
                raise
            if str(exc):
                click.echo(str(exc), err=True)
            ctx.exit(EXIT_FAILED)


app = typer.Typer(
    cls=_ContractGroup,
    help="Declarative experiments, mandatory preflight, Slurm submission and postmortems for IDM training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False) -> None:
    _debug["on"] = debug


def _register_commands() -> None:
    # Each command module owns one sub-app; imports here are light (no torch/mlflow).
    from idmctl.commands import exp, quickstart

    app.add_typer(exp.app, name="exp")
    app.command("quickstart")(quickstart.quickstart)
    from idmctl.commands import compare, ui
    app.command("compare")(compare.compare); app.command("ui")(ui.ui)
    from idmctl.commands import failures

    app.add_typer(failures.app, name="failures")
    from idmctl.commands import preflight
    app.command("preflight")(preflight.preflight)
    from idmctl.commands import jobs
    jobs.register(app)  # submit, sync, jobs, watch, cancel
    from idmctl.commands import cache
    app.add_typer(cache.app, name="cache")
    from idmctl.commands import cache_latent  # noqa: F401  (adds `cache build` and `cache status`)
    from idmctl.commands import train
    app.command("train")(train.train); app.add_typer(train.model_app, name="model")
    from idmctl.commands import data
    app.add_typer(data.app, name="data")
    from idmctl.commands import ledger
    app.command("ledger")(ledger.ledger)


_register_commands()


def main() -> None:
    app()

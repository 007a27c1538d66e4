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


def debug_on() -> bool:
    """Whether ``--debug`` was given: commands then let exceptions (and their tracebacks) through."""
    return _debug["on"]


def set_debug() -> None:
    """For a command's own ``--debug`` (``idmctl quickstart --debug`` as well as ``idmctl --debug quickstart``)."""
    _debug["on"] = True


def _usage_error_classes() -> tuple[type[Exception], ...]:
    # typer 0.29 parses with its own copy of click (typer._click): its UsageError is not click's.
    try:
        from typer._click.exceptions import UsageError as TyperUsageError
    except ImportError:
        return (click.UsageError,)
    return (click.UsageError, TyperUsageError)


_USAGE_ERRORS = _usage_error_classes()


def _usage_line(exc: Any) -> str:
    """Click's usage error as the contract's one line (its own is a 5–6-line box)."""
    where = exc.ctx.command_path if exc.ctx is not None else "idmctl"
    what = exc.format_message().strip().rstrip(".")
    return f"error: command line: {what} (see `{where} --help`)"


class _ContractGroup(TyperGroup):
    """Turns UserError/CheckFailed from any subcommand, and Click's usage errors, into the one-line contract."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _USAGE_ERRORS as exc:
            if type(exc).__name__ == "NoArgsIsHelpError" or _debug["on"]:
                raise
            click.echo(_usage_line(exc), err=True)
            ctx.exit(EXIT_BAD_INPUT)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _USAGE_ERRORS as exc:
            if type(exc).__name__ == "NoArgsIsHelpError" or _debug["on"]:
                raise
            click.echo(_usage_line(exc), err=True)
            ctx.exit(EXIT_BAD_INPUT)
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
    from idmctl.commands import doctor
    app.command("doctor")(doctor.doctor)


_register_commands()


def main() -> None:
    app()

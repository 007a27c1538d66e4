"""The ``idmctl`` command line: thin typer commands that call library functions.

Contract for every command: ``--json`` where it reports; exit 0 ok, 1 a check or job failed, 2 bad
input; bad input is one line ``error: <file>:<field>: <what> (<hint>)`` with no traceback unless
``--debug``, and nothing written.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from ground.errors import EXIT_BAD_INPUT, EXIT_FAILED, CheckFailed, UserError, one_line
from ground.redact import scrub_environment

if TYPE_CHECKING:
    from typer._click import Command, Context

try:  # no Pydantic adapter for a parameter whose value needs no coercion (typer internals: see pyproject)
    from idmctl.cli import coercion as cli_coercion

    cli_coercion.install()
except (ImportError, AttributeError):  # a typer without these internals: only the speed differs
    pass

_debug = {"on": False}


def debug_on() -> bool:
    """Whether ``--debug`` was given: commands then let exceptions (and their tracebacks) through."""
    return _debug["on"]


def set_debug() -> None:
    """For a command's own ``--debug`` (``idmctl quickstart --debug`` as well as ``idmctl --debug quickstart``)."""
    _debug["on"] = True


def _usage_error_classes() -> tuple[type[Exception], ...]:
    """Click's usage errors. typer 0.29 parses with its own copy of click (typer._click), whose UsageError
    is not click's; click itself (~12 ms to import) counts only once something has imported it (then
    only it can have raised one)."""
    classes: list[type[Exception]] = []
    try:
        from typer._click.exceptions import UsageError as TyperUsageError
    except ImportError:
        import click  # noqa: F401  (an older typer parses with click itself)
    else:
        classes.append(TyperUsageError)
    click = sys.modules.get("click")
    if click is not None:
        classes.append(click.UsageError)
    return tuple(classes)


def _usage_line(exc: Any) -> str:
    """Click's usage error as the contract's one line (its own is a 5–6-line box)."""
    where = exc.ctx.command_path if exc.ctx is not None else "idmctl"
    what = exc.format_message().strip().rstrip(".")
    return one_line(f"error: command line: {what} (see `{where} --help`)")


def _command(name: str) -> Callable[[typer.Typer], None]:
    """The registrar of command ``name``: the function ``name`` of ``idmctl.cli.commands.<name>``."""

    def register(target: typer.Typer) -> None:
        target.command(name)(getattr(importlib.import_module(f"idmctl.cli.commands.{name}"), name))

    return register


def _group(name: str) -> Callable[[typer.Typer], None]:
    """The registrar of command group ``name``: the Typer ``app`` of ``idmctl.cli.commands.<name>``."""

    def register(target: typer.Typer) -> None:
        target.add_typer(importlib.import_module(f"idmctl.cli.commands.{name}").app, name=name)

    return register


def _jobs(name: str) -> Callable[[typer.Typer], None]:
    """The registrar of one of submit, sync, watch, cancel and jobs (one module registers all five)."""

    def register(target: typer.Typer) -> None:
        from idmctl.cli.commands import jobs  # start-up: only the command that runs loads its module

        jobs.register(target, [name])

    return register


def _cache(target: typer.Typer) -> None:
    from idmctl.cli.commands import cache  # start-up: only the command that runs loads its module
    from idmctl.cli.commands import cache_latent  # noqa: F401  (adds `cache build` and `cache status`)

    target.add_typer(cache.app, name="cache")


def _train(target: typer.Typer) -> None:
    """`train` and `model` live in one module and are registered together."""
    from idmctl.cli.commands import train  # start-up: only the command that runs loads its module

    target.command("train")(train.train)
    target.add_typer(train.model_app, name="model")


def _eval(target: typer.Typer) -> None:
    """`eval` lives in ``eval_import`` (a module named ``eval`` would read as the builtin)."""
    from idmctl.cli.commands import eval_import  # start-up: only the command that runs loads its module

    target.add_typer(eval_import.app, name="eval")


_COMMANDS: dict[str, Callable[[typer.Typer], None]] = {
    # In the order `idmctl --help` lists them: typer puts plain commands before groups, each in the
    # order they were registered.
    "quickstart": _command("quickstart"), "compare": _command("compare"), "decide": _command("decide"),
    "report": _command("report"), "ui": _command("ui"),
    "preflight": _command("preflight"),
    "submit": _jobs("submit"), "sync": _jobs("sync"), "watch": _jobs("watch"), "cancel": _jobs("cancel"),
    "train": _train, "ledger": _command("ledger"), "doctor": _command("doctor"), "gc": _command("gc"),
    "notify": _command("notify"),
    "exp": _group("exp"), "failures": _group("failures"), "jobs": _jobs("jobs"), "cache": _cache, "model": _train,
    "data": _group("data"), "controller": _group("controller"), "eval": _eval,
}
"""Each command and the function that registers it (and its siblings from the same module)."""


def _noop() -> None:
    """The scratch app's callback: with one, typer builds a group even around a single command."""


class _LazyCommands(MutableMapping[str, Any]):
    """The root group's commands, each module imported only when its command is looked up (start-up time).

    Importing every command module and converting every command (typer builds a Pydantic adapter per
    parameter) cost ~0.1 s of each `idmctl` process. Names, order and suggestions come from
    :data:`_COMMANDS` without importing anything; ``idmctl --help`` loads them all. A command is built
    by registering it on a scratch Typer, exactly as it used to be registered on ``app``."""

    def __init__(self, eager: MutableMapping[str, Command]) -> None:
        self._built: dict[str, Command] = dict(eager)

    def _build(self, name: str) -> None:
        scratch = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        scratch.callback()(_noop)
        _COMMANDS[name](scratch)
        built = typer.main.get_command(scratch)
        assert isinstance(built, TyperGroup)
        for sibling, command in built.commands.items():
            self._built.setdefault(sibling, command)

    def __getitem__(self, name: str) -> Command:
        if name not in self._built and name in _COMMANDS:
            self._build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def _names(self) -> list[str]:
        return [*_COMMANDS, *(name for name in self._built if name not in _COMMANDS)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name: object) -> bool:
        return name in _COMMANDS or name in self._built


class _ContractGroup(TyperGroup):
    """Turns UserError/CheckFailed from any subcommand, and Click's usage errors, into the one-line contract.
    Its commands are loaded on first use (:class:`_LazyCommands`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(self.commands)

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _usage_error_classes() as exc:  # evaluated only when an exception is raised
            if type(exc).__name__ == "NoArgsIsHelpError" or _debug["on"]:
                raise
            typer.echo(_usage_line(exc), err=True)
            ctx.exit(EXIT_BAD_INPUT)

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except _usage_error_classes() as exc:  # evaluated only when an exception is raised
            if type(exc).__name__ == "NoArgsIsHelpError" or _debug["on"]:
                raise
            typer.echo(_usage_line(exc), err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except UserError as exc:
            if _debug["on"]:
                raise
            typer.echo(exc.line(), err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except CheckFailed as exc:
            if _debug["on"]:
                raise
            if str(exc):
                typer.echo(scrub_environment(str(exc)), err=True)
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
    _printable_anywhere()


def _printable_anywhere() -> None:
    """On a terminal or pipe that is not UTF-8 (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``), characters it
    cannot encode are written as escapes instead of raising: preflight's table (``→``, ``×``) raised
    UnicodeEncodeError after its run was recorded, and a path or a description can hold any character."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and encoding not in ("utf8", "utf16", "utf32"):
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change mid-flight: leave it as it is
                pass


def main() -> None:
    try:
        app()
    finally:
        # The command is done (typer ends it with SystemExit). Freezing what is left spares the interpreter's
        # last garbage collections of every imported module's objects at shutdown: ~30 ms of a ~0.25 s
        # `idmctl submit`. Atexit handlers, weakref finalizers and flushing stdout still run;
        # what only that last collection would have closed is closed first: the store connections (they
        # sit in reference cycles, and their close checkpoints the WAL).
        from idmctl.record import close_open_stores

        close_open_stores()
        gc.freeze()

"""idmctl/cli/coercion.py skips typer's Pydantic adapter only where it would return the value unchanged:
on every parameter of every command, for valid and invalid values alike, the deferred coercion gives
what typer's own gives — the same value, or the same error message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typer import _click as click  # typer 0.29 parses with its own copy of click
from typer.core import TyperGroup

from idmctl.cli import coercion as cli_coercion
from idmctl.cli.app import app

SAMPLES: list[Any] = [None, "", "abc", "12", " 7 ", "-1", "1.5", 12, 0, -1, 10**9, True, False, 1.5, ("a", "b"), ["3"],
                      b"bytes"]


def _parameters() -> Iterator[tuple[str, click.Context, Any]]:
    import typer.main

    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)

    def walk(command: click.Command, path: str, parent: click.Context | None) -> Iterator[tuple[str, click.Context, Any]]:
        ctx = click.Context(command, info_name=path.split()[-1], parent=parent) if parent else click.Context(command)
        for param in command.params:
            if hasattr(param, "type_descriptor"):
                yield f"{path} {param.name}", ctx, param
        if isinstance(command, TyperGroup):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, f"{path} {name}", ctx)

    yield from walk(root, "idmctl", None)


def _outcome(runtime: Any, value: Any, param: Any, ctx: click.Context) -> tuple[str, Any]:
    try:
        return "value", runtime.coerce(value, param=param, ctx=ctx)
    except click.exceptions.ClickException as exc:
        return type(exc).__name__, exc.format_message()
    except Exception as exc:  # what typer itself raises for this value, compared as such
        return type(exc).__name__, str(exc)


def test_every_command_parameter_is_coerced_exactly_as_typer_does() -> None:
    compared = 0
    for where, ctx, param in _parameters():
        descriptor = param.type_descriptor
        deferred = cli_coercion.build_runtime_param(descriptor)
        typer_own = cli_coercion._ORIGINAL_BUILD(descriptor)
        for value in SAMPLES:
            ours, theirs = _outcome(deferred, value, param, ctx), _outcome(typer_own, value, param, ctx)
            assert ours == theirs, f"{where} = {value!r}: {ours} ≠ typer's {theirs}"
            assert type(ours[1]) is type(theirs[1]), f"{where} = {value!r}: {type(ours[1])} ≠ {type(theirs[1])}"
            compared += 1
    assert compared > 500, f"only {compared} comparisons: were the commands' parameters found?"


@pytest.mark.parametrize("annotation, value, unchanged", [
    (str, "x", True), (str, 3, False), (str, b"x", False),
    (int, 3, True), (int, 0, True), (int, -1, False), (int, "3", False), (int, True, False), (int, 3.0, False),
    (float, 1.5, False), (bool, True, False),
])
def test_only_values_already_of_the_parameter_s_type_skip_the_adapter(annotation: type, value: Any,
                                                                      unchanged: bool) -> None:
    from typer import _coercion
    from typer.models import OptionInfo

    descriptor = _coercion.resolve_type_descriptor(annotation, OptionInfo(min=0) if annotation is int else OptionInfo())
    assert cli_coercion.passes_unchanged(descriptor, value) is unchanged


def test_the_cli_installs_it() -> None:
    import typer.core

    assert typer.core.build_runtime_param is cli_coercion.build_runtime_param

"""Typer's per-parameter coercion, without Pydantic for the values that need none (start-up time).

typer 0.29 coerces every parameter through a Pydantic ``TypeAdapter`` that it builds on first use: the
first such parameter imports Pydantic (~60 ms of a 0.3 s ``idmctl failures --json``) and each one
builds an adapter, even for ``None`` (which typer then returns without consulting it) or for a plain
``str``/``int`` that is already what the annotation asks for.

:func:`install` makes typer build a :class:`DeferredRuntimeParam` instead: it answers only where the
adapter provably returns its input unchanged — an ``str`` for a ``str`` parameter (typer's adapter is
``str(value)``), an ``int`` within ``min``/``max`` for an unclamped ``int`` one — and hands every
other value (a string for an ``int``, a list, an out-of-range number, any ``parser=``) to the runtime
parameter typer itself builds, so its coercion and its error messages are untouched.
tests/idmctl/cli/test_cli_coercion.py compares both on every parameter of every command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import typer.core
from typer import _coercion

_ORIGINAL_BUILD = _coercion.build_runtime_param


def passes_unchanged(descriptor: _coercion.TypeDescriptor, value: Any) -> bool:
    """Whether typer's adapter for this parameter would return ``value`` itself."""
    info = descriptor.parameter_info
    if info.parser is not None or descriptor.file_annotation is not None:
        return False
    if descriptor.annotation is str:
        return type(value) is str
    if descriptor.annotation is int and not info.clamp and type(value) is int:
        return (info.min is None or value >= info.min) and (info.max is None or value <= info.max)
    return False


@dataclass(frozen=True)
class DeferredRuntimeParam(_coercion.RuntimeParam):
    """typer's runtime parameter, built only when a value needs it. ``coerce`` (typer's) still handles
    ``None`` and the multi-value checks before :meth:`_coerce_value` is reached."""

    descriptor: _coercion.TypeDescriptor

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        if passes_unchanged(self.descriptor, value):
            return value
        return self.typer_param()._coerce_value(value, param=param, ctx=ctx)

    def typer_param(self) -> _coercion.RuntimeParam:
        return _ORIGINAL_BUILD(self.descriptor)


def build_runtime_param(descriptor: _coercion.TypeDescriptor) -> _coercion.RuntimeParam:
    if descriptor.file_annotation is not None:  # typer opens files: nothing to defer
        return _ORIGINAL_BUILD(descriptor)
    return DeferredRuntimeParam(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation,
                                descriptor=descriptor)


def install() -> None:
    """Route typer's parameters through :func:`build_runtime_param` (where this typer builds them
    through ``typer.core.build_runtime_param``; elsewhere nothing changes, only the speed)."""
    if getattr(typer.core, "build_runtime_param", None) is _ORIGINAL_BUILD:
        typer.core.build_runtime_param = build_runtime_param  # type: ignore[attr-defined]

"""Dotted overrides of a spec (``loader.repeats=8``): validated against the schema with a did-you-mean,
applied to a copy of the resolved spec and validated again. ``--what-if`` and ``sweep:`` axes both use
them, so a bad field is the same one-line error everywhere."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ground.errors import UserError
from ground.spec.resolved import ResolvedSpec
from ground.spec.schema import ExperimentSpec

SOURCE = "--what-if"
"""Where a bad override came from, in the error line's file position."""


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model behind ``Model`` or ``Model | None``, else None (a leaf)."""
    candidates = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
        typing.get_origin(annotation) is typing.Union else (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def field_paths(model: type[BaseModel] = ExperimentSpec, prefix: str = "") -> list[str]:
    """Every settable dotted leaf of the spec: ``loader.repeats``, ``data.selected_layer_indices``, ..."""
    paths: list[str] = []
    for name, info in model.model_fields.items():
        sub = _submodel(info.annotation)
        paths += field_paths(sub, f"{prefix}{name}.") if sub else [f"{prefix}{name}"]
    return paths


def check_path(dotted: str, source: str = SOURCE) -> None:
    """Raise the one-line error for a dotted path the spec has no field for, with a did-you-mean."""
    model: type[BaseModel] | None = ExperimentSpec
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if model is None or part not in model.model_fields:
            known = field_paths()
            close = difflib.get_close_matches(dotted, known, n=1, cutoff=0.5)
            if not close and model is not None:  # "loader.repeat" → the nearest field of that section
                near = difflib.get_close_matches(part, list(model.model_fields), n=1)
                close = [".".join([*parts[:depth], near[0]])] if near else []
            if not close:  # "repeats" alone → "loader.repeats"
                close = [p for p in known if p.rsplit(".", 1)[-1] == parts[-1]][:1]
            hint = f"did you mean {close[0]!r}?" if close else "see `idmctl exp show EXP` for the fields"
            raise UserError("unknown field", file=source, field=dotted, hint=hint)
        sub = _submodel(model.model_fields[part].annotation)
        if depth < len(parts) - 1:
            model = sub
        elif sub is not None:
            raise UserError("is a section, not a field", file=source, field=dotted,
                            hint=f"set one of its fields, e.g. {dotted}.{next(iter(sub.model_fields))}")


def parse_override(text: str, source: str = SOURCE) -> tuple[str, Any]:
    """``loader.repeats=8`` → ("loader.repeats", 8); the value is YAML (``[1,4,7,10]``, ``true``, ``7-00:00:00``)."""
    dotted, sep, raw = text.partition("=")
    dotted = dotted.strip()
    if not sep or not dotted:
        raise UserError(f"{text!r} is not section.field=value", file=source, hint="e.g. --what-if loader.repeats=8")
    check_path(dotted, source)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return dotted, value


def get_dotted(document: dict[str, Any], dotted: str) -> Any:
    node: Any = document
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def set_dotted(document: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = document
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def apply_overrides(resolved: ResolvedSpec, overrides: dict[str, Any], source: str = SOURCE,
                    name: str | None = None, **extra: Any) -> ResolvedSpec:
    """The spec with ``overrides`` applied and validated again; the file on disk is never touched.
    ``extra`` sets ResolvedSpec fields of the result (a sweep variant's ``sweep`` and ``axes``)."""
    document = resolved.spec.model_dump(mode="json")
    for dotted, value in overrides.items():
        check_path(dotted, source)
        set_dotted(document, dotted, value)
    try:
        spec = ExperimentSpec.model_validate(document)
    except ValidationError as exc:
        raise _override_error(exc, resolved, overrides, source) from None
    return ResolvedSpec(name=name or resolved.name, path=resolved.path, spec=spec, chain=resolved.chain, **extra)


def _override_error(exc: ValidationError, resolved: ResolvedSpec, overrides: dict[str, Any],
                    source: str) -> UserError:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    head, sep, rest = message.partition(": ")
    if sep and " " not in head:  # cross-field validators name their field: "repeats: 3 does not divide ..."
        loc, message = ".".join([*filter(None, loc.split(".")), head]), rest
    dotted = next((d for d in overrides if loc == d or loc.startswith(d + ".")), None) or \
        next((d for d in overrides if d.startswith(loc)), None) or loc
    now = get_dotted(resolved.spec.model_dump(mode="json"), dotted)
    if first["type"] in ("value_error", "assertion_error"):
        hint = f"it is {yaml.safe_dump(now, default_flow_style=True).strip().removesuffix('...').strip()} now"
    else:
        message = f"{message}, got {first.get('input')!r}"
        example = yaml.safe_dump(now, default_flow_style=True).strip().removesuffix("...").strip()
        hint = f"a value like its current one, e.g. {dotted}={example}"
    return UserError(message, file=source, field=dotted, hint=hint)

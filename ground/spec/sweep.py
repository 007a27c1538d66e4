"""``sweep:``: one spec file, several named variants, each its own resolved spec with its own hash.

```yaml
extends: latent_c_n4
sweep:
  zip:                     # or grid: (every combination)
    data.selected_layer_indices: [[1, 4, 7, 10], [1, 4, 7, 10], [0, 2, 4, 7, 9, 11]]
    model.depth: [4, 12, 12]
  names: [n4_d4, n4_d12, n6_d12]   # optional; default from the values
```

Each axis is a dotted field, checked like ``--what-if`` (unknown → did-you-mean); variant ``v`` of
sweep ``S`` is named ``S.v`` (``idmctl preflight S.v`` runs one, ``idmctl preflight S`` all).
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from ground.errors import UserError
from ground.spec.resolved import ResolvedSpec
from ground.spec.overrides import apply_overrides, check_path

MODES = ("grid", "zip")
MAX_VARIANTS = 256
"""Variants one sweep may expand to: each is preflighted and recorded (a 10,000-variant grid ran until
killed, recording thousands of runs; a few short axes multiplied to 1e8 and a MemoryError). The
product is counted from the axis lengths before anything is built; split a bigger study into files."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_+-]{0,63}$")
"""Variant names end up in job names and run directories: no dots (they separate sweep and variant)."""


def _value_name(value: Any) -> str:
    if isinstance(value, list):
        return "-".join(map(str, value))
    return re.sub(r"[^A-Za-z0-9_+-]", "-", str(value))


def default_name(values: dict[str, Any]) -> str:
    """``{data.selected_layer_indices: [1,4], model.depth: 4}`` → ``selected_layer_indices-1-4_depth-4``."""
    return "_".join(f"{axis.rsplit('.', 1)[-1]}-{_value_name(v)}" for axis, v in values.items())[:64]


def parse(base: ResolvedSpec, sweep: Any) -> tuple[str, dict[str, list[Any]], list[dict[str, Any]], list[str]]:
    """(mode, axes, one {axis: value} per variant, names); every problem is a one-line UserError."""
    file = str(base.path)
    if not isinstance(sweep, dict):
        raise UserError("must be a mapping with grid: or zip:", file=file, field="sweep", hint="see runbook.md, planning a run")
    unknown = [k for k in sweep if k not in (*MODES, "names")]
    if unknown:
        raise UserError(f"unknown key {unknown[0]!r}", file=file, field="sweep", hint="use grid:, zip: and names:")
    modes = [m for m in MODES if m in sweep]
    if len(modes) != 1:
        raise UserError("needs exactly one of grid: or zip:", file=file, field="sweep",
                        hint="grid: every combination; zip: the i-th value of every axis together")
    mode = modes[0]
    axes = sweep[mode]
    if not isinstance(axes, dict) or not axes:
        raise UserError("needs at least one axis: field: [values]", file=file, field=f"sweep.{mode}",
                        hint="e.g. model.depth: [4, 12]")
    for axis, values in axes.items():
        try:
            check_path(str(axis), source=file)
        except UserError as exc:
            raise UserError(f"{exc.what} (a sweep axis)", file=file, field=f"sweep.{mode}.{axis}", hint=exc.hint) from None
        if not isinstance(values, list) or not values:
            raise UserError("must be a non-empty list of values", file=file, field=f"sweep.{mode}.{axis}",
                            hint=f"e.g. {axis}: [a, b]")
    count = len(next(iter(axes.values()))) if mode == "zip" else math.prod(len(values) for values in axes.values())
    if count > MAX_VARIANTS:
        shown = " × ".join(str(len(values)) for values in axes.values()) if mode == "grid" else str(count)
        raise UserError(f"expands to {shown} = {count:,} variants, more than {MAX_VARIANTS}", file=file,
                        field=f"sweep.{mode}", hint="sweep fewer values, or split the study into several sweep files")
    if mode == "zip":
        lengths = {axis: len(values) for axis, values in axes.items()}
        if len(set(lengths.values())) != 1:
            shown = ", ".join(f"{a} {n}" for a, n in lengths.items())
            raise UserError(f"zip axes differ in length ({shown})", file=file, field="sweep.zip",
                            hint="give every axis one value per variant, or use grid:")
        combos = [dict(zip(axes, row)) for row in zip(*axes.values())]
    else:
        combos = [dict(zip(axes, row)) for row in itertools.product(*axes.values())]
    names = sweep.get("names")
    if names is None:
        names = [default_name(c) for c in combos]
    elif not isinstance(names, list) or len(names) != len(combos):
        raise UserError(f"needs one name per variant ({len(combos)})", file=file, field="sweep.names",
                        hint="or leave names out to derive them from the values")
    for name in names:
        if not _NAME.match(str(name)):
            raise UserError(f"{name!r} is not a variant name", file=file, field="sweep.names",
                            hint="letters, digits, _ + - (no dots or spaces)")
    if len(set(map(str, names))) != len(names):
        raise UserError("two variants share a name", file=file, field="sweep.names", hint="name each variant once")
    return mode, axes, combos, [str(n) for n in names]


def expand(base: ResolvedSpec, sweep: Any) -> list[ResolvedSpec]:
    """Every variant, validated: an axis value the schema refuses is a one-line error naming the variant."""
    _, _, combos, names = parse(base, sweep)
    variants = []
    for name, values in zip(names, combos):
        try:
            variants.append(apply_overrides(base, values, source=str(base.path), name=f"{base.name}.{name}",
                                            sweep=base.name, axes=values))
        except UserError as exc:
            raise UserError(f"variant {name}: {exc.what}", file=str(base.path), field=exc.field, hint=exc.hint) from None
    return variants

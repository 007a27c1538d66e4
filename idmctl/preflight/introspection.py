"""Check ``introspection``: resolve the dataset, collate and model classes through the same
registries the trainer uses and bind every configured kwarg against each class's signature — no
objects are built. Card job 6321: ``selected_layer_indices`` was added to HiddenRaw (line 415) while
the class in use was HiddenMultiLayer (line 568) → TypeError after a 2 h stage.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from idmctl.errors import UserError
from idmctl.paths import REPO_ROOT
from idmctl.preflight.result import CheckResult, PreflightContext, Status

NAME = "introspection"


def where(obj: Any) -> str:
    """``file:line`` of a class or function, relative to the repository when inside it."""
    try:
        path = Path(inspect.getsourcefile(obj) or "?")
        line = inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return "<unknown source>"
    try:
        shown = path.resolve().relative_to(REPO_ROOT)
    except ValueError:
        shown = path
    return f"{shown}:{line}"


def _qualified(cls: Any) -> str:
    return f"{getattr(cls, '__name__', repr(cls))} ({where(cls)})"


def bind_error(target: Callable[..., Any], kwargs: dict[str, Any]) -> str | None:
    """The TypeError ``target(**kwargs)`` would raise on its signature, or None when it binds."""
    try:
        inspect.signature(target).bind(**kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def _alternatives(registry: Any, kwargs: dict[str, Any], wrong: Any) -> list[str]:
    """Other registered dataset classes that do take these kwargs (the look-alike the author meant)."""
    table = getattr(registry, "DATASETS", None)
    if not isinstance(table, dict):
        return []
    found = []
    for name in table:
        try:
            cls = registry.dataset_class_by_name(name) if hasattr(registry, "dataset_class_by_name") else None
        except Exception:  # an unrelated broken entry must not hide this check's verdict
            cls = None
        if cls is None or cls is wrong:
            continue
        if bind_error(cls, kwargs) is None:
            found.append(f"data.dataset: {name} → {_qualified(cls)}")
    return found


def _resolve(ctx: PreflightContext) -> tuple[list[tuple[str, Any, dict[str, Any]]], list[str], list[str]]:
    """(role, class or function, kwargs) triples to bind, plus FAIL lines and fixes from resolving."""
    spec = ctx.spec
    targets: list[tuple[str, Any, dict[str, Any]]] = []
    fails: list[str] = []
    fixes: list[str] = []
    from cache import registry as data_registry
    from trainers import registry as model_registry

    for split in dict.fromkeys((spec.data.train_split, spec.data.eval_split)):
        try:
            targets.append((f"dataset[{split}]", data_registry.dataset_class(spec), data_registry.dataset_kwargs(spec, split)))
        except UserError as exc:
            fails.append(f"dataset: {exc.line().removeprefix('error: ')}")
            fixes.append(exc.hint or "fix data.dataset")
            break
    collate = getattr(data_registry, "collate_fn", None)
    if callable(collate):
        try:
            targets.append(("collate", collate(spec), {}))
        except UserError as exc:
            fails.append(f"collate: {exc.line().removeprefix('error: ')}")
    try:
        targets.append(("model", model_registry.model_class(spec), model_registry.model_kwargs(spec)))
    except UserError as exc:
        fails.append(f"model: {exc.line().removeprefix('error: ')}")
        fixes.append(exc.hint or "fix model.name")
    return targets, fails, fixes


def check(ctx: PreflightContext) -> CheckResult:
    try:
        targets, fails, fixes = _resolve(ctx)
    except ImportError as exc:
        return CheckResult(NAME, Status.FAIL, f"cannot import the trainer's registries: {exc}", {},
                           "fix the import error (run `python -c 'import cache.registry, trainers.registry'`)")
    bound: list[str] = []
    numbers: dict[str, Any] = {}
    for role, target, kwargs in targets:
        numbers[role] = {"class": getattr(target, "__name__", repr(target)), "where": where(target),
                         "kwargs": sorted(kwargs)}
        if role == "collate":
            bound.append(f"collate {_qualified(target)}")
            continue
        error = bind_error(target, kwargs)
        if error is None:
            bound.append(f"{role} {_qualified(target)} takes {', '.join(sorted(kwargs)) or 'no kwargs'}")
            continue
        fails.append(f"{role}: {_qualified(target)} rejects the spec's kwargs → TypeError: {error}")
        from cache import registry as data_registry

        others = _alternatives(data_registry, kwargs, target) if role.startswith("dataset") else []
        fixes.append(f"did you mean {' or '.join(others)}?" if others else
                     f"add the parameter to {getattr(target, '__name__', target)}.__init__ ({where(target)}) or stop "
                     "configuring it")
    if fails:
        return CheckResult(NAME, Status.FAIL, "; ".join(fails), numbers, "; ".join(dict.fromkeys(fixes)))
    return CheckResult(NAME, Status.PASS, "kwargs bind: " + "; ".join(bound), numbers)

"""Check ``introspection``: resolve the dataset, collate and model classes through the same
registries the trainer uses and bind every configured kwarg against each class's signature — no
objects are built. Card job 6321: ``selected_layer_indices`` was added to HiddenRaw (line 415) while
the class in use was HiddenMultiLayer (line 568) → TypeError after a 2 h stage.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ground.class_path import code_roots
from ground.code_snapshot import git, snapshot_paths
from ground.errors import UserError
from ground.paths import REPO_ROOT
from ground.spec.schema import ClassRef, class_label
from idmctl.core.checks import CheckResult, PreflightContext, Status
from idmctl.gate import box, kwargs_flow
from idmctl.gate.box import progress
from trainers import registry as model_registry

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
    """The TypeError ``target(**kwargs)`` would raise, or None when the kwargs bind.

    Unexpected keywords are named first (that is what Python raises first, and what card job 6321
    hit); missing required parameters are listed too, so one preflight shows every mismatch.
    """
    signature = inspect.signature(target)
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unexpected = [] if takes_any else [k for k in kwargs if k not in params or
                                       params[k].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)]
    missing = [name for name, p in params.items()
               if p.default is inspect.Parameter.empty and name not in kwargs
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if not unexpected and not missing:
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            return str(exc)
        return None
    parts = [f"got an unexpected keyword argument {name!r}" for name in unexpected]
    if missing:
        parts.append(f"missing required argument{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    return f"{getattr(target, '__name__', target)}.__init__() " + "; ".join(parts)


def unexpected(target: Callable[..., Any], kwargs: dict[str, Any]) -> list[str]:
    """The kwargs ``target``'s signature has no parameter for (none when it takes ``**kwargs``)."""
    params = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [k for k in kwargs if k not in params
            or params[k].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)]


def sibling_hints(target: type, kwargs: dict[str, Any]) -> list[str]:
    """For each kwarg ``target`` rejects: the look-alike class of the same module that takes it (card A job
    6321: the parameter went into HiddenRaw, line 415, while HiddenMultiLayer, line 568, was built), else
    the parameter of ``target`` it is probably a misspelling of."""
    import difflib
    import sys

    module = sys.modules.get(getattr(target, "__module__", ""), None)
    classes = [obj for obj in vars(module).values() if inspect.isclass(obj) and obj is not target
               and obj.__module__ == target.__module__] if module is not None else []
    own = [name for name in inspect.signature(target).parameters if name not in ("self", "args", "kwargs")]
    hints = []
    for name in unexpected(target, kwargs):
        takers = [cls for cls in classes if _takes(cls, name)]
        if takers:
            others = " and ".join(f"{cls.__name__} ({where(cls)})" for cls in takers)
            hints.append(f"`{name}` is accepted by {others}, not by {target.__name__} ({where(target)}), "
                         "the class this spec builds")
            continue
        close = difflib.get_close_matches(name, own, n=1)
        if close:
            hints.append(f"`{name}`: did you mean `{close[0]}` of {target.__name__} ({where(target)})?")
    return hints


def _takes(cls: type, name: str) -> bool:
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return name in params and params[name].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                          inspect.Parameter.VAR_POSITIONAL)


def _alternatives(registry: Any, kwargs: dict[str, Any], wrong: Any) -> list[str]:
    """Other registered dataset classes that do take these kwargs (the look-alike the author meant)."""
    table = getattr(registry, "DATASETS", None)
    if not isinstance(table, dict):
        return []
    return [f"data.dataset: {name} → {_qualified(cls)}" for name, cls in table.items()
            if cls is not wrong and bind_error(cls, kwargs) is None]


def _resolve(ctx: PreflightContext) -> tuple[list[tuple[str, Any, dict[str, Any]]], list[str], list[str]]:
    """(role, class or function, kwargs) triples to bind, plus FAIL lines and fixes from resolving."""
    spec = ctx.spec
    targets: list[tuple[str, Any, dict[str, Any]]] = []
    fails: list[str] = []
    fixes: list[str] = []
    progress("importing the trainer's registries (cache.registry: torch, h5py)")
    from cache import registry as data_registry  # start-up: pulls torch and h5py

    progress(f"importing data.dataset {class_label(spec.data.dataset)}")
    try:
        # One class serves both splits and only ``split`` differs, so binding the train kwargs covers eval.
        targets.append(("dataset", data_registry.dataset_class(spec), data_registry.dataset_kwargs(spec, "train")))
    except UserError as exc:
        fails.append(f"dataset: {exc.line().removeprefix('error: ')}")
        fixes.append(exc.hint or "fix data.dataset")
    except Exception as exc:  # the team's module raised while importing: the FAIL is its own exception
        fails.append(f"dataset: importing {class_label(spec.data.dataset)} raised {_raised(exc)}")
        fixes.append("fix the module's import error; reproduce with python -c 'import <module>' from its root")
    collate = getattr(data_registry, "collate_fn", None)
    if callable(collate):
        try:
            targets.append(("collate", collate(spec), {}))
        except UserError as exc:
            fails.append(f"collate: {exc.line().removeprefix('error: ')}")
    progress(f"importing model.name {class_label(spec.model.name)}")
    try:
        targets.append(("model", model_registry.model_class(spec), model_registry.model_kwargs(spec)))
    except UserError as exc:
        fails.append(f"model: {exc.line().removeprefix('error: ')}")
        fixes.append(exc.hint or "fix model.name")
    except Exception as exc:
        fails.append(f"model: importing {class_label(spec.model.name)} raised {_raised(exc)}")
        fixes.append("fix the module's import error; reproduce with python -c 'import <module>' from its root")
    progress("binding the kwargs")
    return targets, fails, fixes


def _raised(exc: BaseException) -> str:
    """``file:line → ExcType: message`` of the innermost frame (the team's line, not importlib's)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    last = next((f for f in reversed(frames) if "importlib" not in f.filename), frames[-1] if frames else None)
    place = f"{_shown(Path(last.filename))}:{last.lineno} → " if last else ""
    return f"{place}{type(exc).__name__}: {exc}"


def _shown(path: Path) -> Path:
    try:
        return path.resolve().relative_to(REPO_ROOT)
    except ValueError:
        return path


DEADLINE_S = 120.0
"""How long the box may take to import the team's classes and bind their kwargs (torch's import is ~1.5 s
of it on this host): past it, the box's whole session is killed and the check FAILs naming the import."""


def check(ctx: PreflightContext) -> CheckResult:
    """In the box (``idmctl.gate.box``): the team's imports run in a child process of their own, so a module
    that hangs, exits or kills its process is one FAIL line here, never idmctl's own hang or exit status."""
    boxed = box.call(lambda: _check_here(ctx).as_dict(), DEADLINE_S)
    value = boxed.value if boxed.reported else None
    if isinstance(value, dict):
        try:
            return CheckResult(NAME, Status(value["status"]), str(value["summary"]), dict(value.get("numbers") or {}),
                               str(value.get("fix") or ""))
        except (KeyError, ValueError, TypeError):
            pass
    spec = ctx.spec
    classes = ", ".join(f"{field} {class_label(ref)}" for field, ref in (("data.dataset", spec.data.dataset),
                                                                         ("model.name", spec.model.name)))
    during = boxed.progress or f"importing {classes}"
    output = next((line.strip() for line in reversed(boxed.stdout.splitlines()) if line.strip()), "")
    shown = f"; its last output: {output[:200]!r}" if output else ""
    return CheckResult(NAME, Status.FAIL, f"{during}: {boxed.fact or 'no result'} (in the box, after {boxed.seconds:.1f} s)"
                                          f"{shown}",
                       {"box": {"fact": boxed.fact, "returncode": boxed.returncode, "timed_out": boxed.timed_out,
                                "seconds": round(boxed.seconds, 3), "during": during}},
                       "importing the module must only define its classes (no sleep, sys.exit, os._exit or "
                       "server at import); reproduce with `python -c 'import MODULE'` from its code root")


def _check_here(ctx: PreflightContext) -> CheckResult:
    try:
        targets, fails, fixes = _resolve(ctx)
    except ImportError as exc:
        return CheckResult(NAME, Status.FAIL, f"cannot import the trainer's registries: {exc}", {},
                           "fix the import error (run `python -c 'import cache.registry, trainers.registry'`)")
    left_out = _left_out(ctx)
    fails += left_out
    if left_out:
        fixes.append("un-ignore those files in the root's .gitignore (the rule is named above), or `git add -f` them: "
                     "the job imports from the snapshot, which holds what git lists")
    bound: list[str] = []
    warns: list[str] = []
    warn_fixes: list[str] = []
    numbers: dict[str, Any] = {}
    for role, target, kwargs in targets:
        numbers[role] = {"class": getattr(target, "__name__", repr(target)), "where": where(target),
                         "kwargs": sorted(kwargs)}
        if role == "collate":
            bound.append(f"collate {_qualified(target)}")
            continue
        error = bind_error(target, kwargs)
        if error is None and inspect.isclass(target):
            spec_names = _spec_kwargs(ctx, role, kwargs)
            flow = _flow(target, spec_names)
            if flow:
                numbers[role]["kwargs_flow"] = {f.name: f.verdict for f in flow}
            for fate in (f for f in flow if f.verdict == kwargs_flow.REJECTED):
                fails.append(f"{role}: `{fate.name}` is taken by {_qualified(target)}'s **kwargs and passed on: "
                             f"{fate.path}{fate.where}, which does not take it → TypeError at construction")
                fixes.append(f"remove `{fate.name}` from {_field(role)} init_args, or add it to {fate.where}")
            for fate in (f for f in flow if f.verdict == kwargs_flow.SWALLOWED):
                hint = _hint(target, fate.name)
                warns.append(f"{role}: `{fate.name}` goes nowhere: {fate.path}{fate.where} takes it by **kwargs and "
                             f"neither reads it nor passes it to a base that does{'; ' + hint if hint else ''}")
                warn_fixes.append(f"give {fate.where.split(' (')[0]}.__init__ a `{fate.name}` parameter (or read it), "
                                  f"or remove it from {_field(role)} init_args")
            if any(f.verdict == kwargs_flow.REJECTED for f in flow):
                continue
        if error is None:
            bound.append(f"{role} {_qualified(target)} binds {len(kwargs)} kwarg{'s' if len(kwargs) != 1 else ''} ({', '.join(sorted(kwargs))})")
            continue
        fails.append(f"{role}: {_qualified(target)} rejects the spec's kwargs → TypeError: {error}")
        from cache import registry as data_registry  # start-up: pulls torch and h5py

        chosen = ctx.spec.data.dataset if role == "dataset" else ctx.spec.model.name
        if isinstance(chosen, ClassRef):
            hints = sibling_hints(target, kwargs)
            fails[-1] += "".join(f"; {hint}" for hint in hints)
            fixes.append(f"fix {target.__name__}.__init__ ({where(target)}) to take what {role} init_args give, or "
                         f"point {'data.dataset' if role == 'dataset' else 'model.name'}.class_path at the class that does")
            continue
        others = _alternatives(data_registry, kwargs, target) if role == "dataset" else []
        fixes.append(f"did you mean {' or '.join(others)}?" if others else
                     f"add the parameter to {getattr(target, '__name__', target)}.__init__ ({where(target)}) or stop "
                     "configuring it")
    if fails:
        return CheckResult(NAME, Status.FAIL, "; ".join(fails), numbers, "; ".join(dict.fromkeys(fixes)))
    if warns:
        return CheckResult(NAME, Status.WARN, "kwargs bind: " + "; ".join(bound) + "; but " + "; ".join(warns), numbers,
                           "; ".join(dict.fromkeys(warn_fixes)))
    return CheckResult(NAME, Status.PASS, "kwargs bind: " + "; ".join(bound), numbers)


def _left_out(ctx: PreflightContext) -> list[str]:
    """Modules the spec's classes imported from a code root that the snapshot would not hold (a root's
    ``.gitignore`` hides them): the static preflight imports them from the live tree, the job cannot."""
    roots = [r.resolve() for r in code_roots(ctx.spec)[1:]]
    if not roots:
        return []
    found = []
    for name, module in sorted(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        root = next((r for r in roots if path.is_relative_to(r)), None)
        if root is None or {"site-packages", "dist-packages"} & set(path.parts):
            continue
        found.append((name, path, root))
    if not found:
        return []
    held = snapshot_paths(roots)
    out = []
    for name, path, root in found:
        if path in held:
            continue
        rule = ""
        try:
            answer = git(root, "check-ignore", "-v", "--no-index", str(path.relative_to(root)))
            if answer.returncode == 0:
                rule = " (ignored by " + answer.stdout.decode("utf-8", "replace").split("\t", 1)[0].strip() + ")"
        except (OSError, ValueError, subprocess.TimeoutExpired):  # no rule to name: the fact stands without it
            pass
        out.append(f"module {name} ({_shown(path)}) is imported by the spec's classes, but the code snapshot leaves "
                   f"it out{rule}: the job would raise ModuleNotFoundError")
    return out


def _field(role: str) -> str:
    return "data.dataset" if role == "dataset" else "model.name"


def _spec_kwargs(ctx: PreflightContext, role: str, kwargs: dict[str, Any]) -> list[str]:
    """The kwargs the spec itself wrote (a team class's ``init_args``; idmctl adds ``split`` on its own)."""
    chosen = ctx.spec.data.dataset if role == "dataset" else ctx.spec.model.name
    if isinstance(chosen, ClassRef):
        return [name for name in kwargs if name in chosen.init_args]
    return list(kwargs)


def _flow(target: type, names: list[str]) -> list["kwargs_flow.Fate"]:
    """Where each kwarg ``**kwargs`` takes goes (none to follow when the class has no ``**kwargs``)."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return []
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [f for f in kwargs_flow.follow(target, names, _qualified) if f.verdict != kwargs_flow.BOUND or f.path]


def _hint(target: type, name: str) -> str:
    """The look-alike class that has the parameter, else the parameter of ``target`` it is a misspelling of."""
    import difflib
    import sys

    module = sys.modules.get(getattr(target, "__module__", ""), None)
    classes = [obj for obj in vars(module).values() if inspect.isclass(obj) and obj is not target
               and obj.__module__ == target.__module__] if module is not None else []
    takers = [cls for cls in classes if _takes(cls, name)]
    if takers:
        return f"it is a parameter of {' and '.join(f'{cls.__name__} ({where(cls)})' for cls in takers)}, a look-alike class"
    own = [n for cls in target.__mro__ if "__init__" in vars(cls) and cls is not object
           for n, p in _parameters(vars(cls)["__init__"]).items()
           if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY) and n != "self"]
    close = difflib.get_close_matches(name, own, n=1)
    return f"did you mean `{close[0]}`?" if close else ""


def _parameters(function: Any) -> "Mapping[str, inspect.Parameter]":
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {}

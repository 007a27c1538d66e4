"""The team's own classes, by import path: resolved only inside the code roots a spec names.

A class path is imported (``importlib``), so it must come from code the job will run: the project or
one of ``code.roots``, both frozen into the job's snapshot. A path that imports from anywhere else (a
site-packages module, a stray checkout on ``PYTHONPATH``) is refused: its code is in no snapshot and in
no code version, so what the gate checked is not what would run.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from ground import contract
from ground.errors import UserError
from ground.spec.schema import ClassRef, ExperimentSpec


def code_roots(spec: ExperimentSpec) -> list[Path]:
    """The project and every ``code.roots`` folder, as this process sees them. Inside a job the job
    script names the snapshot's copies (``IDMCTL_CODE_ROOTS``); elsewhere a relative root is taken from
    the project root."""
    from ground.paths import REPO_ROOT, expand_path

    in_job = os.environ.get(contract.ENV_CODE_ROOTS)
    if in_job is not None:
        return [REPO_ROOT, *(Path(p) for p in in_job.split(os.pathsep) if p)]
    roots = [REPO_ROOT]
    for root in spec.code.roots:
        path = expand_path(root)
        try:
            resolved = (path if path.is_absolute() else REPO_ROOT / path).resolve()
        except (RuntimeError, OSError, ValueError) as exc:  # a symlink loop (RuntimeError), a name no filesystem holds
            raise UserError(f"code root {root!r} cannot be resolved: {exc}", field="code.roots",
                            hint="name a real folder, not a symlink loop") from None
        if resolved == Path(resolved.anchor) or resolved == Path.home().resolve():
            # Hashing every file of the machine (or of the home folder) takes minutes before failing.
            raise UserError(f"code root {root!r} is {resolved}: the snapshot would copy everything under it",
                            field="code.roots", hint="name the team repository's own folder")
        roots.append(resolved)
    return roots


def spec_roots(spec: ExperimentSpec | None) -> list[Path]:
    """The spec's ``code.roots`` as folders (relative ones from the project root); [] without a spec."""
    if spec is None or not spec.code.roots:
        return []
    from ground.paths import exists

    roots = code_roots(spec)[1:]
    for given, root in zip(spec.code.roots, roots):
        if not (exists(root) and root.is_dir()):  # exists: a name too long for any filesystem names nothing
            raise UserError(f"code root {given!r} is not a folder on this machine ({root})", field="code.roots",
                            hint="name the team repository's folder (relative to the project root, or absolute)")
    return roots


def ensure_importable(roots: list[Path]) -> None:
    """Put the code roots on this process's import path (first, after the project), once."""
    for root in reversed(roots[1:]):
        text = str(root)
        if text not in sys.path:
            sys.path.insert(1, text)


def inside(path: Path, roots: list[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(root.resolve()) for root in roots)


def resolve_class(ref: ClassRef, spec: ExperimentSpec, field: str) -> type:
    """The class ``ref.class_path`` names. A path that does not import, is not a class or lies outside
    the code roots is a UserError naming ``field``; an import that raises is the exception itself (the
    caller's check FAILs with it: the module is broken, not the spec)."""
    roots = code_roots(spec)
    ensure_importable(roots)
    module_name, _, class_name = ref.class_path.rpartition(".")
    shown = ", ".join(str(r) for r in roots)
    # The top-level package first, found without executing anything: finding ``a.b`` imports ``a``, and a
    # name from outside the roots must be refused before any of its code runs.
    top = module_name.split(".", 1)[0]
    try:
        top_spec = importlib.util.find_spec(top) if top not in sys.modules else sys.modules[top].__spec__
    except (ImportError, ValueError):
        top_spec = None
    origin = (top_spec.origin if top_spec and top_spec.origin not in (None, "built-in", "frozen", "namespace")
              else next(iter(getattr(top_spec, "submodule_search_locations", None) or []), None) if top_spec else None)
    if origin is not None and not inside(Path(origin), roots):
        raise UserError(f"{ref.class_path!r} imports from {origin}, outside the code roots ({shown})",
                        field=f"{field}.class_path",
                        hint="add that repository to code.roots, so it is frozen into the job's snapshot")
    try:
        spec_of = importlib.util.find_spec(module_name) if origin is not None else None
    except (ImportError, ValueError):
        spec_of = None
    if spec_of is None or spec_of.origin in (None, "built-in", "frozen"):
        raise UserError(f"module {module_name!r} of {ref.class_path!r} does not import from the code roots ({shown})",
                        field=f"{field}.class_path", hint="check the spelling, or add its repository to code.roots")
    if not inside(Path(spec_of.origin), roots):
        raise UserError(f"{ref.class_path!r} imports from {spec_of.origin}, outside the code roots ({shown})",
                        field=f"{field}.class_path",
                        hint="add that repository to code.roots, so it is frozen into the job's snapshot")
    module = importlib.import_module(module_name)
    target = getattr(module, class_name, None)
    if target is None:
        siblings = sorted(name for name, obj in vars(module).items() if inspect.isclass(obj) and obj.__module__ == module_name)
        import difflib

        close = difflib.get_close_matches(class_name, siblings, n=1)
        raise UserError(f"{module_name} has no {class_name!r}", field=f"{field}.class_path",
                        hint=f"did you mean {module_name}.{close[0]}?" if close else
                        f"classes there: {', '.join(siblings) or 'none'}")
    if not inspect.isclass(target):
        raise UserError(f"{ref.class_path!r} is a {type(target).__name__}, not a class", field=f"{field}.class_path",
                        hint="name the class whose __init__ takes init_args")
    return target


def init_args(ref: ClassRef) -> dict[str, Any]:
    return dict(ref.init_args)

"""Where a spec's kwarg goes when the class takes ``**kwargs``: bound by a base class, read by name, or nowhere.

Card A's job 6321 was a kwarg given to the wrong one of two look-alike classes. Python raises on that only
when the class has no ``**kwargs``; a class written ``__init__(self, root, **kwargs)`` accepts any keyword,
misspelt or not, and the value goes nowhere. So the kwargs are followed through the class's own source
(``inspect`` for the signatures, ``ast`` for the body; nothing is executed beyond the import that already
happened):

- passed on to a base (``super().__init__(**kwargs)``, ``super(C, self).__init__(**kwargs)``,
  ``Base.__init__(self, ..., **kwargs)``): that base's signature decides, recursively; a base that takes
  neither the name nor ``**kwargs`` raises TypeError at construction (``object.__init__`` takes nothing);
- read by name in the body (``kwargs["x"]``, ``kwargs.get("x")``, ``kwargs.pop("x")``, ``"x" in kwargs``):
  used (a ``pop`` also removes it from what is passed on);
- anything else done with the mapping (stored, iterated, passed to another function): not followed, and no
  verdict is given: a guess would be a false alarm.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BOUND, READ, SWALLOWED, REJECTED, UNKNOWN = "bound", "read", "swallowed", "rejected", "unknown"
_READERS = frozenset({"get", "pop", "setdefault"})
MAX_DEPTH = 16
"""Bases followed at most (a cycle of ``A.__init__`` calling ``B.__init__`` calling ``A.__init__`` ends here)."""


@dataclass(frozen=True)
class Fate:
    """What happens to one kwarg given to a class."""

    name: str
    """The kwarg."""
    verdict: str
    """``bound`` (a parameter takes it), ``read`` (the body reads it by name), ``swallowed`` (taken by
    ``**kwargs`` and never used), ``rejected`` (passed on to a base that raises on it), ``unknown``."""
    where: str
    """``Class (file:line)`` of the class whose parameter, body or base decided."""
    path: str = ""
    """How it got there: ``Child (file:line) → super().__init__(**kwargs) at line N → Base (file:line)``."""


def source_label(cls: type) -> str:
    """``Class (file:line)``; the caller may pass its own (introspection shows paths relative to the project)."""
    try:
        return f"{cls.__name__} ({inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]})"
    except (OSError, TypeError):
        return f"{cls.__name__} (<unknown source>)"


def _owner(mro: tuple[type, ...], start: int) -> int | None:
    """Index in ``mro`` of the first class from ``start`` on that defines ``__init__``."""
    for index in range(start, len(mro)):
        if "__init__" in vars(mro[index]):
            return index
    return None


def _function_ast(function: Any) -> tuple[ast.FunctionDef, int] | None:
    """The ``def`` of ``function`` and its first line in its file, or None without readable source."""
    try:
        lines, first = inspect.getsourcelines(function)
    except (OSError, TypeError):
        return None
    try:
        module = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return None
    node = module.body[0] if module.body else None
    return (node, first) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _dotted(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute) and (head := _dotted(node.value)) is not None:
        return [*head, node.attr]
    return None


@dataclass
class _Body:
    reads: set[str]
    pops: set[str]
    forwards: list[tuple[ast.Call, int]]
    """Calls that pass ``**kwargs`` on, with their line in the file."""
    opaque: list[int]
    """Lines that use the mapping some other way."""


def _scan(node: ast.FunctionDef, kwarg: str, first_line: int) -> _Body:
    body = _Body(set(), set(), [], [])
    seen: set[int] = set()  # ids of Name nodes accounted for

    def is_kw(expr: ast.AST) -> bool:
        return isinstance(expr, ast.Name) and expr.id == kwarg

    for item in ast.walk(node):
        if isinstance(item, ast.Subscript) and is_kw(item.value) and isinstance(item.slice, ast.Constant) \
                and isinstance(item.slice.value, str):
            body.reads.add(item.slice.value)
            seen.add(id(item.value))
        elif isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute) and is_kw(item.func.value) \
                and item.func.attr in _READERS and item.args and isinstance(item.args[0], ast.Constant) \
                and isinstance(item.args[0].value, str):
            body.reads.add(item.args[0].value)
            if item.func.attr == "pop":
                body.pops.add(item.args[0].value)
            seen.add(id(item.func.value))
        elif isinstance(item, ast.Compare) and len(item.ops) == 1 and isinstance(item.ops[0], (ast.In, ast.NotIn)) \
                and is_kw(item.comparators[0]) and isinstance(item.left, ast.Constant) and isinstance(item.left.value, str):
            body.reads.add(item.left.value)
            seen.add(id(item.comparators[0]))
        elif isinstance(item, ast.Call) and any(k.arg is None and is_kw(k.value) for k in item.keywords):
            body.forwards.append((item, first_line + item.lineno - 1))
            seen.update(id(k.value) for k in item.keywords if k.arg is None and is_kw(k.value))
    for item in ast.walk(node):
        if is_kw(item) and id(item) not in seen and isinstance(item, ast.Name) and isinstance(item.ctx, ast.Load):
            body.opaque.append(first_line + item.lineno - 1)
    return body


def _callee(call: ast.Call, mro: tuple[type, ...], owner_index: int, function: Any) -> tuple[tuple[type, ...], int] | None:
    """(mro, index of the class whose ``__init__`` the call runs) for a base-class ``__init__`` call, else None."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "__init__"):
        return None
    target = func.value
    if isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super":
        start = owner_index + 1
        if len(target.args) == 2 and (path := _dotted(target.args[0])) is not None:
            named = _lookup(path, function)
            if isinstance(named, type) and named in mro:
                start = mro.index(named) + 1
        found = _owner(mro, start)
        return (mro, found) if found is not None else None
    path = _dotted(target)
    base = _lookup(path, function) if path is not None else None
    if isinstance(base, type):
        base_mro = base.__mro__
        found = _owner(base_mro, 0)
        return (base_mro, found) if found is not None else None
    return None


def _lookup(path: list[str], function: Any) -> Any:
    """The object a dotted name in ``function``'s module means (attribute access only, nothing called)."""
    namespace = getattr(function, "__globals__", {})
    import builtins

    obj = namespace.get(path[0], getattr(builtins, path[0], None))
    for part in path[1:]:
        obj = getattr(obj, part, None)
    return obj


def follow(cls: type, names: list[str], label: Callable[[type], str] = source_label) -> list[Fate]:
    """The fate of each of ``names`` given to ``cls(...)``; ``label`` names a class in the verdicts."""
    start = _owner(cls.__mro__, 0)
    if start is None:
        return [Fate(name, UNKNOWN, label(cls)) for name in names]
    return _follow(cls.__mro__, start, names, "", 0, label)


def _follow(mro: tuple[type, ...], index: int, names: list[str], path: str, depth: int,
            describe: Callable[[type], str]) -> list[Fate]:
    owner = mro[index]
    if owner is object:  # object.__init__ raises on any argument once a subclass defines __init__
        return [Fate(name, REJECTED, "object.__init__", path) for name in names]
    function = vars(owner)["__init__"]
    label = describe(owner)
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return [Fate(name, UNKNOWN, label, path) for name in names]
    named = {n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                      inspect.Parameter.KEYWORD_ONLY)}
    var_kw = next((n for n, p in params.items() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    out = [Fate(name, BOUND, label, path) for name in names if name in named]
    rest = [name for name in names if name not in named]
    if not rest:
        return out
    if var_kw is None:
        return out + [Fate(name, REJECTED, label, path) for name in rest]
    if depth >= MAX_DEPTH or not inspect.isfunction(function):
        return out + [Fate(name, UNKNOWN, label, path) for name in rest]
    parsed = _function_ast(function)
    if parsed is None:
        return out + [Fate(name, UNKNOWN, label, path) for name in rest]
    body = _scan(parsed[0], var_kw, parsed[1])
    if body.opaque:  # stored, iterated, handed to something else: where it ends is not in this source
        return out + [Fate(name, UNKNOWN, label, path) for name in rest]
    forwarded = [name for name in rest if name not in body.pops]
    decided: dict[str, Fate] = {}
    for call, line in body.forwards:
        callee = _callee(call, mro, index, function)
        if callee is None:  # passed to something other than a base's __init__: not followed
            for name in forwarded:
                decided.setdefault(name, Fate(name, UNKNOWN, label, path))
            continue
        explicit = {k.arg for k in call.keywords if k.arg is not None}
        shown = ast.unparse(call.func) + f"(**{var_kw})"
        step = f"{path}{label} → {shown} at line {line} → "
        for fate in _follow(callee[0], callee[1], [n for n in forwarded if n not in explicit], step, depth + 1,
                              describe):
            if fate.verdict == REJECTED or fate.name not in decided or decided[fate.name].verdict in (SWALLOWED, UNKNOWN):
                decided[fate.name] = fate
    for name in rest:
        fate = decided.get(name)
        if fate is not None and fate.verdict == REJECTED:  # raised whether or not the body read it first
            out.append(fate)
        elif name in body.reads:
            out.append(Fate(name, READ, label, path))
        elif fate is not None:
            out.append(fate)
        else:
            out.append(Fate(name, SWALLOWED, label, path))
    return out

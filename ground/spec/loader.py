"""Load a spec: resolve ``extends:`` bases, deep-merge, validate strictly, hash canonically.

Every problem becomes a :class:`~ground.errors.UserError` naming the file and the dotted field.
"""

from __future__ import annotations

import difflib
import unicodedata
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ground.errors import UserError
from ground.paths import exists, experiments_dir
from ground.spec.schema import ExperimentSpec
from ground.spec.sweep import expand
from ground.spec.resolved import (HASH_NEUTRAL_DEFAULTS, HASH_NEUTRAL_SECTIONS, ResolvedSpec,  # noqa: F401
                                  canonical_json, canonical_spec)  # (re-exported: where the spec's callers import them)

BASE_PREFIX = "base_"
"""Files named ``base_*.yaml`` are bases: they are extended, never run on their own."""
BASELINES_FILE = "baselines.yaml"


def resolve_spec_path(name_or_path: str, relative_to: Path | None = None) -> Path:
    """An experiment name (``latent_c_n4``) or a path to a YAML file → the file's path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and exists(candidate):
        return candidate.resolve()
    search = [d for d in (relative_to, experiments_dir()) if d is not None]
    for directory in search:
        for suffix in (".yaml", ".yml"):
            path = directory / f"{name_or_path}{suffix}"
            if exists(path):
                return path.resolve()
    known = [p.stem for p in _spec_files()]
    close = difflib.get_close_matches(name_or_path, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"see `idmctl exp list`; looked in {experiments_dir()}"
    # An empty name would leave the line naming nothing: then it names the argument.
    raise UserError(f"no experiment named {name_or_path!r}", file=name_or_path or "EXP", hint=hint)


def _spec_files() -> list[Path]:
    directory = experiments_dir()
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.yaml") if p.name != BASELINES_FILE)


def list_experiments(include_bases: bool = False) -> list[Path]:
    return [p for p in _spec_files() if include_bases or not p.stem.startswith(BASE_PREFIX)]


MAX_SPEC_BYTES = 256 * 1024
"""A spec is a few KB (the largest shipped one is ~3 KB); a bigger file is refused before parsing
(a 1 MB spec with one unknown key took 15.8 s to reject)."""
MAX_YAML_VALUES = 100_000
"""Values a spec may expand to, aliases counted at every use: a 1 KB alias bomb reached 3.9 GB."""
MAX_YAML_DEPTH = 64


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe loading with libyaml's parser when present (a spec is parsed on every command)."""


def _where(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}"


def check_yaml_tree(root: yaml.Node, file: str) -> None:
    """Before anything is built from it: no key twice in one mapping (the last one silently won), no
    deeper than MAX_YAML_DEPTH, and no more than MAX_YAML_VALUES values once aliases are expanded.
    Iterative, and each node is visited once, so the check itself cannot be made to explode."""
    expanded: dict[int, int] = {}
    stack: list[tuple[yaml.Node, str, int, bool]] = [(root, "", 1, False)]
    while stack:
        node, dotted, depth, children_done = stack.pop()
        if depth > MAX_YAML_DEPTH:
            raise UserError(f"nested more than {MAX_YAML_DEPTH} levels deep", file=file, field=dotted or _where(node),
                            hint="a spec is a few levels of sections and values")
        children: list[tuple[yaml.Node, str]] = []
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, yaml.Node] = {}
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else _where(key_node)
                if key in first_line:
                    raise UserError(f"duplicate key {key!r} at {_where(key_node)} (first at {_where(first_line[key])})",
                                    file=file, field=f"{dotted}.{key}" if dotted else key,
                                    hint="keep one of them; YAML would silently keep the last")
                first_line[key] = key_node
                children.append((value_node, f"{dotted}.{key}" if dotted else str(key)))
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, f"{dotted}[{i}]") for i, item in enumerate(node.value)]
        if id(node) in expanded:
            continue
        if not children_done and children:
            stack.append((node, dotted, depth, True))
            stack.extend((child, path, depth + 1, False) for child, path in children if id(child) not in expanded)
            continue
        expanded[id(node)] = 1 + sum(expanded.get(id(child), 0) for child, _ in children)
        if expanded[id(node)] > MAX_YAML_VALUES:
            raise UserError(f"expands to more than {MAX_YAML_VALUES:,} values (aliases counted at each use)",
                            file=file, field=dotted or _where(node), hint="a spec needs no YAML alias bomb; write values out")


def load_yaml_file(path: Path, what: str = "spec") -> Any:
    """Any YAML file the user hands idmctl (specs, cluster profiles): bounded in size, depth and alias
    expansion, UTF-8, no duplicate keys; every problem a UserError naming the file."""
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise UserError(f"{path.stat().st_size:,} bytes is more than a {what} can be ({MAX_SPEC_BYTES:,})",
                            file=str(path), hint=f"is this the right file? a {what} is a few KB")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})", file=str(path),
                        hint=f"save the {what} as UTF-8") from exc
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}", file=str(path), hint="check the path") from exc
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            check_yaml_tree(node, str(path))
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"invalid YAML: {problem}", file=str(path), field=where or None,
                        hint="fix the YAML syntax") from exc
    except RecursionError as exc:  # the parser itself recurses: a 100k-deep list never reaches the check
        raise UserError(f"nested more than {MAX_YAML_DEPTH} levels deep", file=str(path),
                        hint="a spec is a few levels of sections and values") from exc
    finally:
        loader.dispose()
    return data


def _read_yaml(path: Path) -> dict[str, Any]:
    data = load_yaml_file(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError("a spec must be a mapping of sections", file=str(path), hint="start with `data:`, `model:`, ...")
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; everything else (lists included) is replaced by the override."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


MAX_EXTENDS = 32
"""Files one ``extends`` chain may pass through: the shipped specs use two; a chain of 1,100 files was
reported as YAML "nested more than 64 levels" (Python's recursion limit), which named nothing useful."""


def _load_merged(path: Path, seen: tuple[Path, ...]) -> tuple[dict[str, Any], list[Path]]:
    if len(seen) >= MAX_EXTENDS and path not in seen:
        shown = " -> ".join(p.stem for p in (*seen[:3], path))
        raise UserError(f"extends chain longer than {MAX_EXTENDS} files ({shown} ...)", file=str(seen[0]),
                        field="extends", hint="merge the bases: a spec extends one or two")
    if path in seen:
        cycle = " -> ".join(p.stem for p in (*seen, path))
        raise UserError(f"extends cycle: {cycle}", file=str(seen[-1]), field="extends",
                        hint="remove one of the extends links")
    raw = _read_yaml(path)
    if SWEEP_KEY in raw and raw[SWEEP_KEY] in (None, {}, []):  # `sweep:` with nothing under it was silently ignored
        raise UserError("is empty", file=str(path), field=SWEEP_KEY,
                        hint="give grid: or zip: with at least one axis, or remove sweep:")
    parents = raw.pop("extends", None)
    if parents is None:
        return raw, [path]
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise UserError("extends must be a spec name or a list of names", file=str(path), field="extends",
                        hint="e.g. extends: base_latent_c")
    merged: dict[str, Any] = {}
    chain: list[Path] = []
    for parent in parents:
        try:
            parent_path = resolve_spec_path(parent, relative_to=path.parent)
        except UserError as exc:
            raise UserError(f"base {parent!r} not found", file=str(path), field="extends", hint=exc.hint) from exc
        parent_data, parent_chain = _load_merged(parent_path, (*seen, path))
        merged = deep_merge(merged, parent_data)
        chain += [p for p in parent_chain if p not in chain]
    return deep_merge(merged, raw), [*chain, path]


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for did-you-mean on unknown keys)."""
    model: type[BaseModel] = ExperimentSpec
    for part in loc[:-1]:
        info = model.model_fields.get(str(part))
        annotation = getattr(info, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _escaped(text: str) -> str:
    """A key as ASCII: a look-alike letter (Cyrillic 'а' for 'a') or an invisible one shows as ``\\u0430``."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def _skeleton(text: str) -> str:
    """What a key looks like in ASCII: compatibility forms decomposed (``ｌｒ`` → ``lr``), a letter of another
    script taken by its name (``CYRILLIC SMALL LETTER A`` → ``a``), invisible characters dropped."""
    out = []
    for char in unicodedata.normalize("NFKD", text):
        if char.isascii():
            out.append(char)
            continue
        name = unicodedata.name(char, "")
        if " LETTER " in name and len(name.rsplit(" ", 1)[-1]) == 1:
            out.append(name.rsplit(" ", 1)[-1].lower())
    return "".join(out)


def _first_error(exc: ValidationError) -> dict[str, Any]:
    """The error to report: an unknown key before anything else. A misspelt key (``lr`` with a Cyrillic
    letter) also leaves the real key missing, and "missing" never named the key that was there."""
    errors = exc.errors()
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


def _error_from_validation(exc: ValidationError, file: Path) -> UserError:
    first = _first_error(exc)
    loc = tuple(first["loc"])
    dotted = ".".join(str(p) for p in loc)
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        model = _model_at(loc)
        options = list(model.model_fields) if model else []
        key = str(loc[-1])
        close = difflib.get_close_matches(key, options, n=1) or difflib.get_close_matches(_skeleton(key), options, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(options)}"
        odd = key != _escaped(key)
        return UserError(f"unknown key{' (it has non-ASCII characters)' if odd else ''}", file=str(file),
                         field=".".join([*(str(p) for p in loc[:-1]), _escaped(key)]), hint=hint)
    if first["type"] == "missing":
        return UserError("required field is missing", file=str(file), field=dotted, hint="add it here or in a base spec")
    if first["type"] == "value_error":
        # Cross-field validators name their own field as "field: message".
        text = message.removeprefix("Value error, ")
        head, sep, rest = text.partition(": ")
        if sep and " " not in head:
            dotted = ".".join([*(str(p) for p in loc if str(p) != head), head]) if loc else head
            text = rest
        return UserError(text, file=str(file), field=dotted or None, hint="fix the value")
    value = first.get("input")
    if first["type"] == "string_pattern_mismatch":
        # The Slurm-name and node-list patterns (schema.SLURM_NAME, NODE_LIST): say what is allowed.
        dotted = ".".join(str(p) for p in loc if not isinstance(p, int))
        return UserError(f"{_short_repr(value)} is not a safe Slurm name", file=str(file), field=dotted,
                         hint="use letters, digits, '.', '_', '+', '-' (node lists also '[', ']', ','); "
                              "no spaces, newlines, ';', '$(' or backticks")
    shown = _short_repr(value) if not isinstance(value, dict) else "a mapping"
    return UserError(f"{message}, got {shown}", file=str(file), field=dotted or None, hint="fix the value")


def _short_repr(value: Any, limit: int = 60) -> str:
    """repr() of at most ``limit`` characters: an expanded alias bomb must not become the message."""
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"a list of {len(value)} items"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _file_defining(chain: list[Path], loc: tuple[Any, ...]) -> Path:
    """The last file of the extends chain that sets the field at ``loc``: where the fix goes."""
    for path in reversed(chain):
        node: Any = _read_yaml(path)
        for part in loc:
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return path
    return chain[-1]


SWEEP_KEY = "sweep"
"""A top-level ``sweep:`` section makes a spec file a family of named variants (``ground.spec.sweep``)."""


def _resolve_with_variant(name_or_path: str) -> tuple[Path, str | None]:
    """``latent_c_phase2.n4_d4`` → (the sweep's file, ``n4_d4``) when no file has the dotted name."""
    try:
        return resolve_spec_path(name_or_path), None
    except UserError:
        stem, dot, variant = name_or_path.rpartition(".")
        if not dot or not stem or Path(name_or_path).suffix in (".yaml", ".yml"):
            raise
        try:
            return resolve_spec_path(stem), variant
        except UserError:
            pass
        raise


def _load(name_or_path: str) -> tuple[ResolvedSpec, Any, str | None]:
    path, variant = _resolve_with_variant(name_or_path)
    merged, chain = _load_merged(path, ())
    sweep = merged.pop(SWEEP_KEY, None)
    try:
        spec = ExperimentSpec.model_validate(merged)
    except ValidationError as exc:
        # A bad value inherited from a base is reported in the base, where it must be fixed.
        loc = tuple(str(p) for p in _first_error(exc)["loc"])
        raise _error_from_validation(exc, _file_defining(chain, loc) if loc else path) from exc
    return ResolvedSpec(name=path.stem, path=path, spec=spec, chain=chain), sweep, variant


def load_spec(name_or_path: str) -> ResolvedSpec:
    """Resolve, merge and validate one experiment (or one variant ``<sweep>.<variant>``); UserError on any problem."""
    resolved, sweep, variant = _load(name_or_path)
    if sweep is None:
        if variant is not None:
            raise UserError(f"no experiment named {name_or_path!r}", file=name_or_path,
                            hint=f"{resolved.name} is not a sweep; see `idmctl exp list`")
        return resolved
    variants = expand(resolved, sweep)
    names = [v.name for v in variants]
    if variant is None:
        raise UserError(f"is a sweep of {len(variants)} variants", file=str(resolved.path), field=SWEEP_KEY,
                        hint=f"name one ({', '.join(names)}); exp list, preflight and submit take the whole sweep")
    for candidate in variants:
        if candidate.name == f"{resolved.name}.{variant}":
            return candidate
    close = difflib.get_close_matches(f"{resolved.name}.{variant}", names, n=1)
    raise UserError(f"no variant {variant!r} in sweep {resolved.name}", file=str(resolved.path), field=SWEEP_KEY,
                    hint=f"did you mean {close[0]!r}?" if close else f"variants: {', '.join(names)}")


def load_experiments(name_or_path: str) -> list[ResolvedSpec]:
    """One experiment, one named variant, or every variant of a sweep, in the sweep's order."""
    resolved, sweep, variant = _load(name_or_path)
    if sweep is None or variant is not None:
        return [load_spec(name_or_path)]
    return expand(resolved, sweep)


def names_a_sweep(reference: str, variants: list[ResolvedSpec]) -> bool:
    """Whether ``reference`` (as given on the command line, expanded by :func:`load_experiments` into
    ``variants``) names a whole sweep rather than one job: the sweep by name or by file, or whatever expands
    to several variants. One predicate for preflight and submit, so both take the same reference the same way."""
    sweep = variants[0].sweep
    return sweep is not None and (len(variants) > 1 or reference == sweep or reference.endswith((".yaml", ".yml")))

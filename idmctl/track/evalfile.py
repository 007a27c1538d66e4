"""The team's own evaluation files: per-episode results written by an evaluator idmctl did not run.

``idmctl eval import FILE --name NAME --protocol PROTOCOL`` reads a CSV or JSON of one row per episode
(an ``episode`` column, an optional ``seed``, the metric columns; every other column is kept as it was,
in the copy of the file stored beside the record) and records it under ``$IDMCTL_HOME/evals/``. From
then on ``decide NAME`` and ``decide RUN --against NAME`` judge it like any run evaluated under that
protocol, and ``experiments/baselines.yaml`` may point at such a file (``episodes_file:``).

What an episode is comes from the file: a ``(seed, episode)`` pair is its own scene, unless the import
says the seeds repeat the same scenes (``--seeds-share-episodes``: then the seeds are repeats of one
policy on one episode list, and decide resamples both).

Every row is judged before anything is recorded: a missing or duplicate episode, an empty, non-numeric
or non-finite value, a negative error, time or count, more than :data:`MAX_ROWS` rows — one line naming
the file, the row and the column, exit 2, nothing written. Rows are read one at a time into typed
arrays: a million episodes take ~30 MB, not the file's size in Python objects.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import shutil
from array import array
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from ground.errors import UserError
from ground.paths import atomic_write_text, home

MAX_ROWS = 5_000_000
"""More rows than any evaluation the team runs (×1000 of card A's 24 episodes ×200): past it, a wrong file."""
MAX_JSON_BYTES = 256 * 2**20
"""A JSON file is parsed whole: past this, write a CSV (read row by row)."""
EPISODE_COLUMNS = ("episode", "episode_id", "episode_index", "ep")
SEED_COLUMNS = ("seed",)
NONNEGATIVE = re.compile(r"(error|err_|_err|mm|dist|time|second|step|length|count|success|rate|frac)", re.I)
"""Metric names whose values cannot be negative (errors, distances, times, counts, rates)."""
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PROTOCOL = re.compile(r"^\S{1,200}$")
_TRUE, _FALSE = {"true", "yes"}, {"false", "no"}


@dataclass
class EvalFile:
    """One imported evaluation: per-episode values of each metric, in file order."""

    name: str
    protocol: str
    source: str
    """The file imported (absolute path as given)."""
    sha256: str
    """Of the file's bytes: the same file imported twice is the same evaluation."""
    episodes: list[str]
    """Episode ids in row order (one per row)."""
    seeds: list[str]
    """Seed per row ('' when the file has no seed column)."""
    metrics: dict[str, list[float]]
    """Metric column → one value per row."""
    seeds_share_episodes: bool = False
    """The seeds repeat the same scenes (then each seed must cover the same episodes)."""
    where: dict[str, str] = field(default_factory=dict)
    """Rows kept: only those whose columns have these values (a file holding several policies)."""
    columns: list[str] = field(default_factory=list)
    """Every column of the file, kept ones included."""
    imported_at: str = ""

    @property
    def rows(self) -> int:
        return len(self.episodes)

    def keys(self) -> list[str]:
        """What identifies one scene: the episode (seeds sharing scenes, or no seeds) or seed/episode."""
        if self.seeds_share_episodes or len(set(self.seeds)) <= 1:
            return list(self.episodes)
        return [f"{s}/{e}" for s, e in zip(self.seeds, self.episodes)]

    def matrix(self, metric: str) -> tuple[list[str], list[list[float]]]:
        """(episode keys, seeds × episodes values): one row per seed when seeds share scenes, else one row."""
        values = self.metrics[metric]
        if not self.seeds_share_episodes:
            return self.keys(), [list(values)]
        order = list(dict.fromkeys(self.episodes))
        by_seed: dict[str, dict[str, float]] = {}
        for seed, episode, value in zip(self.seeds, self.episodes, values):
            by_seed.setdefault(seed, {})[episode] = value
        return order, [[row[e] for e in order] for row in by_seed.values()]

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies a million-row record's lists once more.
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ------------------------------------------------------------------------------------------- reading

def _number(text: str, where: str, metric: str, path: Path) -> float:
    raw = text.strip()
    lowered = raw.lower()
    if lowered in _TRUE:
        return 1.0
    if lowered in _FALSE:
        return 0.0
    if not raw:
        raise UserError("empty value", file=str(path), field=f"{where}, column {metric}",
                        hint="every episode needs a value; drop the row or re-run its evaluation")
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"not a number: {raw[:40]!r}", file=str(path), field=f"{where}, column {metric}",
                        hint="a metric column holds numbers (or true/false); name the metrics with --metric") from None
    if not math.isfinite(value):
        raise UserError(f"not finite: {raw[:40]!r}", file=str(path), field=f"{where}, column {metric}",
                        hint="a NaN or inf episode is a failed evaluation: fix or re-run it, do not average it")
    if value < 0 and NONNEGATIVE.search(metric):
        raise UserError(f"negative {metric}: {raw[:40]}", file=str(path), field=f"{where}, column {metric}",
                        hint="an error, distance, time, count or rate cannot be negative: a sign or column mix-up")
    return value


def _rows(path: Path, said: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) per data row: ``row 7`` (the CSV's line number counting the header as 1) or ``episodes[6]``.
    ``said`` receives what a JSON document says about its rows (``seeds_share_episodes``)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        if path.stat().st_size > MAX_JSON_BYTES:
            raise UserError(f"{path.stat().st_size / 2**20:.0f} MiB of JSON", file=str(path),
                            hint=f"past {MAX_JSON_BYTES // 2**20} MiB write the rows as CSV (read row by row)")
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"not JSON: {str(exc)[:80]}", file=str(path), hint="a damaged or incomplete file: write it again") from None
        rows, label = (document, "") if isinstance(document, list) else (document.get("episodes") if isinstance(document, dict) else None, "episodes")
        if isinstance(document, dict) and document.get("seeds_share_episodes") is True:
            said["seeds_share_episodes"] = True  # the file says its seeds repeat the same scenes
        if not isinstance(rows, list):
            raise UserError("no rows", file=str(path), field="episodes",
                            hint='a list of {"episode": …, "<metric>": …} objects, or {"episodes": [that list]}')
        for index, row in enumerate(rows):
            where = f"{label}[{index}]" if label else f"[{index}]"
            if not isinstance(row, dict):
                raise UserError("not an object", file=str(path), field=where, hint='each episode is {"episode": …, "<metric>": …}')
            yield where, {str(k): v for k, v in row.items()}
        return
    if suffix not in (".csv", ".tsv"):
        raise UserError(f"unknown format {suffix or '(no suffix)'}", file=str(path), hint="a .csv, .tsv or .json file")
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}", file=str(path), hint="check the path") from None
    with handle:
        reader = csv.reader((line for line in handle if not line.startswith("#")),
                            delimiter="\t" if suffix == ".tsv" else ",")
        try:
            header = next(reader, None)
            if header is None:
                raise UserError("empty file", file=str(path), hint="a header row, then one row per episode")
            header = [h.strip() for h in header]
            for number, values in enumerate(reader, start=2):
                if not values:
                    continue
                if len(values) != len(header):
                    raise UserError(f"{len(values)} fields, the header has {len(header)}", file=str(path),
                                    field=f"row {number}", hint="a damaged or cut-off file: write it again")
                yield f"row {number}", dict(zip(header, values))
        except csv.Error as exc:
            raise UserError(f"damaged CSV: {exc}", file=str(path), field=f"row {reader.line_num}", hint="write it again") from None
        except UnicodeDecodeError:
            raise UserError("not UTF-8 text", file=str(path), hint="a binary or damaged file") from None


def _pick(columns: list[str], names: tuple[str, ...], given: str | None, path: Path, what: str) -> str | None:
    if given is not None:
        if given not in columns:
            raise UserError(f"no column {given!r}", file=str(path), field=what, hint=f"columns: {', '.join(columns)[:300]}")
        return given
    lowered = {c.lower(): c for c in columns}
    return next((lowered[n] for n in names if n in lowered), None)


def read_eval_file(path: Path, *, name: str, protocol: str, metrics: list[str] | None = None,
                   where: dict[str, str] | None = None, episode_column: str | None = None,
                   seeds_share_episodes: bool = False) -> EvalFile:
    """The file's rows, judged: see the module docstring for what is refused."""
    path = Path(path)
    if not path.is_file():
        raise UserError("no such file", file=str(path), hint="the evaluator's per-episode CSV or JSON")
    where = where or {}
    columns: list[str] = []
    episode_key = seed_key = None
    wanted: list[str] = []
    episodes: list[str] = []
    seeds: list[str] = []
    values: dict[str, array] = {}
    seen: dict[str, str] = {}
    """(seed, episode) key → where it was first: the row's label, interned per row (one str, not a tuple)."""
    said: dict[str, Any] = {}
    for place, row in _rows(path, said):
        if not columns:
            columns = list(row)
            episode_key = _pick(columns, EPISODE_COLUMNS, episode_column, path, "--episode-column")
            if episode_key is None:
                raise UserError("no episode column", file=str(path), field=place,
                                hint=f"name one {'/'.join(EPISODE_COLUMNS)} or give --episode-column")
            seed_key = _pick(columns, SEED_COLUMNS, None, path, "seed")
            for column in where:
                if column not in columns:
                    raise UserError(f"no column {column!r}", file=str(path), field="--where", hint=f"columns: {', '.join(columns)[:300]}")
            if metrics:
                for metric in metrics:
                    if metric not in columns:
                        raise UserError(f"no metric column {metric!r}", file=str(path), field="--metric",
                                        hint=f"columns: {', '.join(columns)[:300]}")
                wanted = list(metrics)
        if any(str(row.get(k, "")) != v for k, v in where.items()):
            continue
        if not wanted:  # metrics not named: the numeric columns of the first row kept
            skip = {episode_key, seed_key, *where}
            wanted = [c for c in columns if c not in skip and _looks_numeric(row.get(c))]
            if not wanted:
                raise UserError("no numeric metric column", file=str(path), field=place, hint="name the metrics with --metric")
        if len(episodes) >= MAX_ROWS:
            raise UserError(f"more than {MAX_ROWS:,} rows", file=str(path), field=place,
                            hint="one row per episode; split the file or filter it with --where")
        episode = row.get(episode_key)
        if episode is None or str(episode).strip() == "":
            raise UserError("no episode id", file=str(path), field=f"{place}, column {episode_key}", hint="every row names its episode")
        episode = str(episode).strip()
        seed = str(row.get(seed_key, "")).strip() if seed_key else ""
        key = f"{seed}\x1f{episode}" if seed else episode
        if key in seen:
            raise UserError(f"duplicate episode {episode!r}" + (f" of seed {seed}" if seed else ""), file=str(path),
                            field=f"{place}, column {episode_key}", hint=f"first at {seen[key]}; each episode once per seed")
        seen[key] = place
        for metric in wanted:
            raw = row.get(metric)
            number = _number("" if raw is None else str(raw) if not isinstance(raw, bool) else str(raw).lower(), place, metric, path)
            values.setdefault(metric, array("d")).append(number)
        episodes.append(episode)
        seeds.append(seed)
    if not episodes:
        raise UserError("no episode rows" + (f" with {where}" if where else ""), file=str(path), hint="one row per episode after the header")
    seeds_share_episodes = seeds_share_episodes or bool(said.get("seeds_share_episodes"))
    _check_complete(path, episodes, seeds, seeds_share_episodes, episode_key or "episode")
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return EvalFile(name=name, protocol=protocol, source=str(path.resolve()), sha256=digest.hexdigest(),
                    episodes=episodes, seeds=seeds, metrics={m: v.tolist() for m, v in values.items()},
                    seeds_share_episodes=seeds_share_episodes, where=dict(where), columns=columns)


def _looks_numeric(value: Any) -> bool:
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return True
    text = str(value).strip().lower()
    if text in _TRUE | _FALSE:
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_complete(path: Path, episodes: list[str], seeds: list[str], shared: bool, column: str) -> None:
    """No episode missing: integer ids run without a gap per seed; seeds sharing scenes cover the same ones."""
    by_seed: dict[str, set[str]] = {}
    for seed, episode in zip(seeds, episodes):
        by_seed.setdefault(seed, set()).add(episode)
    for seed, ids in by_seed.items():
        if all(e.lstrip("-").isdigit() for e in ids):
            numbers = sorted(int(e) for e in ids)
            if numbers[-1] - numbers[0] + 1 != len(numbers):
                gap = next(n for n in range(numbers[0], numbers[-1]) if n not in set(numbers))
                raise UserError(f"episode {gap} missing" + (f" for seed {seed}" if seed else "")
                                + f" ({len(numbers)} rows span {numbers[0]}..{numbers[-1]})", file=str(path),
                                field=f"column {column}", hint="a cut-off or partial evaluation: import it when complete")
    if shared and len(by_seed) > 1:
        union = set().union(*by_seed.values())
        for seed, ids in by_seed.items():
            if ids != union:
                missing = sorted(union - ids)[0]
                raise UserError(f"seed {seed} lacks episode {missing!r} that other seeds have", file=str(path),
                                field=f"column {column}", hint="seeds sharing episodes must each cover the same ones")


# ----------------------------------------------------------------------------------------- the store

def evals_dir() -> Path:
    return home() / "evals"


def _record_path(name: str) -> Path:
    return evals_dir() / f"{name}.json"


def check_name(name: str, protocol: str) -> None:
    if not NAME.fullmatch(name):
        raise UserError(f"not a name: {name[:60]!r}", field="--name", hint="letters, digits, _ . - (up to 64), e.g. latent_a_ms_24ep")
    if not PROTOCOL.fullmatch(protocol):
        raise UserError(f"not a protocol name: {protocol[:60]!r}", field="--protocol",
                        hint="one word without spaces, e.g. card-A/MG-30-held-out:24ep")


def load_eval(name: str) -> EvalFile | None:
    """The imported evaluation ``name``; None when there is none. A damaged record is bad input."""
    path = _record_path(name) if NAME.fullmatch(name) else None
    if path is None or not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return EvalFile(**data)
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as exc:
        raise UserError(f"damaged record: {str(exc)[:80]}", file=str(path), hint=f"import it again: idmctl eval import FILE --name {name} --replace") from None


def list_evals() -> list[str]:
    directory = evals_dir()
    return sorted(p.stem for p in directory.glob("*.json")) if directory.is_dir() else []


def _protocol_episodes(protocol: str) -> int | None:
    match = re.search(r":(\d+)ep$", protocol)
    return int(match.group(1)) if match else None


def check_protocol(record: EvalFile, known: dict[str, tuple[str, set[str] | None]]) -> None:
    """A protocol names one episode set: a clash with another evaluation's, or with the count the name
    states (``…:24ep``), is refused. ``known``: protocol → (who uses it, its episode keys or None)."""
    keys = set(record.keys())
    stated = _protocol_episodes(record.protocol)
    count = len(set(record.episodes))
    if stated is not None and stated != count:
        raise UserError(f"protocol {record.protocol} says {stated} episodes, the file has {count}", file=record.source,
                        field="--protocol", hint="name the protocol after what was evaluated, or import the matching file")
    if record.protocol in known:
        owner, theirs = known[record.protocol]
        if theirs is not None and theirs != keys:
            raise UserError(f"protocol {record.protocol} is {owner}'s, on other episodes "
                            f"({len(theirs)} vs {len(keys)}, {len(theirs ^ keys)} differ)", file=record.source,
                            field="--protocol", hint="one protocol, one episode set: give this evaluation its own name")


def import_eval(path: Path, *, name: str, protocol: str, metrics: list[str] | None = None,
                where: dict[str, str] | None = None, episode_column: str | None = None,
                seeds_share_episodes: bool = False, replace: bool = False) -> EvalFile:
    """Judge the file, then record it (the rows as JSON and the file's own bytes beside them)."""
    check_name(name, protocol)
    if not replace and _record_path(name).exists():
        raise UserError(f"{name} is already imported", field="--name", hint="another name, or --replace")
    record = read_eval_file(path, name=name, protocol=protocol, metrics=metrics, where=where,
                            episode_column=episode_column, seeds_share_episodes=seeds_share_episodes)
    known: dict[str, tuple[str, set[str] | None]] = {}
    for other in list_evals():
        if other == name:
            continue
        loaded = load_eval(other)
        if loaded is not None:
            known.setdefault(loaded.protocol, (other, set(loaded.keys())))
    check_protocol(record, known)
    record.imported_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    directory = evals_dir()
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / f"{name}.source{Path(path).suffix.lower()}"
    shutil.copyfile(path, copy)  # the columns idmctl does not read, kept as the evaluator wrote them
    atomic_write_text(_record_path(name), json.dumps(record.to_json()))
    return record

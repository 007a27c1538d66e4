"""Classify a job that did not complete: one documented cause, the evidence lines, and details.

The causes and their patterns live in ``taxonomy.yaml`` (data, not code paths). :func:`classify`
is a pure function of what Slurm and the job log say, so it is tested on real log texts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ground.contract import FAILURE_MARKER
from ground.errors import UserError
from ground.paths import REPO_ROOT
from ground.units import format_duration, parse_duration
from idmctl.core.job_state import JobState, first_word

TAXONOMY_PATH = Path(__file__).resolve().parent / "taxonomy.yaml"
MARKER = FAILURE_MARKER  # ground.contract: the line a job prints before failing on purpose
MAX_EVIDENCE_LINES = 4
MAX_LINE_CHARS = 240
ACTIONS = ("resume", "exclude_node_and_resume", "rollback", "stop")
"""What sync may do after a cause (``action:`` in taxonomy.yaml, whose header says what each means)."""
RETRY_ACTIONS = ("resume", "exclude_node_and_resume", "rollback")
ROOT, CASCADE = "root", "cascade"
"""A ``log`` rule's role: its lines name what went wrong first, or usually follow from another failure."""
_CONDITIONS = {"state", "started", "exit_code", "derived_exit_code", "reason", "restarts_at_least", "log"}


@dataclass(frozen=True)
class Cause:
    """One entry of the taxonomy."""

    name: str
    meaning: str
    fix: str
    caught_by: str
    """The preflight check that now stops this cause before submit ("none" when none can)."""
    action: str
    """One of :data:`ACTIONS`: what sync does after a job ends this way (the retry policy is this data)."""
    mlflow_status: str
    rules: tuple[dict[str, Any], ...]
    max_per_chain: int | None = None
    """At most this many resubmissions for this cause in one chain (None: only the chain's retries budget)."""
    exclude_node_for_s: float | None = None
    """``exclude_node_and_resume``: seconds the job's node is left out of later submissions."""
    scheduler_requeues: bool = False
    """Slurm requeues such a job itself (free); where the cluster's preemption cancels instead, sync
    resubmits in its place, also without spending the chain's retries."""
    from_chain: bool = False
    """Named from the chain's attempts (the crash loop), never matched on one job's record: it has no rules."""
    refines: str | None = None
    """The older, broader cause this one narrows (gpu_hardware refines node_fail); None for a cause of its own."""
    generic: bool = False
    """This cause's log lines lose to every other cause's (python_exception: most failures print a traceback)."""


@dataclass(frozen=True)
class Classification:
    cause: str
    evidence: list[str]
    """Slurm's record first, then the log lines that matched (trimmed)."""
    detail: dict[str, Any] = field(default_factory=dict)
    """python_exception/loader_config: type, message, frame (innermost project ``file:line``);
    queue_cancelled: waited_seconds; marker causes: the marker's key=value fields."""

    @property
    def headline(self) -> str:
        """The one line shown in tables."""
        if "exception_type" in self.detail:
            where = f" at {self.detail['frame']}" if self.detail.get("frame") else ""
            return f"{self.detail['exception_type']}: {self.detail['message']}{where}"
        if self.cause == "queue_cancelled" and self.detail.get("waited_seconds") is not None:
            return f"cancelled after waiting {format_duration(self.detail['waited_seconds'])} in the queue, never started"
        if len(self.evidence) > 1:
            return _PREFIX.sub("", self.evidence[1], count=1).strip()
        if self.cause == "preempted" and self.detail.get("ran_seconds") is not None:
            requeued = f", requeued {self.detail['restarts']}×" if self.detail.get("restarts") else ""
            return f"preempted after running {format_duration(self.detail['ran_seconds'])}{requeued}"
        return self.evidence[0] if self.evidence else ""


def load_taxonomy(path: Path = TAXONOMY_PATH) -> list[Cause]:
    """The causes in match order; a malformed file is a UserError naming the entry."""
    return list(_load_taxonomy(str(path)).causes)


@dataclass(frozen=True)
class _Taxonomy:
    """taxonomy.yaml, loaded and compiled once per process."""

    causes: tuple[Cause, ...]
    generic_states: frozenset[str]
    """Slurm states that say only that the job ended badly (FAILED, CANCELLED): log evidence wins over them."""
    noise: re.Pattern[str]
    """The ``cascade:`` and ``teardown:`` lines: what dying processes print, naming no cause."""
    rule_patterns: dict[tuple[str, int], re.Pattern[str]]
    """(cause, rule index) → the rule's ``log`` patterns as one regex."""
    any_rule: re.Pattern[str]
    """Every rule's patterns as one regex: most lines of a log match none, and one search rules them out."""


def _one_regex(patterns: list[str]) -> re.Pattern[str]:
    """``patterns`` as one alternation (a leading ``(?i)`` becomes a scoped ``(?i:...)``, as an alternation needs)."""
    parts = [f"(?i:{p[4:]})" if p.startswith("(?i)") else f"(?:{p})" for p in patterns]
    return re.compile("|".join(parts) or r"(?!)")


@lru_cache(maxsize=4)
def _load_taxonomy(path: str) -> _Taxonomy:
    # libyaml's loader when present: the pure-Python one takes ~15 ms of every `failures`/`sync` on this file.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (a safe loader)
    causes: list[Cause] = []
    patterns: dict[tuple[str, int], re.Pattern[str]] = {}
    for index, entry in enumerate(data.get("causes", [])):
        where = f"causes[{index}]"
        for number, rule in enumerate(entry.get("rules", [])):
            unknown = set(rule) - _CONDITIONS - {"role"}
            if unknown:
                raise UserError(f"unknown condition {sorted(unknown)[0]!r}", file=path, field=f"{where}.rules",
                                hint=f"allowed: {', '.join(sorted(_CONDITIONS))}, role")
            if rule.get("role", ROOT) not in (ROOT, CASCADE) or ("role" in rule and "log" not in rule):
                raise UserError(f"role {rule.get('role')!r} needs `log:` and one of root, cascade", file=path,
                                field=f"{where}.rules[{number}].role", hint="e.g. `role: cascade` beside `log: [...]`")
            for pattern in rule.get("log", []):
                _check_regex(pattern, path, f"{where}.rules.log")
            if "log" in rule:
                patterns[(entry["name"], number)] = _one_regex(rule["log"])
        causes.append(Cause(name=entry["name"], meaning=entry["meaning"], fix=entry["fix"],
                            caught_by=entry["caught_by"], action=entry.get("action"),
                            mlflow_status=entry["mlflow_status"], rules=tuple(entry.get("rules", [])),
                            refines=entry.get("refines"), generic=bool(entry.get("generic", False)),
                            **_policy(entry, path, where)))
    if not causes or causes[-1].rules:
        raise UserError("the last cause must be the rule-less fallback", file=path, field="causes",
                        hint="end the list with `name: unknown` and `rules: []`")
    names = [cause.name for cause in causes]
    for index, cause in enumerate(causes):
        if cause.refines is not None and (cause.refines not in names or cause.refines == cause.name):
            raise UserError(f"refines {cause.refines!r} is not another cause of this file", file=path,
                            field=f"causes[{index}].refines", hint=f"one of: {', '.join(names)}")
    noise = [*data.get("cascade", []), *data.get("teardown", [])]
    for key in ("cascade", "teardown"):
        for pattern in data.get(key, []):
            _check_regex(pattern, path, key)
    return _Taxonomy(causes=tuple(causes), generic_states=frozenset(s.upper() for s in data.get("generic_states", [])),
                     noise=_one_regex(noise), rule_patterns=patterns,
                     any_rule=re.compile("|".join(f"(?:{p.pattern})" for p in patterns.values())))


def _check_regex(pattern: str, path: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise UserError(f"bad regex {pattern!r}: {exc}", file=path, field=where,
                        hint="fix the regular expression") from exc


def _policy(entry: dict[str, Any], path: str, where: str) -> dict[str, Any]:
    """The retry policy fields of one cause, checked: a typo here must not silently become "stop"."""
    action = entry.get("action")
    if action not in ACTIONS:
        raise UserError(f"action {action!r} is not one of {', '.join(ACTIONS)}", file=path, field=f"{where}.action",
                        hint="say what sync does after this cause (see the file's header)")
    policy: dict[str, Any] = {}
    limit = entry.get("max_per_chain")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1 or action not in RETRY_ACTIONS:
            raise UserError(f"max_per_chain {limit!r} needs a retrying action and an integer >= 1", file=path,
                            field=f"{where}.max_per_chain", hint="e.g. `action: rollback` with `max_per_chain: 1`")
        policy["max_per_chain"] = limit
    requeues = entry.get("scheduler_requeues", False)
    if not isinstance(requeues, bool) or (requeues and action not in RETRY_ACTIONS):
        raise UserError(f"scheduler_requeues {requeues!r} needs true/false and a retrying action", file=path,
                        field=f"{where}.scheduler_requeues", hint="e.g. `action: resume` with `scheduler_requeues: true`")
    if requeues:
        policy["scheduler_requeues"] = True
    from_chain = entry.get("from_chain", False)
    if not isinstance(from_chain, bool) or (from_chain and entry.get("rules")):
        raise UserError(f"from_chain {from_chain!r} needs true/false and no rules", file=path,
                        field=f"{where}.from_chain", hint="a cause named from the chain's attempts has `rules: []`")
    if from_chain:
        policy["from_chain"] = True
    exclude = entry.get("exclude_node_for")
    if (exclude is None) != (action != "exclude_node_and_resume"):
        raise UserError("exclude_node_for goes with, and only with, action exclude_node_and_resume", file=path,
                        field=f"{where}.exclude_node_for", hint="e.g. `exclude_node_for: 6h`")
    if exclude is not None:
        try:
            policy["exclude_node_for_s"] = parse_duration(exclude)
        except ValueError as exc:
            raise UserError(f"not a duration: {exclude!r}", file=path, field=f"{where}.exclude_node_for",
                            hint="e.g. 6h or 30min") from exc
    return policy


def cause_names() -> list[str]:
    return [cause.name for cause in load_taxonomy()]


def get_cause(name: str) -> Cause:
    for cause in load_taxonomy():
        if cause.name == name:
            return cause
    raise UserError(f"unknown cause {name!r}", field="--cause", hint=f"one of: {', '.join(cause_names())}")


def marker_line(cause: str, **fields: object) -> str:
    """The line a job prints before failing on purpose, e.g. ``IDMCTL_FAILURE cause=nan_loss step=12``."""
    return " ".join([MARKER, f"cause={cause}", *(f"{key}={value}" for key, value in fields.items())])


def classify(
    state: str,
    reason: str | None = None,
    exit_code: str | None = None,
    derived_exit_code: str | None = None,
    log_tail: str = "",
    waited_seconds: float | None = None,
    restarts: int = 0,
    started: bool | None = None,
    ran_seconds: float | None = None,
) -> Classification:
    """The cause of this outcome by the taxonomy's rules and roles (its header says the order), with evidence."""
    raw, lines = log_lines(log_tail or "")
    cut = _cancel_cut(lines, state)
    raw, lines = raw[:cut], lines[:cut]
    record = _slurm_record(state, reason, exit_code, derived_exit_code, restarts, waited_seconds, ran_seconds)
    facts = {"state": first_word(state), "started": started, "exit_code": exit_code or "",
             "derived_exit_code": derived_exit_code or "", "reason": reason or "", "restarts": restarts}
    taxonomy = _load_taxonomy(str(TAXONOMY_PATH))
    hits = _hits(taxonomy, facts, lines)
    noise = [bool(taxonomy.noise.search(line)) for line in lines]
    chosen = _choose(taxonomy, facts, lines, hits, noise)
    if chosen is None:
        return Classification(cause="unknown", evidence=[record, *(_trim(raw[i]) for i in _error_like(lines, noise))])
    cause, root = chosen
    # lines another cause names (not a generic one: a traceback's own exception line is python_exception's too)
    claimed = {index for index, (_, name, _) in hits.items() if name != cause and not taxonomy_cause(taxonomy, name).generic}
    skip = [noise[i] or i in claimed for i in range(len(lines))]
    if root is None:  # a state rule: still show the log lines this cause's patterns know
        shown = [i for i, (_, name, _) in sorted(hits.items()) if name == cause]
    elif taxonomy_cause(taxonomy, cause).generic and (block := _traceback_blocks(lines, skip)):
        root = block[-1].exception_index
        project = [i for i, frame in zip(block[-1].frame_indices, block[-1].frames)
                   if not any(marker in frame["file"] for marker in _NOT_PROJECT)]
        shown = [root, *(project or block[-1].frame_indices)[-1:]]
    else:
        shown = _evidence_after(root, cause, lines, hits, skip)
    shown = list(dict.fromkeys(shown))[:MAX_EVIDENCE_LINES]
    detail = _detail(cause, lines, [lines[i] for i in shown], waited_seconds, restarts, skip)
    if ran_seconds is not None:
        detail["ran_seconds"] = ran_seconds
    patterns = [taxonomy.rule_patterns[key] for key in taxonomy.rule_patterns if key[0] == cause]
    return Classification(cause=cause, evidence=[record, *(_trim_at(raw[i], lines[i], patterns) for i in shown)],
                          detail=detail)


def _trim_at(raw: str, line: str, patterns: list[re.Pattern[str]]) -> str:
    """``raw`` trimmed to MAX_LINE_CHARS, from a little before what the cause's patterns matched when that lies
    further in (an error printed after a progress bar on the same line)."""
    found = [match.start() for pattern in patterns if (match := pattern.search(line))]
    start = min(found) + len(raw) - len(line) if found else 0
    if start + 40 <= MAX_LINE_CHARS or len(raw.strip()) <= MAX_LINE_CHARS:
        return _trim(raw)
    return _trim("…" + raw[start - 20:])


def taxonomy_cause(taxonomy: _Taxonomy, name: str) -> Cause:
    return next(cause for cause in taxonomy.causes if cause.name == name)


MAX_LOG_CHARS = 256_000
"""classify() reads at most this much of a log's end: a traceback and the Slurm lines fit many times over."""
MAX_SCAN_CHARS = 4_000
"""Patterns see at most this much of one line (a 10 MB line of progress bars is not read whole)."""
MAX_LOG_LINES = 4_000
"""And at most this many of the last lines (a tail of 32,000 one-character lines took 0.75 s to classify)."""
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_PREFIX = re.compile(r"^(?:\[\d+\] )?(?:\[(?:rank|default)\d+\]: ?|\[\d+,\d+\]<std(?:out|err)>:|\s{0,4}\d{1,5}: (?=\S| {2}File))*")
"""What launchers put before each line: a log collector's ``[80746] ``, torch's ``[rank3]:``, torchrun's
``[default0]:``, ``srun --label``'s ``0: `` (right-aligned), Open MPI's ``[1,0]<stderr>:``."""


def log_lines(text: str) -> tuple[list[str], list[str]]:
    """A log's last lines as printed (ANSI colour codes removed, a ``\\r`` progress bar split into its frames)
    and the same lines without launcher prefixes (what the patterns see). Bounded: the last MAX_LOG_CHARS
    characters, each line cut at MAX_SCAN_CHARS."""
    text = _ANSI.sub("", text[-MAX_LOG_CHARS:])
    raw = [line[:MAX_SCAN_CHARS].rstrip() for line in _LINE_BREAK.split(text)[-MAX_LOG_LINES:]]
    return raw, [_PREFIX.sub("", line, count=1) for line in raw]


def _hits(taxonomy: _Taxonomy, facts: dict[str, Any], lines: list[str]) -> dict[int, tuple[int, str, str]]:
    """Line index → (cause order, cause, role) of the first cause (in taxonomy order) whose log rule matches
    the line. A rule's other conditions (state, exit code…) must hold too."""
    found: dict[int, tuple[int, str, str]] = {}
    candidates = [index for index, line in enumerate(lines) if taxonomy.any_rule.search(line)]
    for order, cause in enumerate(taxonomy.causes):
        for number, rule in enumerate(cause.rules):
            if "log" not in rule or not _conditions_hold(rule, facts):
                continue
            pattern = taxonomy.rule_patterns[(cause.name, number)]
            role = rule.get("role", ROOT)
            for index in candidates:
                line = lines[index]
                if index not in found and pattern.search(line):
                    found[index] = (order, cause.name, role)
                elif index in found and found[index][1] == cause.name and role == ROOT:
                    found[index] = (order, cause.name, ROOT)  # the same cause's root rule outranks its cascade
    return found


def _choose(taxonomy: _Taxonomy, facts: dict[str, Any], lines: list[str], hits: dict[int, tuple[int, str, str]],
            noise: list[bool]) -> tuple[str, int | None] | None:
    """(cause, index of its root line, or None when a state rule decided) by the taxonomy header's order."""
    by_name = {cause.name: cause for cause in taxonomy.causes}
    roots = [(i, name) for i, (_, name, role) in sorted(hits.items()) if role == ROOT and not by_name[name].generic]
    root = roots[0] if roots else None
    specific, generic = _state_causes(taxonomy, facts)
    if specific is not None:
        if root is not None and specific in _lineage(by_name, root[1]):
            return root[1], root[0]
        return specific, None
    if root is not None:
        return root[1], root[0]
    claimed = {i for i, (_, name, _) in hits.items() if not by_name[name].generic}
    generic_causes = [name for _, name, _ in hits.values() if by_name[name].generic]
    names = [c.name for c in taxonomy.causes]
    generic_causes = list(dict.fromkeys(sorted(generic_causes, key=names.index)))
    for name in generic_causes:
        skip = [noise[i] or i in claimed for i in range(len(lines))]
        blocks = _traceback_blocks(lines, skip)
        if blocks:
            return name, blocks[-1].exception_index
        plain = [i for i, (_, hit, _) in sorted(hits.items()) if hit == name and not _is_traceback_line(lines[i])
                 and not noise[i]]
        if plain:
            return name, plain[-1]
    cascades = [(i, name) for i, (_, name, role) in sorted(hits.items()) if role == CASCADE]
    if cascades:
        return cascades[0][1], cascades[0][0]
    # A traceback cut before its exception line: its innermost frame. Not in a cancelled job's log: there it is
    # the interrupt's (Ctrl-C, scancel's signal) more often than the failure's.
    ended = max((block.exception_index for block in _traceback_blocks(lines)), default=-1)
    for name in generic_causes if facts["state"] != JobState.CANCELLED else []:
        open_lines = [i for i, (_, hit, _) in sorted(hits.items()) if hit == name and i > ended]  # after the last exception
        frames = [i for i in open_lines if _FRAME.match(lines[i])]
        if frames or open_lines:
            return name, (frames or open_lines)[-1]
    return (generic, None) if generic is not None else None


def _state_causes(taxonomy: _Taxonomy, facts: dict[str, Any]) -> tuple[str | None, str | None]:
    """The first cause whose rule of Slurm's record alone (no ``log``) holds on a specific state, and the first
    on a generic one (FAILED, CANCELLED while running: log evidence wins over these)."""
    specific = generic = None
    for cause in taxonomy.causes:
        for rule in cause.rules:
            if "log" in rule or not _conditions_hold(rule, facts):
                continue
            states = {s.upper() for s in rule.get("state", [])}
            if states and states <= taxonomy.generic_states and rule.get("started") is not False:
                generic = generic or cause.name
            else:
                specific = specific or cause.name
    return specific, generic


def _lineage(by_name: dict[str, Cause], name: str) -> list[str]:
    """``name`` and every cause it refines, transitively (collective_timeout → hang)."""
    chain = [name]
    while (parent := by_name[chain[-1]].refines) is not None and parent not in chain:
        chain.append(parent)
    return chain


def _evidence_after(root: int, cause: str, lines: list[str], hits: dict[int, tuple[int, str, str]],
                    skip: list[bool]) -> list[int]:
    """The root line, the exception line that follows it (when the root is not one), then more of the cause's
    own lines: never the noise printed while dying."""
    if root > 0 and _FRAME.match(lines[root - 1]):  # a traceback's source line (`raise X("...")`): its exception line
        root = next((i for i, (_, name, _) in sorted(hits.items()) if name == cause and i > root
                     and not _FRAME.match(lines[i - 1])), root)
    shown = [root]
    if not _STRICT_EXCEPTION.match(lines[root]):
        after = next((i for i in range(root + 1, min(len(lines), root + 40))
                      if not skip[i] and _STRICT_EXCEPTION.match(lines[i])), None)
        if after is not None:
            shown.append(after)
    seen = {lines[i].strip() for i in shown}
    for index, (_, name, _) in sorted(hits.items()):
        if name == cause and index > root and lines[index].strip() not in seen:
            shown.append(index)
            seen.add(lines[index].strip())
    return shown


_ERROR_WORDS = re.compile(r"(?i)\b(error|exception|fatal|failed|failure|abort(ed)?|killed|segmentation fault|panic|"
                          r"cannot|unable|denied|timed? ?out)\b")


def _error_like(lines: list[str], noise: list[bool], count: int = 2) -> list[int]:
    """For ``unknown``: the ``count`` most error-like lines (an exception line, then a line with an error word;
    the later of equals), in log order; the last lines when none is."""
    scored = []
    for index, line in enumerate(lines):
        if noise[index] or not line.strip() or _FRAME.match(line):
            continue
        score = 2 if _STRICT_EXCEPTION.match(line.strip()) else 1 if _ERROR_WORDS.search(line) else 0
        scored.append((score, index))
    best = sorted(scored, reverse=True)[:count]
    if not best or best[0][0] == 0:
        best = scored[-count:]
    return sorted(index for _, index in best)


_CANCELLED_BY_HAND = re.compile(r"\*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ \*\*\*")
"""slurmstepd's line when someone ran scancel (a preemption, time limit or node failure says "DUE TO")."""


def _cancel_cut(lines: list[str], state: str | None) -> int:
    """For a job Slurm ended CANCELLED, how many lines come before the cancellation: what it printed while being
    torn down (a traceback from a write to the closed srun pipe, a signal message) is the cancel's doing, not
    the cause. A traceback printed before the cancel still names the cause (one rank crashed, the others
    hung, someone cancelled)."""
    if first_word(state) != JobState.CANCELLED:
        return len(lines)
    return next((index for index, line in enumerate(lines) if _CANCELLED_BY_HAND.search(line)), len(lines))


def _conditions_hold(rule: dict[str, Any], facts: dict[str, Any]) -> bool:
    """Whether a rule's conditions on Slurm's record hold (its ``log`` patterns are matched apart)."""
    if "state" in rule and facts["state"] not in {s.upper() for s in rule["state"]}:
        return False
    if "started" in rule and facts["started"] is not rule["started"]:
        return False
    if "exit_code" in rule and facts["exit_code"] not in rule["exit_code"]:
        return False
    if "derived_exit_code" in rule and facts["derived_exit_code"] not in rule["derived_exit_code"]:
        return False
    if "reason" in rule and not re.search(rule["reason"], facts["reason"]):
        return False
    return not ("restarts_at_least" in rule and facts["restarts"] < rule["restarts_at_least"])


def _slurm_record(state: str, reason: str | None, exit_code: str | None, derived: str | None,
                  restarts: int, waited_seconds: float | None, ran_seconds: float | None) -> str:
    parts = [f"State={state}"]
    if exit_code:
        parts.append(f"ExitCode={exit_code}")
    if derived and derived != "0:0":
        parts.append(f"DerivedExitCode={derived}")
    if reason and reason != "None":
        parts.append(f"Reason={reason}")
    if restarts:
        parts.append(f"Restarts={restarts}")
    for label, seconds in (("waited", waited_seconds), ("ran", ran_seconds)):
        if seconds is not None:
            exact = f" ({seconds:,.0f} s)" if seconds >= 120 else ""
            parts.append(f"{label} {format_duration(seconds)}{exact}")
    return "Slurm: " + " ".join(parts)


_TRACEBACK_CAUSES = ("python_exception", "loader_config", "oom_cuda", "shm_enospc", "gpu_hardware", "network_fault",
                     "driver_mismatch", "collective_timeout", "checkpoint_write_failed")
"""Causes whose headline is the exception that ended the job, where a traceback shows one."""


def _detail(cause: str, lines: list[str], matched: list[str], waited_seconds: float | None,
            restarts: int, skip: list[bool] | None = None) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    for line in matched:
        if MARKER in line:
            detail.update(_marker_fields(line))
    if cause == "queue_cancelled" and waited_seconds is not None:
        detail["waited_seconds"] = waited_seconds
    if cause == "preempted":
        detail["restarts"] = restarts
    if cause in _TRACEBACK_CAUSES:
        detail.update(parse_traceback(lines, skip))
    return detail


def _marker_fields(line: str) -> dict[str, str]:
    text = line[line.index(MARKER) + len(MARKER):]
    return dict(pair.split("=", 1) for pair in text.split() if "=" in pair)


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_STRICT_EXCEPTION = re.compile(r"^\s*(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]*(?:Error|Exception|Exit|Interrupt|Fault|"
                               r"Failure|Timeout|Exhausted))(?::\s?(?P<message>.*))?$")
"""An exception line that no source line of an unindented traceback looks like (``ValueError: x``)."""
_NOT_PROJECT = ("/site-packages/", "/dist-packages/", "<frozen ", "/lib/python3.")


@dataclass(frozen=True)
class _Block:
    """One traceback of a log."""

    frames: list[dict[str, str]]
    frame_indices: list[int]
    exception: dict[str, str]
    exception_index: int


def _is_traceback_line(line: str) -> bool:
    return line.strip().endswith("Traceback (most recent call last):") or bool(_FRAME.match(line))


def _traceback_blocks(lines: list[str], skip: list[bool] | None = None) -> list[_Block]:
    """The tracebacks of ``lines`` (a tail cut inside one counts: it starts at its first frame), in order,
    without those Python ignored ("Exception ignored in") and those whose exception line is ``skip``ped (the
    teardown's: torchrun's ChildFailedError; or another cause's: a CUDA OOM is no python_exception)."""
    blocks: list[_Block] = []
    frames: list[dict[str, str]] | None = None
    indices: list[int] = []
    ignored = after_ignored = after_frame = False
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.endswith("Traceback (most recent call last):"):
            frames, indices, ignored, after_frame = [], [], after_ignored, False
            continue
        after_ignored = stripped.startswith("Exception ignored in")
        if after_ignored:
            frames = None
            continue
        frame = _FRAME.match(line)
        if frames is None:
            if not frame:
                continue
            frames, indices = [], []  # a tail that starts inside a traceback: its header was cut off
        if frame:
            frames.append(frame.groupdict())
            indices.append(index)
            after_frame = True
            continue
        if line.startswith((" ", "\t")) or not stripped or not stripped[0].isalnum() and stripped[0] != "_":
            continue  # source line or caret markers under a frame
        if after_frame and not _STRICT_EXCEPTION.match(stripped):
            after_frame = False  # an unindented traceback's source line
            continue
        exception = _EXCEPTION.match(stripped)
        if not ignored and not (skip and skip[index]):
            blocks.append(_Block(frames, indices, exception.groupdict() if exception else {"type": stripped, "message": ""},
                                 index))
        frames, ignored, after_frame = None, False, False
    return blocks


def parse_traceback(lines: list[str], skip: list[bool] | None = None) -> dict[str, Any]:
    """Exception type, message and the innermost project frame of the last traceback in ``lines``.

    When the last traceback is a re-raise from a DataLoader worker ("Original Traceback"), its
    frames are the worker's; a frame is "project" unless it is in site-packages or the stdlib. A
    traceback under "Exception ignored in: ..." is one Python swallowed (the process went on): never
    the failure: in a local job's log the watchdog, TERMed while its interpreter shut down, printed
    "SystemExit: 0" after the trainer's TypeError, and that had become the evidence. ``skip``: lines whose
    traceback is not the failure's (see :func:`_traceback_blocks`).
    """
    blocks = _traceback_blocks(lines, skip)
    if not blocks:
        return {}
    exception = blocks[-1].exception
    detail: dict[str, Any] = {"exception_type": exception["type"], "message": (exception.get("message") or "").strip()}
    for block in reversed(blocks):
        project = [f for f in block.frames if not any(marker in f["file"] for marker in _NOT_PROJECT)]
        if project:
            innermost = project[-1]
            detail["frame"] = f"{_relative(innermost['file'])}:{innermost['line']}"
            detail["function"] = innermost["func"]
            break
    return detail


def _relative(path: str) -> str:
    """Relative to the project, whether the job ran from the live tree or (as now) from a code snapshot."""
    from ground.code_snapshot import path_in_code  # start-up: only a traceback with frames needs it (subprocess, shutil)

    try:
        return str(Path(path).relative_to(REPO_ROOT))
    except ValueError:
        return path_in_code(path) or path


def _trim(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 1] + "…"

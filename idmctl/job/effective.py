"""The effective job: the spec, the command-line flags and the active node exclusions, as one object.

``submit`` and ``preflight`` both build it, so the checks judge exactly what would be sent. The request
fields that change resources (qos, time limit, mem, CPUs, GPUs: ``RESOURCE_FIELDS``) are written into a
copy of the spec's ``resources``: every check, and the trainer (its ``spec.json``), sees the job as it runs.
Scheduling-only options (job name, exclude, retries, hold) and the entry live in the options.

The spec's own hash (``declared``) still keys the preflight gate; the smoke's measurement is keyed
on what it measured too, so the fields that change that (``SMOKE_FIELDS``) are part of the key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ground.errors import UserError
from ground.spec.loader import ResolvedSpec
from ground.spec.schema import ExperimentSpec
from idmctl.core.job_options import RESOURCE_FIELDS, SMOKE_FIELDS, JobOptions, JobRequest, flag_of, resource_of
from idmctl.job.render import DEFAULT_ENTRY
from idmctl.core.profile import ClusterProfile
from idmctl.record.exclusions import active_exclusions  # re-exported: submit merges them into a resubmission
from ground.class_path import code_roots, ensure_importable, inside
from ground.spec.loader import load_spec
from idmctl.core.profile import load_profile
from idmctl.job.render import entry_words
from idmctl.job.render import resolve_options, with_exclusions


def apply_flags(declared: ResolvedSpec, options: JobOptions, names: list[str]) -> ResolvedSpec:
    """``declared`` with the ``resources`` fields of request fields ``names`` replaced by the options'
    values, re-validated (so a world size that no longer divides ``train.effective_batch`` is refused
    where it comes from). Names outside ``RESOURCE_FIELDS`` change nothing here."""
    names = [name for name in names if name in RESOURCE_FIELDS]
    changed = {resource_of(name): getattr(options, name) for name in names}
    if not changed:
        return declared
    canonical = declared.canonical
    data = {**canonical, "resources": {**canonical["resources"], **changed}}
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first.get("ctx", {}).get("error") or first["msg"]).removeprefix("Value error, ")
        shown = " ".join(f"{flag_of(name)} {'gpu:' if name == 'gpus_per_node' else ''}{getattr(options, name)}"
                         for name in names)
        raise UserError(f"the spec with {shown} is invalid: {message}", file="command line",
                        field=",".join(flag_of(name) for name in names), hint="pick values the spec allows") from exc
    return ResolvedSpec(name=declared.name, path=declared.path, spec=spec, chain=declared.chain)


@dataclass(frozen=True)
class EffectiveJob:
    """What one submission would run: spec + flags + node exclusions."""

    declared: ResolvedSpec
    """The spec as written; its hash keys the preflight gate and the job rows."""
    resolved: ResolvedSpec
    """The spec with the resource flags applied: what the checks judge and the trainer reads."""
    options: JobOptions
    """Everything the batch script asks for (exclusions merged)."""
    request: JobRequest
    """The flags given, typed."""
    profile: ClusterProfile
    profile_hash: str
    exclusions: list[str] = field(default_factory=list)
    """Active node exclusions merged into ``options.exclude``."""

    @property
    def changed(self) -> list[str]:
        """Request fields whose value differs from what the spec says (a flag repeating the spec changes
        nothing), then the entry and the build when they make it another job than the spec's training."""
        res = self.declared.spec.resources
        out = [name for name in RESOURCE_FIELDS
               if self.request.is_given(name) and getattr(self.options, name) != getattr(res, resource_of(name))]
        if self.options.entry != DEFAULT_ENTRY and not self.options.build:
            out.append("entry")
        if self.options.build:
            out.append("build")
        return out

    @property
    def changed_flags(self) -> list[str]:
        """:attr:`changed` as flag spellings (what the rows and messages show)."""
        return [flag_of(name) for name in self.changed]

    @property
    def smoke_flags(self) -> dict[str, str]:
        """The gate's key: the ``SMOKE_FIELDS`` that change the job, keyed by flag as the rows keep it."""
        values = {"gpus_per_node": f"gpu:{self.options.gpus_per_node}", "entry": self.options.entry,
                  "build": self.options.build}
        return {flag_of(name): values[name] for name in SMOKE_FIELDS if name in self.changed}

    def shown(self, name: str) -> str:
        """``--qos sub``: request field ``name`` as the user typed it."""
        value = self.request.given().get(flag_of(name))
        if isinstance(value, list):
            value = ",".join(value)
        return f"{flag_of(name)} {value}"

    def record(self) -> dict[str, Any]:
        """What the job row keeps about how it was built (flags by spelling, as rows always kept them)."""
        return {"flags": self.request.given(), "changed": self.changed_flags,
                "smoke_flags": self.smoke_flags, "exclusions": self.exclusions,
                "spec_hash": self.declared.hash, "effective_spec_hash": self.resolved.hash}


def with_profile_defaults(options: JobOptions, profile: ClusterProfile) -> JobOptions:
    """What neither flag nor spec says, the cluster profile does: its account, constraint and reservation,
    and the partition of the QoS tier (else the profile's)."""
    tier = profile.qos.get(options.qos)
    return replace(options, account=options.account or profile.account,
                   partition=options.partition or (tier.partition if tier else None) or profile.partition,
                   constraint=options.constraint or profile.constraint,
                   reservation=options.reservation or profile.reservation)


INTERPRETERS = ("bash", "sh", "python", "python3")
"""Programs whose first argument is the script that must exist (``bash scripts/run.sh``)."""


def check_entry_exists(entry: str, declared: ResolvedSpec, from_flag: bool) -> None:
    """The entry the job would start can be started: a module that imports from the code roots, or a
    program on PATH (or in the first root) and, for an interpreter, its script. Bad input, exit 2."""
    import importlib.util
    import shutil

    where, field_name = ("command line", "--entry") if from_flag else (str(declared.path), "code.entry")
    roots = code_roots(declared.spec)
    words = entry_words(entry)
    if words is None:
        ensure_importable(roots)
        try:
            found = importlib.util.find_spec(entry)
        except (ImportError, ValueError):
            found = None
        if found is None or found.origin is None or not inside(Path(found.origin), roots):
            raise UserError(f"module {entry!r} does not import from the code roots ({', '.join(map(str, roots))})",
                            file=where, field=field_name, hint="check the name, or add its repository to code.roots")
        return
    cwd = roots[1] if len(roots) > 1 else roots[0]
    program = words[0]
    if "/" in program:
        path = cwd / program
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"{program!r} is not an executable file in {cwd}", file=where, field=field_name,
                            hint=f"chmod +x it, or start it with its interpreter (bash {program})")
    elif shutil.which(program) is None:
        raise UserError(f"{program!r} is not on PATH", file=where, field=field_name, hint="install it or give its path")
    if program in INTERPRETERS and len(words) > 1 and not words[1].startswith("-") and not (cwd / words[1]).is_file():
        raise UserError(f"{words[1]!r} does not exist in {cwd} (a command-line entry runs from the first code root)",
                        file=where, field=field_name, hint="give the script's path relative to that root")
    if program in INTERPRETERS and len(words) > 1 and declared.spec.code.launch is None and not from_flag:
        _require_stated_launch(cwd / words[1], declared)


_LAUNCHER = re.compile(r"(?:^|[\s/\"'(])(torchrun|deepspeed)\b|\baccelerate\s+launch\b|-m\s+torch\.distributed\.(?:run|launch)\b")
"""A line of a launch script that starts the node's ranks itself (``ground.spec.schema.PER_NODE_LAUNCHERS``)."""


def _require_stated_launch(script: Path, declared: ResolvedSpec) -> None:
    """Card A's ``bash run.sh`` starts ``torchrun --nproc_per_node 8`` itself: under srun's one task per rank that
    is 8 launchers × 8 ranks. The command line cannot show it, the script can: such a script with no
    ``code.launch`` stated is a spec error naming the line."""
    try:
        lines = script.read_text(errors="replace").splitlines()
    except OSError:
        return
    for number, line in enumerate(lines, 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
        found = _LAUNCHER.search(code)
        if found:
            raise UserError(f"{script.name}:{number} starts its own ranks ({found.group(0).strip()}); under one srun "
                            "task per rank that is a launcher per rank, each starting every rank",
                            file=str(declared.path), field="code.launch",
                            hint="state code.launch: per_node (once per node, with the node's GPUs), or per_rank "
                                 "if the script starts one process")


def build(experiment: str, request: JobRequest, cluster: str | None, version: str | None = None) -> EffectiveJob:
    """Load the spec and the profile, resolve the flags, merge active exclusions: the effective job.
    Bad flag values are UserErrors naming the flag (exit 2). ``version``: the code version, when the
    caller has it already (else the limits derivation asks git)."""

    declared = load_spec(experiment)
    profile, profile_hash = load_profile(cluster)
    options = resolve_options(declared, request)
    if request.qos is not None:  # a typo on the command line is bad input; the spec's own QoS is the checks' to judge
        profile.tier(options.qos, file="command line", field=flag_of("qos"))
    options = with_profile_defaults(options, profile)
    if options.hold and profile.scheduler != "slurm":
        raise UserError(f"--hold needs a Slurm cluster; {profile.name} runs jobs at once", file="command line",
                        field=flag_of("hold"), hint="drop --hold, or submit with --cluster naming a Slurm profile")
    if not options.build and options.entry != DEFAULT_ENTRY:
        check_entry_exists(options.entry, declared, from_flag=request.entry is not None)
    exclusions = active_exclusions()
    options = with_exclusions(options, exclusions)
    # What the spec and flags leave open (time limit, checkpoint interval, signal lead) is derived from
    # measurement; the effective spec then carries the derived time limit, so the checks judge it.
    from idmctl.job.derived import job_limits, start_deadline

    if options.build:
        # A build has no steps or checkpoints to derive limits from: it is sized by its own arithmetic (the
        # passing build preflight's smoke), resources.build or the flags, by gate.build.sized, which submit and
        # the build preflight apply to this job (the gate's floor is above this one).
        pass
    else:
        options = job_limits(declared, profile, options, version)
    options = replace(options, hang_k=profile.hang.k, hang_floor_s=profile.hang.floor_seconds,
                      hang_poll_s=profile.hang.poll_seconds,
                      hang_start_s=None if options.build else start_deadline(declared, profile))
    flagged = [name for name in RESOURCE_FIELDS if request.is_given(name)]
    if declared.spec.resources.time_limit is None and "time_limit" not in flagged:
        flagged.append("time_limit")  # the derived limit: the checks judge the job as it will run
    resolved = apply_flags(declared, options, flagged)
    return EffectiveJob(declared, resolved, options, request, profile, profile_hash, exclusions)

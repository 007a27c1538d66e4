"""Render one sbatch script from a resolved spec plus the job request (the command line's flags, typed).

Every value that lands in the script is validated against a strict pattern or shell-quoted, so a job
name, QoS, node list or path carrying a newline, ``;``, ``$(`` or a backtick cannot add a line to the
``#SBATCH`` header or a command to the body: such input is a UserError (exit 2), never a script.
The same script runs under Slurm (``srun`` launches the ranks) and under the local executor.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ground import contract
from ground.errors import UserError
from ground.paths import REPO_ROOT, expand_path
from ground.spec.loader import ResolvedSpec
from ground.stage import REPLACE_WAIT_S, layer_set, model_identity, node_named, spec_identity
from ground.spec.schema import (CONSTRAINT, MAX_COUNT, NODE_LIST, SLURM_NAME, check_job_mem, check_job_time,
                                detect_launch)
from ground.units import slurm_mem, slurm_time
from idmctl.core.job_options import JobOptions, JobRequest, flag_of
from idmctl.job.template import fill
from idmctl.plan.shm import need_bytes


_NAME = re.compile(SLURM_NAME)
_NODE_LIST = re.compile(NODE_LIST)
_CONSTRAINT = re.compile(CONSTRAINT)
_SBATCH_PATH = re.compile(r"^/[A-Za-z0-9._/+@%=-]{1,4000}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f`$;|&<>\\'\"]")
DEFAULT_ENTRY = contract.DEFAULT_ENTRY


def _bad(what: str, field_name: str, source: str, hint: str) -> UserError:
    return UserError(what, file=source, field=field_name, hint=hint)


def check_name(value: str, field_name: str, source: str) -> str:
    if not _NAME.fullmatch(value):
        raise _bad(f"{value!r} is not a safe name", field_name, source,
                   "use letters, digits, '.', '_', '+', '-' (no spaces, newlines, ';', '$(' or backticks)")
    return value


def check_nodes(values: list[str], field_name: str, source: str) -> list[str]:
    for value in values:
        if not _NODE_LIST.fullmatch(value):
            raise _bad(f"{value!r} is not a node name or list", field_name, source,
                       "use Slurm host names such as worker-5 or n[1-2]")
    return values


def check_shell_path(value: str, field_name: str, source: str) -> Path:
    """A path used in the script body: expanded here, then refused if it carries shell syntax."""
    # Checked after expansion: ${IDMCTL_HOME} is fine, whatever is left of '$(' or a backtick is not.
    path = expand_path(value)
    if _UNSAFE_CHARS.search(str(path)):
        raise _bad(f"{value!r} contains a control character or shell syntax", field_name, source,
                   "use a plain path (no newline, ';', '$(', backticks or quotes)")
    return path


def stage_dest_word(dest: str, source: str) -> tuple[str, str | None]:
    """``stage.dest`` as one shell word of the script, and the variable the node must have set (None: a
    plain path of the submitting host). A leading ``$NAME``/``${NAME}`` (``ground.stage.node_named``) stays
    for the node's shell to expand, as ``"${NAME}"/rest``; any other ``$`` is refused as in every path."""
    named = node_named(dest)
    if named is None:
        return shlex.quote(str(check_shell_path(dest, "stage.dest", source))), None
    if named.rest and (_UNSAFE_CHARS.search(named.rest) or not named.rest.startswith("/")):
        raise _bad(f"{dest!r}: only a leading ${named.variable} is expanded on the node; the rest must be a plain path",
                   "stage.dest", source, f"e.g. ${named.variable}/idm (no further $, ';', quotes or backticks)")
    return f'"${{{named.variable}}}"{shlex.quote(named.rest) if named.rest else ""}', named.variable


def check_sbatch_path(path: Path, field_name: str, source: str) -> str:
    """A path in an ``#SBATCH`` line: sbatch does not quote, so only a conservative charset passes."""
    text = str(path)
    if not _SBATCH_PATH.fullmatch(text):
        raise _bad(f"{text!r} is not usable in an #SBATCH line", field_name, source,
                   "use an absolute path of letters, digits and ._/+@%=- (set IDMCTL_HOME accordingly)")
    return text


def resolve_options(resolved: ResolvedSpec, request: JobRequest) -> JobOptions:
    """Spec defaults, then every value the request gives; each value validated where it came from."""
    res = resolved.spec.resources
    spec_file = str(resolved.path)

    def source(name: str, spec_field: str) -> tuple[str, str]:
        """(file, field) naming where a value came from: the flag, else the spec."""
        return ("command line", flag_of(name)) if request.is_given(name) else (spec_file, spec_field)

    def pick(name: str, default: Any) -> Any:
        # `is not None`, not `or`: `-c 0` or `-J ""` is a value to check, never a silent fall-back.
        value = getattr(request, name)
        return value if value is not None else default

    gpus = pick("gpus_per_node", res.gpus_per_node)
    build = request.build
    if build is not None:
        if build not in contract.BUILD_MODES:
            raise UserError(f"unknown build {build!r}", file="command line", field=flag_of("build"),
                            hint=f"one of {', '.join(contract.BUILD_MODES)}")
        if request.entry is not None:
            raise UserError("--build runs the build entry; --entry does not go with it", file="command line",
                            field=flag_of("entry"), hint="drop --entry")
    entry = contract.BUILD_ENTRY if build else pick("entry", resolved.spec.code.entry or DEFAULT_ENTRY)
    options = JobOptions(
        job_name=pick("job_name", f"{resolved.name}-build-{build}" if build else res.job_name or resolved.name),
        qos=pick("qos", res.qos),
        partition=pick("partition", res.partition),
        nodes=res.nodes,
        ranks_per_node=gpus if gpus > 0 else res.cpu_ranks,
        cpus_per_node=pick("cpus_per_node", res.cpus),
        mem=pick("mem", res.mem),
        gpus_per_node=gpus,
        time_limit=pick("time_limit", res.time_limit),
        exclude=list(pick("exclude", res.exclude)),
        retries=pick("retries", res.retries),
        entry=entry,
        hold=request.hold,
        build=build,
        dependency=request.dependency,
        kill_on_invalid_dep=request.kill_on_invalid_dep,
        account=pick("account", res.account),
        constraint=pick("constraint", res.constraint),
        reservation=pick("reservation", res.reservation),
        launch="per_rank" if build else launch_mode(resolved, entry, request.entry is not None),
    )
    check_name(options.job_name, *reversed(source("job_name", "resources.job_name")))
    check_name(options.qos, *reversed(source("qos", "resources.qos")))
    for name in ("partition", "account", "reservation"):
        if getattr(options, name) is not None:
            check_name(getattr(options, name), *reversed(source(name, f"resources.{name}")))
    if options.constraint is not None and not _CONSTRAINT.fullmatch(options.constraint):
        raise _bad(f"{options.constraint!r} is not a Slurm feature expression", *reversed(source("constraint", "resources.constraint")),
                   "node features such as h100 or a100&ib (no spaces, quotes or newlines)")
    if options.launch == "single" and options.nodes > 1:
        raise UserError(f"launch single runs one process, on one node; resources.nodes is {options.nodes}",
                        file=spec_file, field="code.launch", hint="set resources.nodes: 1, or launch: per_node / per_rank")
    check_nodes(options.exclude, *reversed(source("exclude", "resources.exclude")))
    check_entry(options.entry, *source("entry", "code.entry"))
    for name, spec_field, check in (("mem", "resources.mem", check_job_mem),
                                    ("time_limit", "resources.time_limit", check_job_time)):
        value = getattr(request, name)
        if value is not None:
            try:
                check(value)
            except ValueError as exc:
                raise UserError(str(exc), file="command line", field=flag_of(name),
                                hint=f"same format as {spec_field}") from exc
    if options.cpus_per_node < 1:
        raise UserError("must be at least 1", file="command line", field=flag_of("cpus_per_node"), hint="CPUs per node")
    if options.cpus_per_node > MAX_COUNT:
        raise UserError(f"{options.cpus_per_node} is more CPUs than any node has", file="command line",
                        field=flag_of("cpus_per_node"), hint="CPUs per node")
    if not 0 <= options.retries <= 1_000:
        raise UserError("must be 0 … 1000", file="command line", field=flag_of("retries"), hint="resubmission budget")
    return options


def launch_mode(resolved: ResolvedSpec, entry: str, from_flag: bool) -> str:
    """How ``entry`` starts: the spec's ``code.launch``, else what its command line shows, else ``per_rank``.
    An ``--entry`` the stated mode contradicts is bad input naming the flag (the spec's own pair is checked
    when the spec loads)."""
    stated, detected = resolved.spec.code.launch, detect_launch(entry)
    if stated is not None and detected is not None and stated != detected:
        raise UserError(f"{entry!r} starts its own ranks ({detected}), but code.launch is {stated}", file="command line",
                        field="--entry", hint=f"give an entry that matches launch: {stated}, or change code.launch")
    return stated or detected or "per_rank"


def entry_words(entry: str) -> list[str] | None:
    """A command-line entry's words (None for a Python module name)."""
    return None if _MODULE.fullmatch(entry) else shlex.split(entry)


def check_entry(entry: str, source: str, field_name: str) -> None:
    """A module name, or one command line of plain words (no shell syntax: it is quoted word by word)."""
    try:
        words = entry_words(entry)
    except ValueError as exc:
        raise UserError(f"{entry!r} is not one command line ({exc})", file=source, field=field_name,
                        hint="a module such as team_idm.train, or e.g. bash scripts/run.sh") from exc
    if words is None:
        return
    bad = [w for w in words if _UNSAFE_CHARS.search(w)]
    if not words or bad:
        raise UserError(f"{entry!r} is neither a module name nor a plain command line", file=source, field=field_name,
                        hint="a module (team_idm.train) or words without ;, |, $, backticks or redirections "
                             "(bash scripts/run.sh --flag 1)")


def with_exclusions(options: JobOptions, nodes: list[str]) -> JobOptions:
    merged = list(dict.fromkeys([*options.exclude, *nodes]))
    return replace(options, exclude=merged)


@dataclass(frozen=True)
class RenderContext:
    """Where one attempt of a chain lives and what it is told through its environment."""

    run_dir: Path
    chain_id: int
    attempt: int
    idmctl_home: Path
    log_path: str
    """Absolute; may contain ``%j`` (Slurm substitutes the job id)."""
    python: str = sys.executable
    repo_root: Path = REPO_ROOT
    """Where the job runs from: the chain's code snapshot (``ground.code_snapshot``)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    stage_bytes: int | None = None
    """What stage-in copies to each node (the disk check's number at submit); the node guard compares
    it with the node's free scratch. None: not known, the guard skips that comparison."""
    stage_wait_s: float = REPLACE_WAIT_S
    """How long a stage-in that would replace a copy other running jobs read waits for them (``ground.stage``)."""


def render_script(resolved: ResolvedSpec, options: JobOptions, ctx: RenderContext) -> str:
    """The batch script (``templates/job.sh.tmpl``): #SBATCH header, stage-in, then the trainer under srun
    with USR1 forwarding. Every value is validated or shell-quoted here; the template holds the bash."""
    spec = resolved.spec
    spec_file = str(resolved.path)
    log_path = check_sbatch_path(Path(ctx.log_path), "log path", contract.ENV_HOME)
    for name, value in ((contract.ENV_HOME, ctx.idmctl_home), ("run dir", ctx.run_dir),
                        ("python", Path(ctx.python)), ("repository", ctx.repo_root)):
        check_shell_path(str(value), name, "environment")
    env = {
        contract.ENV_HOME: str(ctx.idmctl_home),
        contract.ENV_CHAIN_ID: str(ctx.chain_id),
        contract.ENV_ATTEMPT: str(ctx.attempt),
        contract.ENV_SPEC_HASH: resolved.hash,
        "PYTHONUNBUFFERED": "1",
        # The entry contract's variables: any entry (module or launch script) finds its run directory
        # and the interpreter the gate checked.
        contract.ENV_RUN_DIR: str(ctx.run_dir),
        "IDMCTL_PYTHON": ctx.python,
        **({contract.ENV_CHECKPOINT_EVERY: str(options.checkpoint_every)} if options.checkpoint_every else {}),
        **({contract.ENV_LOADER_DIRECT: "1"} if options.loader_direct else {}),
        # A team's launch script that calls srun itself gets the CPUs per task too (srun reads this, not
        # SLURM_CPUS_PER_TASK, since 22.05); one started once per node learns how many ranks to start.
        "SRUN_CPUS_PER_TASK": str(options.cpus_per_task),
        **_launch_env(options),
        **ctx.extra_env,
    }
    for key, value in env.items():
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise UserError(f"{key!r} is not an environment variable name", field="env")
    copies = spec.stage.enabled and not options.build and options.eval_step is None
    if options.build:
        stage = fill("stage_in_none_build", {})
    elif options.eval_step is not None and spec.stage.enabled:
        stage = fill("stage_in_none_eval", {})
    else:
        stage = _stage_block(spec.stage.enabled, spec.data.cache_root, spec.stage.dest, spec_file,
                             routed_blocks=spec.data.selected_blocks if spec.stage.layers == "routed" else None,
                             suffix=".pt" if spec.data.cache_format == "legacy_pt" else ".safetensors",
                             python=ctx.python, model=model_identity(spec.data), wait_s=ctx.stage_wait_s)
    q = shlex.quote
    return fill("job", {
        "stage_where": _stage_where(spec.stage.dest, spec_file) if copies else "",
        **CONTRACT_SLOTS,
        "sbatch_header": "\n".join([*_sbatch_lines(options, log_path),
                                    *(f"# idmctl: {_comment(line)}" for line in options.derivation)]),
        "exports": "\n".join(f"export {key}={q(value)}" for key, value in env.items()),
        "run_dir": q(str(ctx.run_dir)),
        "repo_root": q(str(ctx.repo_root)),
        "code": _snapshot_lines(env, ctx),
        "node_guard": _guard_lines(resolved, options, ctx),
        "guard_stage_args": _guard_stage_args(resolved, options, ctx),
        "stage_in": stage,
        "rendezvous": _multi_node_env(options),
        "launch_mode": options.launch,
        "launch_said": LAUNCH_SAID[options.launch],
        "tasks_per_node": options.tasks_per_node,
        "cpus_per_task": options.cpus_per_task,
        "launch": _entry_lines(options, ctx, env),
        "python": q(ctx.python),
        "hang_k": f"{options.hang_k:g}",
        "hang_floor_s": f"{options.hang_floor_s:g}",
        "hang_poll_s": f"{options.hang_poll_s:g}",
        "hang_start": f" --start-deadline {options.hang_start_s:g}" if options.hang_start_s else "",
    }) + "\n"


LAUNCH_SAID = {"per_rank": "one task per rank, Fabric reads SLURM_* and needs ntasks-per-node == devices",
               "per_node": "one task per node holding its GPUs and CPUs; the entry starts its own ranks",
               "single": "one process"}
"""The launch modes as the script's comment says them."""


def _launch_env(options: JobOptions) -> dict[str, str]:
    """What an entry that starts its own ranks (``per_node``) needs to start the right number: the
    ranks per node (``torchrun --nproc_per_node "$IDMCTL_NPROC_PER_NODE"``) and the nodes."""
    if options.launch != "per_node":
        return {}
    return {contract.ENV_NPROC_PER_NODE: str(options.ranks_per_node), contract.ENV_NNODES: str(options.nodes)}


CONTRACT_SLOTS = {"ENV_CHAIN_ID": contract.ENV_CHAIN_ID, "ENV_ATTEMPT": contract.ENV_ATTEMPT,
                  "ENV_CACHE_ROOT": contract.ENV_CACHE_ROOT, "EXIT_HANG": contract.EXIT_HANG,
                  "EXIT_REQUEUE": contract.EXIT_REQUEUE, "REQUEUE_REFUSED": contract.REQUEUE_REFUSED,
                  "ENV_LOCAL_JOB_ID": contract.ENV_LOCAL_JOB_ID}
"""The contract's constants the template names in capitals (one home: ``ground.contract``)."""


def _sbatch_lines(options: JobOptions, log_path: str) -> list[str]:
    """The ``#SBATCH`` header, in this order; an option without a value is left out."""
    directives: list[tuple[str, object]] = [
        ("job-name", options.job_name),
        ("account", options.account),
        ("qos", options.qos),
        ("partition", options.partition or None),
        ("reservation", options.reservation),
        ("constraint", options.constraint),
        ("nodes", options.nodes),
        ("ntasks-per-node", options.tasks_per_node),
        ("cpus-per-task", options.cpus_per_task),
        ("mem", slurm_mem(options.mem)),  # Slurm's own words: 1600GB → 1600G, the card's allocation
        ("gres", f"gpu:{options.gpus_per_node}" if options.gpus_per_node else None),
        ("time", slurm_time(options.time_seconds)),
        ("exclude", ",".join(options.exclude) or None),
        ("output", log_path),
        ("open-mode", "append"),
        ("requeue", True),
        ("signal", f"B:USR1@{options.signal_lead_s}"),
        ("hold", options.hold),
        ("dependency", _dependency(options.dependency)),
        ("kill-on-invalid-dep", "yes" if options.kill_on_invalid_dep else None),
    ]
    lines = ["#SBATCH --" + name + ("" if value is True else f"={value}")
             for name, value in directives if value is not None and value is not False]
    return lines


# Slurm's --dependency grammar (job ids, array tasks, +minutes; "," all of, "?" any of): the controller
# job and the eval jobs write theirs through this one pattern, and anything else could add to the header.
DEPENDENCY = re.compile(r"^(after|afterany|afterok|afternotok|aftercorr|afterburstbuffer)(:[0-9]{1,12}(_[0-9]{1,8})?(\+[0-9]{1,6})?)+"
                        r"([,?](after|afterany|afterok|afternotok|aftercorr|afterburstbuffer)(:[0-9]{1,12}(_[0-9]{1,8})?(\+[0-9]{1,6})?)+)*$"
                        r"|^singleton$")


def _dependency(value: str | None) -> str | None:
    """``--dependency`` as Slurm spells it (``afterok:123``); anything else could add to the header."""
    if value is not None and not DEPENDENCY.fullmatch(value):
        raise _bad(f"{value!r} is not a Slurm dependency", "--dependency", "command line",
                   "e.g. afterok:1234 or afterany:12:13")
    return value


def _entry_lines(options: JobOptions, ctx: RenderContext, env: dict[str, str]) -> str:
    """The launch line: the entry under the launcher, in the background (the script waits on it and
    forwards signals). A command line runs from the snapshot's copy of the first code root, its words
    quoted one by one."""
    q = shlex.quote
    words = entry_words(options.entry)
    if options.build:
        # The build job runs once, in the batch shell; it starts the builder ranks as one srun step itself.
        return fill("launch_build", {"python": q(ctx.python), "entry": options.entry, "build_args": _build_args(options)})
    if options.eval_step is not None:
        # One evaluation process in the batch shell: rank 0's work in training, so no srun ranks.
        return fill("launch_eval", {"python": q(ctx.python), "entry": options.entry, "step": int(options.eval_step)})
    if words is None:
        return fill("launch_module", {"python": q(ctx.python), "entry": options.entry})
    roots = [r for r in env.get(contract.ENV_CODE_ROOTS, "").split(os.pathsep) if r]
    where = roots[0] if roots else str(ctx.repo_root)
    return fill("launch_command", {"entry_shown": _comment(options.entry), "where": q(where),
                                   "words": " ".join(q(w) for w in words)})


def _snapshot_lines(env: dict[str, str], ctx: RenderContext) -> str:
    """A job runs the code it was admitted for: the snapshot comes first on every process's import path
    (an editable install would otherwise pull the live tree back in), and its digest and the Python
    environment are checked before the node guard and stage-in spend any time."""
    if contract.ENV_SNAPSHOT not in env:
        return fill("code_live_tree", {})
    q = shlex.quote
    roots = [r for r in env.get(contract.ENV_CODE_ROOTS, "").split(os.pathsep) if r]
    return fill("code_snapshot", {"code_version": env[contract.ENV_CODE_VERSION], "python": q(ctx.python),
                                  "import_path": q(os.pathsep.join([str(ctx.repo_root), *roots]))})


def _build_args(options: JobOptions) -> str:
    """`` --mode M --processes N`` for a build job: one builder rank per device (GPU, or CPU rank) on every node."""
    if not options.build:
        return ""
    return f" --mode {options.build} --processes {options.nodes * options.ranks_per_node}"


def _guard_lines(resolved: ResolvedSpec, options: JobOptions, ctx: RenderContext) -> str:
    """``node_guard PHASE [ARGS]``: trainers.node_guard on every node with the needs computed here
    (shm from the preflight's arithmetic, GPUs from the request); an unfit node ends the job with
    ``EXIT_NODE_UNFIT`` and the marker line the classifier reads as ``node_unfit``."""

    shm_need = need_bytes(resolved.spec)
    return fill("node_guard", {"python": shlex.quote(ctx.python), "shm_need": shm_need, "shm_need_shown": f"{shm_need:,}",
                               "gpus": options.gpus_per_node})


def _guard_stage_args(resolved: ResolvedSpec, options: JobOptions, ctx: RenderContext) -> str:
    """The stage phase also checks the cache mount (when stage-in or the trainer reads it: another
    ``--entry``, such as the tests' stand-ins, may read no cache) and scratch against stage-in bytes."""
    spec, q = resolved.spec, shlex.quote
    args = ""
    if spec.stage.enabled or options.entry == DEFAULT_ENTRY:
        args += f" --cache-root {q(str(check_shell_path(spec.data.cache_root, 'data.cache_root', str(resolved.path))))}"
    if spec.stage.enabled and ctx.stage_bytes is not None and options.eval_step is None:  # an eval job stages none
        dest, _ = stage_dest_word(spec.stage.dest, str(resolved.path))
        layers, model = spec_identity(spec.stage.layers, spec.data)
        args += (f" --stage-dest {dest} --stage-bytes {int(ctx.stage_bytes)}"
                 f" --stage-layers {q(layers)} --stage-model {q(model)}")
    return args


def _stage_where(dest: str, spec_file: str) -> str:
    """For a ``stage.dest`` the node names: the check that its variable is set there, before the node guard
    and stage-in use it (an unset one would stage to ``/idm`` at the root); empty for a plain path."""
    _, variable = stage_dest_word(dest, spec_file)
    return fill("stage_dest_on_node", {"variable": variable}) if variable else ""


def _comment(text: str) -> str:
    """One comment line: no newline or control character can end it early."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", text)


def _multi_node_env(options: JobOptions) -> str:
    """Rendezvous for ``nodes > 1``: rank 0's host (first of the allocation) and a port from the job id,
    as Fabric's SLURMEnvironment derives them, exported so every rank and the log agree on them."""
    if options.nodes <= 1:
        return ""
    return fill("rendezvous", {"nodes": options.nodes, "ranks_per_node": options.ranks_per_node,
                               "world": options.nodes * options.ranks_per_node})


def _stage_block(enabled: bool, cache_root: str, dest: str, spec_file: str, *, routed_blocks: list[int] | None = None,
                 suffix: str = ".pt", python: str = "python3", model: str = "", wait_s: float = REPLACE_WAIT_S) -> str:
    """Stage-in as a shell function run once on every node of the job (each node reads its own copy):
    under Slurm with more than one node through one ``srun`` task per node, else in the batch shell.
    A lock serialises copies that land on the same disk (nodes sharing a host, as n1/n2 here); the job holds
    a shared lock on its own file under ``<dest>.users`` for its whole life, and a replace waits ``wait_s``
    for the other jobs holding theirs, then fails naming them (``ground.stage``).
    ``routed_blocks`` (stage.layers: routed) copies only the selected blocks, as exact reads written
    to verified safetensors; a copy cut by a preemption resumes (finished files are kept).
    The copy is keyed (``ground.stage``: source, layer set, ``model`` identity, files): a copy of
    another key at ``dest`` is removed and copied again, never reused."""
    if not enabled:
        return fill("stage_in_disabled", {})
    src_path = check_shell_path(cache_root, "data.cache_root", spec_file)
    dest_word, _ = stage_dest_word(dest, spec_file)
    q = shlex.quote
    if routed_blocks is None:
        tool, copy = "cp", fill("stage_copy_all", {})
    else:
        tool, copy = "cache.convert", fill("stage_copy_routed", {"python": q(python), "suffix": suffix,
                                                                  "blocks": ",".join(str(b) for b in routed_blocks)})
    return fill("stage_in", {**CONTRACT_SLOTS, "stage_src": q(str(src_path)), "stage_dest": dest_word,
                             "stage_layers": q(layer_set(routed_blocks)), "stage_model": q(model),
                             "python": q(python), "stage_copy": copy, "stage_tool": tool, "stage_wait": f"{wait_s:g}"})

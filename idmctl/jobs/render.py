"""Render one sbatch script from a resolved spec plus command-line overrides.

Every value that lands in the script is validated against a strict pattern or shell-quoted, so a job
name, QoS, node list or path carrying a newline, ``;``, ``$(`` or a backtick cannot add a line to the
``#SBATCH`` header or a command to the body: such input is a UserError (exit 2), never a script.
The same script runs under Slurm (``srun`` launches the ranks) and under the local executor.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ground import contract
from ground.errors import UserError
from ground.paths import REPO_ROOT, expand_path
from ground.spec.loader import ResolvedSpec
from ground.stage import layer_set, model_identity, spec_identity
from ground.spec.schema import MAX_COUNT, NODE_LIST, SLURM_NAME, check_job_mem, check_job_time
from ground.units import parse_bytes, parse_duration, slurm_time


_NAME = re.compile(SLURM_NAME)
_NODE_LIST = re.compile(NODE_LIST)
_SBATCH_PATH = re.compile(r"^/[A-Za-z0-9._/+@%=-]{1,4000}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_GRES = re.compile(r"^gpu:(\d{1,3})$")
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f`$;|&<>\\'\"]")
DEFAULT_ENTRY = contract.DEFAULT_ENTRY


@dataclass(frozen=True)
class JobOptions:
    """What one submission asks for: the spec's defaults after flags overrode them (stored in Job.options_json)."""

    job_name: str
    """``-J``; the spec's ``resources.job_name`` or the experiment name."""
    qos: str
    """``--qos``."""
    partition: str | None
    """``--partition``; None lets the cluster pick."""
    nodes: int
    """``--nodes``."""
    ranks_per_node: int
    """``--ntasks-per-node``: one rank per GPU, or ``cpu_ranks`` on CPU."""
    cpus_per_node: int
    """CPUs per node; each rank gets ``cpus_per_node // ranks_per_node`` (at least 1)."""
    mem: str
    """Memory per node as written (e.g. ``4GB``)."""
    gpus_per_node: int
    """``--gres=gpu:N``; 0 asks for none."""
    time_limit: str | None
    """Wall-clock limit as written; None until :func:`idmctl.preflight.limits.job_limits` derives it."""
    exclude: list[str] = field(default_factory=list)
    """Nodes to avoid (flag, spec, and active node exclusions)."""
    retries: int = 0
    """Resubmissions allowed for retryable causes."""
    entry: str = DEFAULT_ENTRY
    """A Python module started with ``python -m ENTRY --run-dir RUN_DIR``, or a command line (the team's
    launch script) run from the snapshot's copy of the first code root (``--entry``, else ``code.entry``)."""
    hang_k: float = 10.0
    """The watchdog's k, floor and poll (the cluster profile's ``hang:``, kept so a resubmit uses the same)."""
    hang_floor_s: float = 600.0
    hang_poll_s: float = 30.0
    signal_lead: int | None = None
    """Seconds of USR1 warning; derived from measured step + checkpoint write time (or the spec's)."""
    checkpoint_every: int | None = None
    """Derived steps between checkpoints, passed as IDMCTL_CHECKPOINT_EVERY when the spec sets none."""
    derivation: list[str] = field(default_factory=list)
    """How the limits were derived, one line each: printed as comments at the top of the script."""
    hold: bool = False
    """``--hold``: submitted held (``#SBATCH --hold``) until ``scontrol release``; a resubmission is never held."""
    build: str | None = None
    """``--build MODE``: a cache build job (``contract.BUILD_ENTRY``) in the batch shell, starting one
    builder rank per srun task (``ranks_per_node`` per node, over ``nodes``); None for training."""

    @property
    def cpus_per_task(self) -> int:
        return max(1, self.cpus_per_node // self.ranks_per_node)

    @property
    def mem_mib(self) -> int:
        # Slurm's M suffix is MiB; round up so the job never gets less than the spec asked for.
        return math.ceil(parse_bytes(self.mem) / 2**20)

    @property
    def time_seconds(self) -> float:
        if self.time_limit is None:
            raise UserError("no time limit: none in the spec or flags, and none derived", field="resources.time_limit",
                            hint="set resources.time_limit or pass --time")
        return parse_duration(self.time_limit)

    @property
    def signal_lead_s(self) -> int:
        """Seconds before the time limit the batch shell gets USR1 (Slurm may send it up to 60 s earlier):
        the derived lead when there is one, else 5% of the limit within [60 s, 600 s]."""
        if self.signal_lead is not None:
            return int(self.signal_lead)
        return int(min(600, max(60, self.time_seconds * 0.05)))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def check_sbatch_path(path: Path, field_name: str, source: str) -> str:
    """A path in an ``#SBATCH`` line: sbatch does not quote, so only a conservative charset passes."""
    text = str(path)
    if not _SBATCH_PATH.fullmatch(text):
        raise _bad(f"{text!r} is not usable in an #SBATCH line", field_name, source,
                   "use an absolute path of letters, digits and ._/+@%=- (set IDMCTL_HOME accordingly)")
    return text


def parse_gres(value: str) -> int:
    match = _GRES.fullmatch(value)
    if not match:
        raise UserError(f"{value!r} is not gpu:N", file="--gres", hint="e.g. --gres gpu:8")
    return int(match.group(1))


def resolve_options(resolved: ResolvedSpec, overrides: dict[str, Any]) -> JobOptions:
    """Spec defaults, then every non-None flag in ``overrides``; each value validated where it came from."""
    res = resolved.spec.resources
    spec_file = str(resolved.path)

    def source(flag: str, spec_field: str) -> tuple[str, str]:
        return ("command line", flag) if overrides.get(flag) is not None else (spec_file, spec_field)

    def flag(name: str, default: Any) -> Any:
        # `is not None`, not `or`: `-c 0` or `-J ""` is a value to check, never a silent fall-back.
        return overrides[name] if overrides.get(name) is not None else default

    gpus = parse_gres(overrides["--gres"]) if overrides.get("--gres") is not None else res.gpus_per_node
    build = overrides.get("--build")
    if build is not None:
        if build not in contract.BUILD_MODES:
            raise UserError(f"unknown build {build!r}", file="command line", field="--build",
                            hint=f"one of {', '.join(contract.BUILD_MODES)}")
        if overrides.get("--entry") is not None:
            raise UserError("--build runs the build entry; --entry does not go with it", file="command line",
                            field="--entry", hint="drop --entry")
    options = JobOptions(
        job_name=flag("-J", f"{resolved.name}-build-{build}" if build else res.job_name or resolved.name),
        qos=flag("--qos", res.qos),
        partition=res.partition,
        nodes=res.nodes,
        ranks_per_node=gpus if gpus > 0 else res.cpu_ranks,
        cpus_per_node=flag("-c", res.cpus),
        mem=flag("--mem", res.mem),
        gpus_per_node=gpus,
        time_limit=flag("--time", res.time_limit),
        exclude=list(flag("--exclude", res.exclude)),
        retries=flag("--retries", res.retries),
        entry=contract.BUILD_ENTRY if build else flag("--entry", resolved.spec.code.entry or DEFAULT_ENTRY),
        hold=bool(overrides.get("--hold")),
        build=build,
    )
    check_name(options.job_name, *reversed(source("-J", "resources.job_name")))
    check_name(options.qos, *reversed(source("--qos", "resources.qos")))
    if options.partition is not None:
        check_name(options.partition, "resources.partition", spec_file)
    check_nodes(options.exclude, *reversed(source("--exclude", "resources.exclude")))
    check_entry(options.entry, *source("--entry", "code.entry"))
    for name, spec_field, check in (("--mem", "resources.mem", check_job_mem), ("--time", "resources.time_limit", check_job_time)):
        value = overrides.get(name)
        if value is not None:
            try:
                check(value)
            except ValueError as exc:
                raise UserError(str(exc), file="command line", field=name, hint=f"same format as {spec_field}") from exc
    if options.cpus_per_node < 1:
        raise UserError("must be at least 1", file="command line", field="-c", hint="CPUs per node")
    if options.cpus_per_node > MAX_COUNT:
        raise UserError(f"{options.cpus_per_node} is more CPUs than any node has", file="command line", field="-c",
                        hint="CPUs per node")
    if not 0 <= options.retries <= 1_000:
        raise UserError("must be 0 … 1000", file="command line", field="--retries", hint="resubmission budget")
    return options


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


def render_script(resolved: ResolvedSpec, options: JobOptions, ctx: RenderContext) -> str:
    """The batch script: #SBATCH header, stage-in, then the trainer under srun with USR1 forwarding."""
    spec = resolved.spec
    spec_file = str(resolved.path)
    log_path = check_sbatch_path(Path(ctx.log_path), "log path", contract.ENV_HOME)
    for name, value in ((contract.ENV_HOME, ctx.idmctl_home), ("run dir", ctx.run_dir),
                        ("python", Path(ctx.python)), ("repository", ctx.repo_root)):
        check_shell_path(str(value), name, "environment")
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={options.job_name}",
        f"#SBATCH --qos={options.qos}",
        *([f"#SBATCH --partition={options.partition}"] if options.partition else []),
        f"#SBATCH --nodes={options.nodes}",
        f"#SBATCH --ntasks-per-node={options.ranks_per_node}",
        f"#SBATCH --cpus-per-task={options.cpus_per_task}",
        f"#SBATCH --mem={options.mem_mib}M",
        *([f"#SBATCH --gres=gpu:{options.gpus_per_node}"] if options.gpus_per_node else []),
        f"#SBATCH --time={slurm_time(options.time_seconds)}",
        *([f"#SBATCH --exclude={','.join(options.exclude)}"] if options.exclude else []),
        f"#SBATCH --output={log_path}",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:USR1@{options.signal_lead_s}",
        *(["#SBATCH --hold"] if options.hold else []),
        *(f"# idmctl: {_comment(line)}" for line in options.derivation),
    ]
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
        **ctx.extra_env,
    }
    for key, value in env.items():
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise UserError(f"{key!r} is not an environment variable name", field="env")
    if options.build:
        stage = "# stage-in: none (a build job writes the cache)"
    else:
        stage = _stage_block(spec.stage.enabled, spec.data.cache_root, spec.stage.dest, spec_file,
                             routed_blocks=spec.data.selected_blocks if spec.stage.layers == "routed" else None,
                             suffix=".pt" if spec.data.cache_format == "legacy_pt" else ".safetensors",
                             python=ctx.python, model=model_identity(spec.data))
    q = shlex.quote
    guard = _guard_lines(resolved, options, ctx)
    body = [
        "set -uo pipefail",
        *(f"export {key}={q(value)}" for key, value in env.items()),
        f"RUN_DIR={q(str(ctx.run_dir))}",
        f"cd {q(str(ctx.repo_root))} || exit 1",
        f'echo "idmctl: job ${{SLURM_JOB_ID:-local}} chain ${contract.ENV_CHAIN_ID} attempt ${contract.ENV_ATTEMPT}'
        ' restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"',
        *_snapshot_lines(env, ctx),
        "",
        *guard,
        "node_guard stage" + _guard_stage_args(resolved, options, ctx),
        "",
        stage,
        "node_guard train",
        "",
        "# Ranks: srun under Slurm (Fabric reads SLURM_* and needs ntasks-per-node == devices);",
        "# the local executor runs the same script without srun.",
        *_multi_node_env(options),
        'if [ -n "${SLURM_JOB_ID:-}" ]; then LAUNCH=(srun --kill-on-bad-exit=1); else LAUNCH=(); fi',
        *_entry_lines(options, ctx, env),
        "TRAINER=$!",
        "# The hang watchdog: stacks of every rank, then kill, when the heartbeat stops (trainers/watchdog.py).",
        f'{q(ctx.python)} -m trainers.watchdog --run-dir "$RUN_DIR" --trainer-pid "$TRAINER" --k {options.hang_k:g} '
        f'--floor {options.hang_floor_s:g} --poll {options.hang_poll_s:g} &',
        "WATCHDOG=$!",
        "# USR1 arrives before preemption or the time limit: pass it on so the trainer checkpoints, and",
        "# requeue afterwards. TERM alone is scancel (or a kill): checkpoint, but never requeue a cancel.",
        "REQUEUE_WANTED=0",
        'notice() { echo "idmctl: $1 received, asking the trainer to checkpoint"; kill -USR1 "$TRAINER" 2>/dev/null; }',
        "trap 'REQUEUE_WANTED=1; notice USR1' USR1",
        "trap 'notice TERM' TERM",
        "while true; do",
        '  wait "$TRAINER"; STATUS=$?',
        '  kill -0 "$TRAINER" 2>/dev/null || break  # wait was interrupted by a signal, not the exit',
        "done",
        'kill "$WATCHDOG" 2>/dev/null; wait "$WATCHDOG"; WATCHED=$?',
        f'if [ "$WATCHED" -eq {contract.EXIT_HANG} ]; then STATUS={contract.EXIT_HANG}; fi  # the watchdog killed a hung trainer',
        f'if [ "$STATUS" -eq {contract.EXIT_REQUEUE} ] && [ "$REQUEUE_WANTED" -eq 1 ]; then',
        '  echo "idmctl: trainer checkpointed and asked to be requeued"',
        '  if [ -n "${SLURM_JOB_ID:-}" ]; then',
        "    # A preempted job that exits by itself is not requeued by Slurm: requeue ourselves (slurm-notes 4).",
        '    if scontrol requeue "$SLURM_JOB_ID"; then sleep 60; else',
        "      # A cluster whose preemption cancels may refuse it: sync resubmits the chain (taxonomy: preempted).",
        f'      echo "{contract.REQUEUE_REFUSED}: sync resubmits the chain"',
        "    fi",
        "  fi",
        "fi",
        'echo "idmctl: trainer exited $STATUS at $(date -Is)"',
        'exit "$STATUS"',
    ]
    return "\n".join([*header, *body]) + "\n"


def _entry_lines(options: JobOptions, ctx: RenderContext, env: dict[str, str]) -> list[str]:
    """The entry under the launcher, in the background (the script waits on it and forwards signals). A
    command line runs from the snapshot's copy of the first code root, its words quoted one by one."""
    q = shlex.quote
    words = entry_words(options.entry)
    if options.build:
        # The build job runs once, in this shell; it starts the builder ranks as one srun step itself.
        return [f'{q(ctx.python)} -m {options.entry} --run-dir "$RUN_DIR"{_build_args(options)} &']
    if words is None:
        return [f'"${{LAUNCH[@]}}" {q(ctx.python)} -m {options.entry} --run-dir "$RUN_DIR" &']
    roots = [r for r in env.get(contract.ENV_CODE_ROOTS, "").split(os.pathsep) if r]
    where = roots[0] if roots else str(ctx.repo_root)
    return [f"# entry: {_comment(options.entry)} (the entry contract: IDMCTL_RUN_DIR, one IDMCTL_STEP line per step)",
            f'(cd {q(where)} && exec "${{LAUNCH[@]}}" {" ".join(q(w) for w in words)}) &']


def _snapshot_lines(env: dict[str, str], ctx: RenderContext) -> list[str]:
    """A job runs the code it was admitted for: the snapshot comes first on every process's import path
    (an editable install would otherwise pull the live tree back in), and its digest and the Python
    environment are checked before the node guard and stage-in spend any time."""
    if contract.ENV_SNAPSHOT not in env:
        return ["# code: the live tree (a job submitted before code snapshots)"]
    q = shlex.quote
    roots = [r for r in env.get(contract.ENV_CODE_ROOTS, "").split(os.pathsep) if r]
    return [
        f"# code: snapshot {env[contract.ENV_CODE_VERSION]}, the code the gate admitted; every attempt of the chain runs it.",
        f'export PYTHONPATH={q(os.pathsep.join([str(ctx.repo_root), *roots]))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        f"{q(ctx.python)} -m ground.code_snapshot verify || exit $?",
    ]


def _build_args(options: JobOptions) -> str:
    """`` --mode M --processes N`` for a build job: one builder rank per device (GPU, or CPU rank) on every node."""
    if not options.build:
        return ""
    return f" --mode {options.build} --processes {options.nodes * options.ranks_per_node}"


def _guard_lines(resolved: ResolvedSpec, options: JobOptions, ctx: RenderContext) -> list[str]:
    """``node_guard PHASE [ARGS]``: trainers.node_guard on every node with the needs computed here
    (shm from the preflight's arithmetic, GPUs from the request); an unfit node ends the job with
    ``EXIT_NODE_UNFIT`` and the marker line the classifier reads as ``node_unfit``."""
    from idmctl.preflight.shm import need_bytes

    shm_need = need_bytes(resolved.spec)
    q = shlex.quote
    guard = f"{q(ctx.python)} -m trainers.node_guard --shm-need {shm_need} --gpus {options.gpus_per_node}"
    return [
        f"# node guard: /dev/shm free vs the loader's {shm_need:,} B (stale segments of dead jobs are the evidence),",
        f"# scratch vs stage-in bytes, the {options.gpus_per_node} GPUs requested visible, the cache mounted; before stage-in and training.",
        "node_guard() {",
        '  if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then',
        '    srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \\',
        f'      {guard} --phase "$@"',
        "  else",
        f'    {guard} --phase "$@"',
        "  fi",
        "  local status=$?",
        '  if [ "$status" -ne 0 ]; then',
        '    echo "idmctl: node guard ($1) failed with exit $status at $(date -Is): ending the job before it runs"',
        '    exit "$status"',
        "  fi",
        "}",
    ]


def _guard_stage_args(resolved: ResolvedSpec, options: JobOptions, ctx: RenderContext) -> str:
    """The stage phase also checks the cache mount (when stage-in or the trainer reads it: another
    ``--entry``, such as the tests' stand-ins, may read no cache) and scratch against stage-in bytes."""
    spec, q = resolved.spec, shlex.quote
    args = ""
    if spec.stage.enabled or options.entry == DEFAULT_ENTRY:
        args += f" --cache-root {q(str(check_shell_path(spec.data.cache_root, 'data.cache_root', str(resolved.path))))}"
    if spec.stage.enabled and ctx.stage_bytes is not None:
        dest = check_shell_path(spec.stage.dest, "stage.dest", str(resolved.path))
        layers, model = spec_identity(spec.stage.layers, spec.data)
        args += (f" --stage-dest {q(str(dest))} --stage-bytes {int(ctx.stage_bytes)}"
                 f" --stage-layers {q(layers)} --stage-model {q(model)}")
    return args
def _comment(text: str) -> str:
    """One comment line: no newline or control character can end it early."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", text)


def _multi_node_env(options: JobOptions) -> list[str]:
    """Rendezvous for ``nodes > 1``: rank 0's host (first of the allocation) and a port from the job id,
    as Fabric's SLURMEnvironment derives them, exported so every rank and the log agree on them."""
    if options.nodes <= 1:
        return []
    return [
        f"# {options.nodes} nodes × {options.ranks_per_node} tasks: world {options.nodes * options.ranks_per_node}; "
        "rank 0's host is the allocation's first node.",
        'if [ -n "${SLURM_JOB_ID:-}" ]; then',
        '  export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        '  export MASTER_PORT="$((15000 + SLURM_JOB_ID % 10000))"  # Fabric: job id\'s last 4 digits + 15000',
        '  echo "idmctl: $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST), rendezvous $MASTER_ADDR:$MASTER_PORT"',
        "fi",
    ]


def _stage_block(enabled: bool, cache_root: str, dest: str, spec_file: str, *, routed_blocks: list[int] | None = None,
                 suffix: str = ".pt", python: str = "python3", model: str = "") -> str:
    """Stage-in as a shell function run once on every node of the job (each node reads its own copy):
    under Slurm with more than one node through one ``srun`` task per node, else in the batch shell.
    A lock serialises copies that land on the same disk (nodes sharing a host, as n1/n2 here).
    ``routed_blocks`` (stage.layers: routed) copies only the selected blocks, as exact reads written
    to verified safetensors; a copy cut by a preemption resumes (finished files are kept).
    The copy is keyed (``ground.stage``: source, layer set, ``model`` identity, files): a copy of
    another key at ``dest`` is removed and copied again, never reused."""
    if not enabled:
        return "# stage-in: disabled (stage.enabled: false); the trainer reads data.cache_root in place"
    src_path = check_shell_path(cache_root, "data.cache_root", spec_file)
    dest_path = check_shell_path(dest, "stage.dest", spec_file)
    q = shlex.quote
    tool = "cp" if routed_blocks is None else "cache.convert"
    if routed_blocks is None:
        copy = ['  echo "idmctl: stage-in on $node $STAGE_SRC -> $STAGE_DEST ($(du -sb "$STAGE_SRC" | cut -f1) bytes)"',
                '  cp -a "$STAGE_SRC/." "$STAGE_DEST/" 2>"$err"']
    else:
        blocks = ",".join(str(b) for b in routed_blocks)
        copy = [f'  echo "idmctl: stage-in on $node blocks {blocks} of $STAGE_SRC -> $STAGE_DEST (stage.layers: routed)"',
                f'  {q(python)} -m cache.convert "$STAGE_SRC" "$STAGE_DEST" '
                f'--blocks {blocks} --suffix {suffix} >/dev/null 2>"$err"']
    stage_py = f"{q(python)} -m ground.stage"
    return "\n".join([
        "# stage-in: copy the cache to each node's local disk once. The marker records what the copy is",
        "# (source, layer set, model identity, files: ground/stage.py); a copy of another key is replaced.",
        f"export STAGE_SRC={q(str(src_path))}",
        f"export STAGE_DEST={q(str(dest_path))}",
        f"export STAGE_LAYERS={q(layer_set(routed_blocks))}",
        f"export STAGE_MODEL={q(model)}",
        "export RUN_DIR",
        "stage_in() (  # a subshell: the lock is released when the copy ends, not held by the trainer",
        '  node="${SLURMD_NODENAME:-$(hostname)}"',
        '  mkdir -p "$(dirname "$STAGE_DEST")" || exit 1',
        '  exec 9>"$STAGE_DEST.lock" && flock 9',
        '  err="$RUN_DIR/stage-$node.err"',
        f'  plan="$({stage_py} prepare --source "$STAGE_SRC" --dest "$STAGE_DEST" --layers "$STAGE_LAYERS" '
        '--model "$STAGE_MODEL" 2>"$err")" || {',
        '    echo "idmctl: stage-in FAILED (ground.stage exit $?): $(tail -n 1 "$err")"; exit 1; }',
        "  case \"${plan%%$'\\t'*}\" in",
        "    staged) echo \"idmctl: stage-in skipped on $node: $STAGE_DEST already holds ${plan#*$'\\t'}\"; exit 0 ;;",
        "    replace) echo \"idmctl: stage-in on $node replaces the copy at $STAGE_DEST: ${plan#*$'\\t'}\" ;;",
        "    resume) echo \"idmctl: stage-in on $node resumes the unfinished copy at $STAGE_DEST\" ;;",
        "  esac",
        *copy,
        "  status=$?",
        '  if [ "$status" -ne 0 ]; then',
        f'    echo "idmctl: stage-in FAILED ({tool} exit $status): $(tail -n 1 "$err");'
        ' free on $STAGE_DEST: $(df -B1 --output=avail "$STAGE_DEST" | tail -n 1) bytes"',
        "    exit 1",
        "  fi",
        f'  {stage_py} commit --dest "$STAGE_DEST" 2>"$err" || {{',
        '    echo "idmctl: stage-in FAILED (ground.stage commit exit $?): $(tail -n 1 "$err")"; exit 1; }',
        '  echo "idmctl: stage-in done on $node"',
        ")",
        'if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then',
        '  srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \\',
        '    bash -c "$(declare -f stage_in); stage_in" || exit 1',
        "else",
        "  stage_in || exit 1",
        "fi",
        f'export {contract.ENV_CACHE_ROOT}="$STAGE_DEST"',
    ])

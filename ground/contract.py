"""The job↔trainer contract: what a job script, a trainer and ``idmctl sync`` agree on.

Every exit status, ``IDMCTL_*`` environment variable and run-directory file name that crosses the
boundary between the control plane (which renders and submits the job) and the data plane (which
runs inside it) is named here once.
"""

from __future__ import annotations


# Exit statuses of a trainer / job entry.
EXIT_OK = 0
EXIT_NAN = 3
"""The loss went non-finite: the trainer wrote ``failure.json`` and kept no checkpoint of the bad step."""
EXIT_REQUEUE = 75
"""EX_TEMPFAIL: interrupted by SIGUSR1/SIGTERM after checkpointing; the job script requeues itself."""
EXIT_NODE_UNFIT = 78
"""EX_CONFIG: the node guard (``trainers.node_guard``) found the node unfit before stage-in or training."""
EXIT_HANG = 79
"""The job script's watchdog killed a trainer whose heartbeat stopped (stacks dumped first)."""
EXIT_CODE_MISMATCH = 65
"""EX_DATAERR: the job's code snapshot or Python environment is not what submit admitted (``ground.code_snapshot``)."""

# Environment variables. Set by the job script (rendered by idmctl/job/render.py):
ENV_HOME = "IDMCTL_HOME"
ENV_CHAIN_ID = "IDMCTL_CHAIN_ID"
ENV_ATTEMPT = "IDMCTL_ATTEMPT"
ENV_SPEC_HASH = "IDMCTL_SPEC_HASH"
ENV_CODE_VERSION = "IDMCTL_CODE_VERSION"
"""The digest of the code snapshot the job was admitted for (``ground.code_snapshot``)."""
ENV_SNAPSHOT = "IDMCTL_SNAPSHOT"
"""The snapshot directory the job script runs from; the trainer checks its digest and its imports against it."""
ENV_CODE_STORE = "IDMCTL_CODE_STORE"
"""The code store holding the snapshots and the environment records (``$IDMCTL_HOME/code`` unless the profile names one)."""
ENV_CODE_ROOTS = "IDMCTL_CODE_ROOTS"
"""The snapshot's copies of the spec's ``code.roots`` (``os.pathsep``-separated): class paths resolve there."""
ENV_ENV_DIGEST = "IDMCTL_ENV_DIGEST"
"""The digest of the Python environment at submit; a job whose environment differs stops (``env_changed``)."""
ENV_RETRY_REASON = "IDMCTL_RETRY_REASON"
"""Why sync resubmitted this attempt (the failure cause of the previous one)."""
ENV_ROLLBACK = "IDMCTL_ROLLBACK"
"""``1`` on the one resubmission a chain gets after a NaN: resume from the last good checkpoint past it."""
ENV_CACHE_ROOT = "IDMCTL_CACHE_ROOT"
"""Overrides ``data.cache_root`` in the trainer (the staged copy on node-local disk); not in the spec hash."""
ENV_LOADER_DIRECT = "IDMCTL_LOADER_DIRECT"
"""``1``: the trainer's batch loader reads the cache around the page cache (O_DIRECT), as the plan chose
(``idmctl.plan.page_cache.CacheFigures.reads_direct``) and counted in the step's data time; unset: the page cache."""
ENV_CHECKPOINT_EVERY = "IDMCTL_CHECKPOINT_EVERY"
"""Steps between checkpoints derived at submit (``idmctl.plan.limits``) when the spec leaves
``train.checkpoint_every`` unset; a value in the spec wins."""
ENV_LOCAL_JOB_ID = "IDMCTL_LOCAL_JOB_ID"
"""The local executor's job id (what ``SLURM_JOB_ID`` is under Slurm)."""
ENV_SHM_DIR = "IDMCTL_SHM_DIR"
"""Where the node guard looks for shared-memory segments (default ``/dev/shm``); tests point it at a small
tmpfs, ``{node}`` standing for the node's name (the test cluster's nodes share one host)."""
# The entry contract: what any job entry (idmctl's trainer, or the team's own module or launch script)
# is given and reports. Plain variables and stdout lines, so an entry needs no idmctl import.
ENV_RUN_DIR = "IDMCTL_RUN_DIR"
"""The run directory: ``spec.json`` inside; the entry writes its checkpoints here and resumes from the newest."""
ENV_SMOKE_STEPS = "IDMCTL_SMOKE_STEPS"
"""Set only by the preflight's smoke: run exactly this many optimizer steps, report each, and exit 0."""
ENV_SMOKE_BATCH = "IDMCTL_SMOKE_BATCH"
"""Set only by the smoke: the per-device batch size to use for those steps."""
ENV_NPROC_PER_NODE = "IDMCTL_NPROC_PER_NODE"
"""Set for an entry started once per node (``code.launch: per_node``): the ranks it starts on its node, one per
GPU (``torchrun --nproc_per_node "$IDMCTL_NPROC_PER_NODE"``); the smoke sets 1, its one GPU."""
ENV_NNODES = "IDMCTL_NNODES"
"""Set with ``IDMCTL_NPROC_PER_NODE``: the nodes of the job (``torchrun --nnodes``)."""
STEP_MARKER = "IDMCTL_STEP"
"""One stdout line per optimizer step: ``IDMCTL_STEP step=<int> loss=<float> seconds=<float>
[peak_mem_bytes=<int>]`` (``trainers.entry_helper.Reporter.step`` prints it). The smoke's step time,
losses and peak memory come from these lines."""
PHASE_MARKER = "IDMCTL_PHASE"
"""Optional, once: ``IDMCTL_PHASE dataset_s=<float> sample_s=<float> model_s=<float>`` (build times)."""
CHECKPOINT_MARKER = "IDMCTL_CHECKPOINT"
"""Optional, per checkpoint: ``IDMCTL_CHECKPOINT seconds=<float> bytes=<int>`` (what the signal lead covers)."""
EVENT_MARKER = "IDMCTL_EVENT"
"""One stderr line per thing the trainer noticed and acted on, e.g. ``IDMCTL_EVENT event=checkpoint_corrupt
step=12 file=… reason=sha256 expected=… found=… moved_to=…`` (``ground.run_events.event_line``; values
shell-quoted). The same event is a JSON line of ``EVENTS_FILE``."""
# Read by the control plane from the user's shell:
ENV_CLUSTER = "IDMCTL_CLUSTER"
ENV_EXPERIMENTS = "IDMCTL_EXPERIMENTS"
ENV_DB_URL = "IDMCTL_DB_URL"
"""``postgresql://user:password@host:port/db``: a store shared by the team instead of SQLite in ``$IDMCTL_HOME``."""
ENV_NOTIFY = "IDMCTL_NOTIFY"
"""Where chain and verdict notifications go: apprise URLs separated by spaces or commas (``json://host/hook``,
``slack://…``, ``mailto://…``, ``ntfy://…``). Set, it replaces the cluster profile's ``notify`` list; set
and empty, nothing is sent."""
# Test hooks, read by the trainer only when set:
ENV_INJECT_NAN_AT_STEP = "IDMCTL_INJECT_NAN_AT_STEP"
ENV_RANK_DIGESTS = "IDMCTL_TEST_RANK_DIGESTS"
"""When set, every rank writes ``DIR/rank_digests/rank-<k>.sha256`` of its final parameters."""

# Files in a run directory ($IDMCTL_HOME/runs/<experiment>/<chain>).
SPEC_FILE = "spec.json"
FAILURE_FILE = "failure.json"
MLFLOW_RUN_ID_FILE = "mlflow_run_id"
TRACKING_SPOOL_FILE = "tracking_spool.jsonl"
"""Every MLflow write of the chain, one JSON line each, in order, before it reaches MLflow (``ground.tracking_spool``):
what the tracking server has not taken yet waits here through an outage."""
TRACKING_SPOOL_FACTS = "tracking_spool.json"
"""The spool's facts: sent offset, records dropped (spool full) or refused, outage start, records left unflushed
when a job exited (``ground.tracking_spool.spool_status`` reads it for ``jobs show``)."""
ENV_TRACKING_SPOOL_MAX_BYTES = "IDMCTL_TRACKING_SPOOL_MAX_BYTES"
"""The spool's size limit in bytes (default ``ground.tracking_spool.MAX_BYTES``, 64 MiB)."""
PROGRESS_FILE = "progress.json"
"""Rank 0's heartbeat: step / total, recent s/step, checkpoint write time (``ground.progress``); read by
``idmctl jobs``/``watch`` for the ETA and by preflight for the step times of earlier runs."""
STACKS_SIGNAL = "USR2"
"""The signal on which every rank dumps its Python stacks (``faulthandler.register``) into the job log: the
watchdog sends it before it kills a hung job."""
TRAINER_STATS_FILE = "trainer_stats.json"
"""Rank 0's totals per run of each attempt (steps, step and data-wait seconds, peak memory, GPU utilisation;
``ground.trainer_stats``): the trainer's half of the efficiency report sync writes when a job ends."""
EVENTS_FILE = "events.jsonl"
"""Every attempt's start and checkpoint times, appended (``ground.run_events``); read by ``idmctl ledger``."""
STAGE_MARKER = ".idmctl_staged"
"""Written into the staged cache copy on node-local disk once stage-in finished: the copy's key
(source, layer set, model identity, files; ``ground.stage``), JSON."""
STAGE_PENDING = ".idmctl_staging"
"""The key of a copy under way (``ground.stage``): renamed to ``STAGE_MARKER`` when it finishes."""

REQUEUE_REFUSED = "idmctl: requeue refused by the cluster"
"""The job script's line when the trainer checkpointed on the preemption notice but ``scontrol
requeue`` was refused (a cluster whose preemption cancels): the taxonomy's ``preempted`` matches it."""

# The line a job script or trainer prints before failing on purpose, read by the classifier:
# ``IDMCTL_FAILURE cause=<cause> key=value ...``.
FAILURE_MARKER = "IDMCTL_FAILURE"
CAUSE_NODE_UNFIT = "node_unfit"
"""The node guard's cause: the node cannot run this job (stale /dev/shm, full scratch, missing GPUs or cache)."""
CAUSE_HANG = "hang"
"""The watchdog's cause: the trainer's heartbeat stopped for longer than the cluster's hang threshold."""
CAUSE_NAN_LOSS = "nan_loss"
"""The cause the trainer reports for a non-finite loss (marker line, ``failure.json``, MLflow tag): a cause
name of idmctl/ops/failures/taxonomy.yaml, whose ``action`` decides what sync does (a test checks the name)."""
CAUSE_ENV_CHANGED = "env_changed"
"""The job's Python environment (interpreter, installed distributions) differs from the one recorded at submit."""
CAUSE_SNAPSHOT_MODIFIED = "snapshot_modified"
"""The job's code snapshot was edited after submit, or a module of a code root was imported from outside it."""
CAUSE_DISK_FULL = "disk_full"
"""A job's own output (cache files, checkpoints) hit ENOSPC: the builders print it with the path."""
CAUSE_MISSING_WEIGHTS = "missing_weights"
"""A build job found no model weights where the spec points (checked before any process starts)."""
CAUSE_PT_NORM_MISSING = "pt_norm_missing"
"""An FF build with point maps found no PT norm file: FF runs after PT (card B)."""

DEFAULT_ENTRY = "trainers.train"
"""What a job runs unless the spec's ``code.entry`` or ``--entry`` names another: idmctl's trainer."""

# Cache builds as jobs (``idmctl submit EXP --build MODE``): the entry the job script starts, and the modes.
BUILD_ENTRY = "trainers.build_job"
BUILD_MODES = ("hidden", "rgb", "pt", "ff")
"""``hidden``: the Cosmos hidden-state cache; ``rgb``/``pt``/``ff``: one slot of card B's latent cache."""

# Evaluation jobs (``idmctl submit EXP --eval last|STEP|each``): the entry that evaluates one checkpoint.
EVAL_ENTRY = "trainers.eval_job"
EVAL_CHOICES = ("last", "each")
"""``--eval``: the final checkpoint, every scheduled one (``checkpoint_every`` and the last), or a step number."""

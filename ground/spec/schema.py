"""The typed experiment spec. Unknown keys are errors; values that can be derived are not fields.

Derived values live as properties here (``routing_n``, ``persistent_workers``, ``grad_accum``...),
so the trainer, preflight and the sbatch renderer all compute them the same way.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ground.units import parse_duration, parse_slurm_mem


# Upper bounds are sanity guards, far above any run on the cards: a 1 KB spec with `depth: 1e12` grew
# preflight and `model summary` past 4.6 GB before anything checked it. Real runs use
# depth 12, hidden 1024, 5120 channels, 27×48 tokens, 24 frames, 60,000 steps.
MAX_WIDTH = 65_536
MAX_DEPTH = 1_024
MAX_COUNT = 1_000_000
MAX_STEPS = 1_000_000_000
MAX_FILES = 10_000_000
"""Cache files (one per episode): RoboCasa's largest sets are ~100k episodes; ten million files in one
directory is past what a filesystem lists in reasonable time (``cache_files: 1e30`` was accepted)."""
MAX_KEEP_LAST = 1_000
"""Checkpoints kept: a thousand copies of the model is past any disk quota (a typo of a step count)."""
MAX_LR = 10.0
"""AdamW learning rates in use are 1e-6 … 1e-2; above 1 is already odd (preflight WARNs, with the value),
above 10 no run trains: ``lr: 3.0e3`` (a typo of 3.0e-3) and ``1e308`` passed before."""
MAX_WEIGHT_DECAY = 10.0
"""AdamW decay multiplies the weights by ``1 - lr·wd`` each step: typical 0 … 0.1, above 1 is odd (WARN),
above 10 is a typo."""
ODD_ABOVE = {"lr": 1.0, "weight_decay": 1.0}
"""``train`` values inside their domain that no real run uses: preflight's spec check WARNs with the value."""
MAX_SIGNAL_LEAD_S = 65_535
"""Slurm's ``--signal=…@sig_time`` takes 0 … 65535 seconds (about 18 h): a 1e23-day lead rendered
``--signal=B:USR1@8.6e27``, which sbatch refuses."""
MAX_JOB_MEM = 64 * 2**40
"""Memory per node: the largest nodes have a few TiB; 64 TiB is past any of them (Slurm takes MiB)."""
MAX_DEPTH_M = 1_000.0
"""``pt_max_depth``: the far plane of a depth camera in metres; robot scenes are a few metres."""
MAX_POINT_M = 10_000.0
"""A point-map mean or std in metres: a scene is metres across; 10 km is a typo."""

SLURM_NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}"
"""A job name, QoS or partition that is safe in an ``#SBATCH`` line (matched against the whole value)."""
NODE_LIST = r"[A-Za-z0-9._\-\[\],]{1,1024}"
"""A Slurm host name or host list (``worker-5``, ``n[1-2]``)."""
CONSTRAINT = r"[A-Za-z0-9_.:*\-&|!\[\](),]{1,512}"
"""A Slurm ``--constraint`` feature expression (``h100``, ``a100&ib``, ``[rack1|rack2]``): no space, quote or
newline, so it stays one ``#SBATCH`` word."""
LAUNCH_MODES = ("per_rank", "per_node", "single")
"""How an entry's processes start (``code.launch``): ``per_rank``, srun starts one task per rank (one per GPU,
or ``cpu_ranks``), each with its share of the node's CPUs; ``per_node``, srun starts the entry once per
node with all the node's GPUs and CPUs, and it starts its own ranks (torchrun, accelerate, deepspeed);
``single``, one process on one node."""
PER_NODE_LAUNCHERS = ("torchrun", "python -m torch.distributed.run", "python -m torch.distributed.launch",
                      "accelerate launch", "deepspeed")
"""Command lines that start their own ranks, one per GPU of the node they run on: ``per_node``."""

BetaParameter = Annotated[float, Field(gt=0, le=1_000)]
"""A Beta distribution's parameter: > 0; beyond 1,000 the distribution is a spike (every sample at one t)."""
Episodes = Annotated[int, Field(ge=1, le=MAX_COUNT)]
BlockId = Annotated[int, Field(ge=0, le=MAX_COUNT)]
LayerIndex = Annotated[int, Field(ge=0, le=MAX_COUNT)]
GridSide = Annotated[int, Field(ge=1, le=MAX_WIDTH)]


class Strict(BaseModel):
    # allow_inf_nan=False: `.inf`/`.nan` are never a setting (mlp_ratio: .inf crashed with OverflowError).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


CLASS_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"
"""``package.module.ClassName``: dotted identifiers only (never an expression or a file path)."""


class ClassRef(Strict):
    """A class of the team's own code, by import path, with its constructor's arguments (the
    LightningCLI / jsonargparse convention). Where a spec names a class it takes a registry name
    (``hidden_multilayer``, an alias of one of idmctl's classes) or this."""

    class_path: str = Field(pattern=CLASS_PATH, max_length=512)
    """``package.module.ClassName``; it must import from the project or one of ``code.roots``."""
    init_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the class's ``__init__``, passed exactly as written (introspection binds
    them to its signature before anything runs: card A job 6321's TypeError, in seconds)."""


def class_label(value: "str | ClassRef") -> str:
    """How a spec's class choice reads in a table: the registry name or the class path."""
    return value if isinstance(value, str) else value.class_path


class DataSpec(Strict):
    """Episodes, the multi-layer hidden-state cache, and what one sample reads from it."""

    episodes: str
    """Path of the robomimic/RoboCasa HDF5 file (``$VARS`` and ``~`` expand at use time)."""
    train_split: str = "train"
    """Name of the ``mask/<split>`` list of demos used for training; ``all`` uses every demo."""
    eval_split: str = "valid"
    """Name of the ``mask/<split>`` list of held-out demos used for evaluation."""
    cache_root: str
    """Directory of the hidden-state cache (one file per episode)."""
    cache_format: Literal["safetensors", "legacy_pt"] = "safetensors"
    """``safetensors``: idmctl's per-layer format; ``legacy_pt``: the card's bf16 ``.pt`` dict."""
    cache_files: int | None = Field(default=None, ge=1, le=MAX_FILES)
    """Expected number of cache files, for sizing stage-in when the cache is not on this machine
    (1 … :data:`MAX_FILES`)."""
    dataset: str | ClassRef = "hidden_multilayer"
    """Registry name of the dataset class the trainer builds (see ``cache/registry``), or a class of the
    team's own (``{class_path, init_args}``; the factory adds ``split``)."""
    cached_layers: list[BlockId] = Field(min_length=1, max_length=MAX_DEPTH)
    """Cosmos transformer block ids stored in each cache file, in file order."""
    frames: int = Field(ge=1, le=MAX_COUNT)
    """Frames cached per file (T)."""
    token_grid: tuple[GridSide, GridSide]
    """Spatial token grid per frame (H, W)."""
    channels: int = Field(ge=1, le=MAX_WIDTH)
    """Hidden size of the cached model (C)."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Element type of the cached hidden states."""
    vae_id: str | None = None
    """Identity of the VAE the cache must be built by, as the builder records it in every file
    (``idmctl cache inspect`` prints it), e.g. ``AutoencoderKLWan:tiny config:<16 hex> weights:tiny-seed0``.
    ``None``: not checked (legacy caches record none). Preflight's ``cache`` check FAILs on another."""
    transformer_id: str | None = None
    """Identity of the Cosmos transformer the cache must be built by (same form as ``vae_id``)."""
    models: str = "tiny"
    """What the hidden-cache builder encodes with. ``tiny``: a seeded tiny Wan VAE and Cosmos transformer
    (tests, quickstart); otherwise a local directory holding ``vae/`` and ``transformer/`` as the
    Cosmos-Predict2 repositories lay them out (``from_pretrained(local_files_only=True)``). Build jobs
    (``submit --build hidden``) and ``cache build-hidden`` read it; the build preflight checks it."""
    text_encoder: str | None = None
    """A local T5 encoder directory for the prompt embeddings when the episodes have no precomputed
    ``prompt_embeddings/``; ``None``: zeros when there are none."""
    selected_layer_indices: list[LayerIndex] = Field(min_length=1, max_length=MAX_DEPTH)
    """Indices into ``cached_layers`` that the routed model reads (N = len)."""
    frame_window: int = Field(ge=1, le=MAX_COUNT)
    """Consecutive frames read per sample (T_w)."""
    action_horizon: int = Field(ge=1, le=MAX_COUNT)
    """Actions predicted per sample (the action chunk)."""
    action_dim: int = Field(default=12, ge=1, le=MAX_WIDTH)
    """Action size; RoboCasa's is 12 (eef_pos 0:3, eef_rot 3:6, gripper 6, base 7:11, mode 11)."""

    @field_validator("token_grid")
    @classmethod
    def _positive_grid(cls, grid: tuple[int, int]) -> tuple[int, int]:
        if min(grid) < 1:
            raise ValueError("token_grid entries must be >= 1")
        return grid

    @model_validator(mode="after")
    def _selection_within_cache(self) -> "DataSpec":
        n_cached = len(self.cached_layers)
        for index in self.selected_layer_indices:
            if not 0 <= index < n_cached:
                raise ValueError(
                    f"selected_layer_indices: index {index} is outside the {n_cached} cached layers "
                    f"(valid 0..{n_cached - 1})"
                )
        if len(set(self.selected_layer_indices)) != len(self.selected_layer_indices):
            raise ValueError("selected_layer_indices: an index appears twice")
        if len(set(self.cached_layers)) != len(self.cached_layers):
            raise ValueError("cached_layers: a block id appears twice")
        if self.frame_window > self.frames:
            raise ValueError(f"frame_window: {self.frame_window} is more than the {self.frames} cached frames")
        return self

    @property
    def routing_n(self) -> int:
        """N, the number of Cosmos layers the model is routed to."""
        return len(self.selected_layer_indices)

    @property
    def selected_blocks(self) -> list[int]:
        """Cosmos block ids behind the selection (card: indices 1,4,7,10 → blocks 5,14,23,32)."""
        return [self.cached_layers[i] for i in self.selected_layer_indices]

    @property
    def dtype_bytes(self) -> int:
        return {"bfloat16": 2, "float16": 2, "float32": 4}[self.dtype]


class ModelSpec(Strict):
    """The layer-routed action DiT and its flow-matching head."""

    name: str | ClassRef = "layer_routed_dit"
    """Registry name of the model class (see ``trainers/registry``), or a class of the team's own
    (``{class_path, init_args}``, built as ``cls(**init_args)``)."""
    depth: int = Field(ge=1, le=MAX_DEPTH)
    """Number of DiT blocks (D); block i cross-attends to one routed layer."""
    hidden_dim: int = Field(ge=1, le=MAX_WIDTH)
    """Width of the DiT residual stream."""
    num_heads: int = Field(ge=1, le=MAX_WIDTH)
    """Attention heads; must divide ``hidden_dim`` and ``kv_dim``."""
    kv_dim: int = Field(ge=1, le=MAX_WIDTH)
    """Width each KV projector maps a Cosmos layer to (card: 5120 → 1024)."""
    mlp_ratio: float = Field(default=4.0, gt=0, le=64)
    """MLP hidden width as a multiple of ``hidden_dim``."""
    num_embodiments: int = Field(default=32, ge=1, le=MAX_WIDTH)
    """Embodiments the action encoder/decoder keep one weight set each for (GR00T's default, 32); their
    widths are ``hidden_dim``'s, as in GR00T."""
    timestep_dim: int = Field(default=256, ge=1, le=MAX_WIDTH)
    """Sinusoidal timestep embedding size before its MLP."""
    inference_steps: int = Field(default=4, ge=1, le=10_000)
    """Euler steps of the flow at inference (K)."""
    time_beta: tuple[BetaParameter, BetaParameter] = (1.5, 1.0)
    """Beta(a, b) of the training time t; t=0 is pure noise, t=1 the clean action. Both > 0 (a Beta's
    parameters): `[-1, 0]` once passed preflight and every sample then trained at t = 0.5."""

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelSpec":
        for field in ("hidden_dim", "kv_dim"):
            if getattr(self, field) % self.num_heads:
                raise ValueError(f"{field}: {getattr(self, field)} is not divisible by num_heads={self.num_heads}")
        return self


class LoaderSpec(Strict):
    """DataLoader settings per rank."""

    batch_size: int = Field(ge=1, le=MAX_COUNT)
    """Samples per rank per micro-step."""
    num_workers: int = Field(default=0, ge=0, le=1_024)
    """DataLoader worker processes per rank; each worker's batches pass through /dev/shm."""
    prefetch_factor: int | None = Field(default=None, ge=1, le=1_024)
    """Batches each worker prefetches; only meaningful with num_workers > 0 (torch default 2)."""
    pin_memory: bool = False
    """Pin host memory for faster H2D copies (GPU only)."""
    mmap: bool = True
    """Read cache files through mmap / byte ranges instead of loading them whole."""
    persistent_workers: bool | None = None
    """Do not set: derived as ``num_workers > 0``. Accepted only so preflight's loader check can
    diagnose legacy configs (card job 6262); any value that disagrees with the derivation FAILs."""
    repeats: int = Field(default=1, ge=1, le=MAX_COUNT)
    """Sample repeats K: each loaded sample appears K times in a micro-batch, every copy with its own
    flow noise and time. The micro-batch keeps ``batch_size`` rows (so ``train.effective_batch`` is
    unchanged) but reads only ``batch_size / K`` samples: a step reads 1/K of the bytes. The fix for
    I/O-bound runs (card A's N=12 dense: 101.9 s/step → 12.7 s/step at K=8)."""

    @model_validator(mode="after")
    def _repeats_divide(self) -> "LoaderSpec":
        if self.batch_size % self.repeats:
            raise ValueError(f"repeats: {self.repeats} does not divide batch_size {self.batch_size} "
                             f"(each micro-batch holds batch_size / repeats distinct samples)")
        return self

    @property
    def samples_per_batch(self) -> int:
        """Distinct samples a micro-batch reads (``batch_size / repeats``): the DataLoader's batch size."""
        return self.batch_size // self.repeats

    @property
    def effective_prefetch(self) -> int:
        """Batches in flight per worker, torch's default when unset."""
        if self.num_workers == 0:
            return 0
        return self.prefetch_factor if self.prefetch_factor is not None else 2

    @property
    def derived_persistent_workers(self) -> bool:
        return self.num_workers > 0


class TrainSpec(Strict):
    """Optimisation."""

    steps: int = Field(ge=1, le=MAX_STEPS)
    """Optimizer steps."""
    lr: float = Field(gt=0, le=MAX_LR)
    """Peak learning rate (AdamW): > 0 and at most :data:`MAX_LR`; above 1 preflight WARNs."""
    weight_decay: float = Field(default=0.0, ge=0, le=MAX_WEIGHT_DECAY)
    """AdamW weight decay: 0 … :data:`MAX_WEIGHT_DECAY`; above 1 preflight WARNs."""
    warmup_steps: int = Field(default=0, ge=0, le=MAX_STEPS)
    """Linear warm-up steps before cosine decay."""
    effective_batch: int = Field(ge=1, le=MAX_STEPS)
    """Samples per optimizer step over all ranks; gradient accumulation is derived from it."""
    checkpoint_every: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    """Steps between checkpoints (also written on SIGUSR1/SIGTERM). Unset: derived at submit from the
    measured step and checkpoint write times (``idmctl exp show`` prints the arithmetic)."""
    keep_last: int = Field(default=2, ge=1, le=MAX_KEEP_LAST)
    """Checkpoints kept, newest first (1 … :data:`MAX_KEEP_LAST`); older ones are deleted once a newer one is
    published. Preflight's disk check counts them at the size the smoke measured."""
    keep_best: bool = True
    """Also keep the checkpoint with the best evaluation of the goal's metric (of ``eval.metric`` without a
    goal; lower is better unless the goal says ``>``/``>=``), however old: the one to adopt may not be the last."""
    log_every: int = Field(default=10, ge=1, le=MAX_STEPS)
    """Steps between metric logs."""
    seed: int = Field(default=0, ge=0, lt=2**32)
    """Seed for weights, data order and flow noise (numpy takes 0 … 2³²−1)."""
    precision: Literal["auto", "bf16-mixed", "32-true"] = "auto"
    """``auto``: bf16-mixed on GPU, 32-true on CPU."""


class ResourcesSpec(Strict):
    """What the job asks Slurm for."""

    nodes: int = Field(default=1, ge=1, le=100_000)
    """Nodes."""
    gpus_per_node: int = Field(default=0, ge=0, le=999)
    """GPUs per node; 0 runs on CPU. Ranks per node = max(gpus_per_node, 1) unless ``cpu_ranks``."""
    cpu_ranks: int = Field(default=1, ge=1, le=MAX_WIDTH)
    """Ranks per node when ``gpus_per_node`` is 0 (CPU DDP over gloo)."""
    cpus: int = Field(default=1, ge=1, le=MAX_COUNT)
    """CPUs per node (``-c``)."""
    mem: str = "1GB"
    """Memory per node (``--mem``) as Slurm reads it: K, M, G, T are 1024-based (1600GB = 1600G = 1600 GiB,
    card A's allocation), a bare number is MiB, whole numbers only."""
    qos: str = Field(pattern=f"^{SLURM_NAME}$")
    """Quality-of-service tier, from the cluster profile."""
    partition: str | None = Field(default=None, pattern=f"^{SLURM_NAME}$")
    """Partition, when the cluster wants one besides the QoS."""
    exclude: list[Annotated[str, Field(pattern=f"^{NODE_LIST}$")]] = []
    """Nodes to avoid (``--exclude``)."""
    account: str | None = Field(default=None, pattern=f"^{SLURM_NAME}$")
    """``--account`` the job is charged to; None: the cluster profile's ``account``, else the user's default.
    The gate checks the user has an association with it granting the QoS (``sacctmgr show assoc``)."""
    constraint: str | None = Field(default=None, pattern=f"^{CONSTRAINT}$")
    """``--constraint``: node features the job needs, e.g. the GPU type (``h100``), which sets the step time;
    None: the profile's ``constraint``. ``sbatch --test-only`` at submit refuses a feature no node has."""
    reservation: str | None = Field(default=None, pattern=f"^{SLURM_NAME}$")
    """``--reservation`` to run in; None: the profile's. An ended or unknown one is refused at submit."""
    time_limit: str | None = None
    """Wall-clock limit, Slurm format (e.g. 30-00:00:00). Unset: derived from the estimated wall clock
    with a margin, capped at the QoS max wall (``idmctl exp show`` prints the arithmetic)."""
    signal_lead: str | None = None
    """How long before the time limit the job gets USR1 to checkpoint (e.g. 5:00): 1 s … 65535 s
    (:data:`MAX_SIGNAL_LEAD_S`, Slurm's range). Unset: derived from the measured step + checkpoint
    write time with a margin."""
    job_name: str | None = Field(default=None, pattern=f"^{SLURM_NAME}$")
    """``-J``; defaults to the experiment name."""
    retries: int = Field(default=0, ge=0, le=1_000)
    """Resubmissions allowed for retryable causes (preemption, node failure), like ``sbmr N``."""
    build: BuildResources | None = None
    """A cache build job's own resources (``submit --build``) where the derived ones are not wanted."""

    @field_validator("mem")
    @classmethod
    def _mem_is_size(cls, value: str) -> str:
        check_job_mem(value)
        return value

    @field_validator("time_limit", "signal_lead")
    @classmethod
    def _time_is_duration(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if info.field_name == "time_limit":
            check_job_time(value)
        else:
            seconds = parse_duration(value)
            if not math.isfinite(seconds) or seconds <= 0:
                raise ValueError(f"{value!r} is not a positive finite duration (e.g. 5:00)")
            if seconds > MAX_SIGNAL_LEAD_S:
                raise ValueError(f"{value!r} is more than Slurm's {MAX_SIGNAL_LEAD_S} s signal lead (--signal=…@0-65535)")
        return value

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node if self.gpus_per_node > 0 else self.cpu_ranks

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def mem_bytes(self) -> int:
        """As Slurm reads ``--mem`` (1024-based K/M/G/T)."""
        return parse_slurm_mem(self.mem)

    @property
    def time_limit_seconds(self) -> float | None:
        """The spec's limit; None when it is left to derivation (``idmctl.plan.limits``)."""
        return parse_duration(self.time_limit) if self.time_limit is not None else None


class StageSpec(Strict):
    """Stage-in: copy the cache to node-local disk before training."""

    enabled: bool = False
    """Copy ``data.cache_root`` to ``dest`` before training (skipped when already staged)."""
    dest: str = "/tmp/idmctl_stage"
    """Node-local directory the cache is copied to."""
    layers: Literal["all", "routed"] = "all"
    """``all``: copy the cache files as they are; ``routed``: write only the blocks the run reads
    (``data.selected_layer_indices``) as our safetensors (``python -m cache.convert``): card A's N=4
    stages 4 of 12 layers, 2.38 TB instead of 7.15 TB."""


class EvalResources(Strict):
    """What an evaluation job (``submit --eval``) asks for, where its derivation from training is not wanted."""

    cpus: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    """CPUs of the eval job; None: one training rank's share (``resources.cpus`` ÷ ranks per node)."""
    mem: str | None = None
    """Memory of the eval job, as Slurm reads it; None: one training rank's share (``resources.mem`` ÷ ranks)."""
    time_limit: str | None = None
    """Its time limit; None: 2 × what the newest COMPLETED eval job of this spec ran (at least 10 min), else the
    training job's (evaluator time unmeasured)."""

    @field_validator("mem")
    @classmethod
    def _mem_is_size(cls, value: str | None) -> str | None:
        if value is not None:
            check_job_mem(value)
        return value

    @field_validator("time_limit")
    @classmethod
    def _time_is_duration(cls, value: str | None) -> str | None:
        if value is not None:
            check_job_time(value)
        return value


class BuildResources(EvalResources):
    """What a cache build job (``submit --build``) asks for, where its derivation is not wanted."""

    cpus: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    """CPUs of the build job; None: ``resources.cpus``."""
    mem: str | None = None
    """Memory of the build job, as Slurm reads it; None: the build smoke's peak RSS × builder ranks per node
    × 1.25 where a passing build preflight measured it, else ``resources.mem``."""
    time_limit: str | None = None
    """Its time limit; None: the build smoke's estimate ÷ 0.8 where measured on the job's device kind, else
    ``resources.time_limit``."""


ResourcesSpec.model_rebuild()  # its ``build`` field names BuildResources, defined after it


class EvalSpec(Strict):
    """Evaluation on held-out episodes."""

    metric: str = "eef_mm_24ep"
    """The metric that ranks runs."""
    episodes: list[Episodes] = Field(default=[5, 24], min_length=1, max_length=64)
    """Episode counts evaluated (each ≥ 1); each logs ``eef_mm_<n>ep`` (`[-3]` once logged ``eef_mm_-3ep nan``)."""
    simulator: bool = False
    """Also evaluate by replay in robosuite (``sim_eef_mm_<n>ep``)."""
    resources: EvalResources | None = None
    """The eval jobs' own resources where the derived ones (one process, one GPU, a training rank's share of
    the node) are not wanted."""


class LatentCacheSpec(Strict):
    """Card B's three-way video-latent cache: RGB rows, point-map (PT) rows and first frames (FF).

    Slots live in ``<cache_root>/cache/video_latent/robocasa_hdf5/<F>x<H>x<W>_{rgb,pt__<hash16>,ff[__<hash16>]}/``
    and are built and reused independently (see ``cache/latent``).
    """

    cache_root: str
    """Root of the latent cache (``$VARS`` and ``~`` expand at use time)."""
    pt_cache_root: str | None = None
    """Root of the PT slot when it lives elsewhere; defaults to ``cache_root``. Part of the PT hash."""
    cameras: list[str] = Field(min_length=1)
    """Camera names: frames are ``obs/<camera>_image`` (uint8 HWC), depth ``obs/<camera>_depth`` (metres),
    camera matrices ``obs/<camera>_intrinsics`` (3×3) and ``obs/<camera>_extrinsics`` (4×4 camera→world)."""
    frames: int = Field(ge=1, le=MAX_COUNT)
    """Frames per sample (F); the Wan VAE compresses time 4×, so F must be 1 + 4k."""
    height: int = Field(ge=16, le=MAX_WIDTH)
    """Frame height in pixels (H); a multiple of 16, equal to the recorded images (never resized)."""
    width: int = Field(ge=16, le=MAX_WIDTH)
    """Frame width in pixels (W); a multiple of 16, equal to the recorded images (never resized)."""
    frame_stride: int = Field(default=1, ge=1, le=MAX_COUNT)
    """Episode timesteps between consecutive sample frames."""
    start_stride: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    """Timesteps between sample starts within an episode; ``None``: one sample per episode, at start 0."""
    split: str = "all"
    """``mask/<split>`` of ``data.episodes`` whose demos are cached; ``all``: every demo."""
    vae: str = "tiny"
    """``tiny``: a seeded tiny AutoencoderKLWan with random weights (smoke tests); otherwise a local
    directory holding real weights, loaded with ``from_pretrained(local_files_only=True)``."""
    use_pointmap: bool = True
    """Train with PT rows; also makes the FF slot carry the PT first frame (``_ff__<pt hash>``)."""
    pt_norm_path: str | None = None
    """Normalisation file the PT extractor writes (JSON mean/std of valid points); default
    ``<pt_cache_root>/cache/video_latent/robocasa_hdf5/<F>x<H>x<W>_pt_norm.json``. Part of the PT hash."""
    pt_norm_mean: list[Annotated[float, Field(ge=-MAX_POINT_M, le=MAX_POINT_M)]] | None = None
    """Override of the per-axis (x, y, z) point mean in metres; part of the PT hash."""
    pt_norm_std: list[Annotated[float, Field(le=MAX_POINT_M)]] | None = None
    """Override of the per-axis (x, y, z) point std in metres; part of the PT hash."""
    pt_max_depth: float = Field(default=10.0, gt=0, le=MAX_DEPTH_M)
    """Depth (m) at or beyond which a pixel is invalid (far plane / missing return), like 0, NaN and inf."""
    extractor_version: str = "pt-v2-valid-depth"
    """Version of the PT extractor; bump it when the extractor changes so the PT hash does too."""
    strict_rgb_must_exist: bool = False
    """Fail instead of encoding when an RGB latent is missing."""
    strict_pt_must_exist: bool = False
    """Fail instead of encoding when a PT latent is missing."""
    strict_ff_must_exist: bool = False
    """Fail instead of encoding when a first-frame latent is missing."""
    skip_ff: bool = False
    """Neither load nor build first-frame latents."""
    build_only_slot: Literal["rgb", "pt", "ff"] | None = None
    """Build only this slot and return placeholders (standalone builds); ``None`` for training."""

    @model_validator(mode="after")
    def _video_geometry(self) -> "LatentCacheSpec":
        if self.frames % 4 != 1:
            raise ValueError(f"frames: {self.frames} is not 1+4k (the Wan VAE compresses time 4×; "
                             f"use {self.frames - self.frames % 4 + 1} or {self.frames - self.frames % 4 + 5})")
        for field in ("height", "width"):
            size = getattr(self, field)
            if size % 16:
                raise ValueError(f"{field}: {size} px is not a multiple of 16 (it would silently become a "
                                 f"{size // 16 * 16} px grid; use {size // 16 * 16} or {size // 16 * 16 + 16})")
        for field in ("pt_norm_mean", "pt_norm_std"):
            values = getattr(self, field)
            if values is not None and len(values) != 3:
                raise ValueError(f"{field}: needs 3 values (x, y, z), got {len(values)}")
        if self.pt_norm_std is not None and min(self.pt_norm_std) <= 0:
            raise ValueError("pt_norm_std: every std must be > 0")
        if self.build_only_slot == "pt" and not self.use_pointmap:
            raise ValueError("build_only_slot: 'pt' needs use_pointmap: true")
        if self.build_only_slot == "ff" and self.skip_ff:
            raise ValueError("build_only_slot: 'ff' contradicts skip_ff: true")
        return self

    @property
    def slots(self) -> tuple[str, ...]:
        """Slots a training run loads: RGB always, PT with point maps, FF unless skipped."""
        return ("rgb",) + (("pt",) if self.use_pointmap else ()) + (() if self.skip_ff else ("ff",))


_GOAL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|<|>=|>)\s*(-?[0-9]*\.?[0-9]+)(?:\s+under\s+(\S+))?\s*$")


class Goal(Strict):
    """An adoption criterion such as ``eef_mm_24ep <= 125``."""

    metric: str
    op: Literal["<=", "<", ">=", ">"]
    value: float
    protocol: str | None = None
    """``… under <protocol>``: only results under that evaluation protocol decide it; None: the spec's own evaluation."""

    @classmethod
    def parse(cls, text: str) -> "Goal":
        match = _GOAL.fullmatch(text)
        if not match:
            raise ValueError(f"goal {text!r} is not '<metric> <op> <number> [under <protocol>]' "
                             f"(e.g. 'eef_mm_24ep <= 125')")
        value = float(match.group(3))
        if not math.isfinite(value):  # 400 digits are inf as a float
            raise ValueError(f"goal {text[:60]!r}: the number is not finite")
        return cls(metric=match.group(1), op=match.group(2), value=value, protocol=match.group(4))

    def passes(self, observed: float) -> bool:
        return {"<=": observed <= self.value, "<": observed < self.value,
                ">=": observed >= self.value, ">": observed > self.value}[self.op]

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}" + (f" under {self.protocol}" if self.protocol else "")


def check_job_mem(value: str) -> int:
    """``--mem``/``resources.mem``: a size as Slurm reads it (``ground.units.parse_slurm_mem``: 1600GB is
    1600 GiB) of 1 MiB (Slurm reads ``--mem=0`` as the whole node) … :data:`MAX_JOB_MEM`."""
    size = parse_slurm_mem(value)
    if size < 2**20:
        raise ValueError(f"{value!r} is less than 1 MiB (Slurm reads --mem=0 as the whole node; give a size, e.g. 4G)")
    if size > MAX_JOB_MEM:
        raise ValueError(f"{value!r} is more than {MAX_JOB_MEM // 2**40} TiB, past any node (a typo?)")
    return size


def check_job_time(value: str) -> float:
    """``--time``/``resources.time_limit``: a finite duration of at least one minute (Slurm's unit); 0 and
    UNLIMITED mean no limit to Slurm, which no estimate can be checked against."""
    seconds = parse_duration(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is no limit (give one, e.g. 3-00:00:00; preflight checks the wall clock against it)")
    if seconds < 60:
        raise ValueError(f"{value!r} is under a minute (Slurm's limits are whole minutes, and 0 means UNLIMITED)")
    return seconds


ENTRY_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class CodeSpec(Strict):
    """The code a job runs: which repositories, and which entry."""

    roots: list[str] = Field(default_factory=list, max_length=32)
    """Folders of the team's own code (their packages sit at the top of each), relative to the project
    root or absolute. They go on the job's import path; class paths must import from the project or from
    one of them; every root is frozen into the job's code snapshot and counted in the code version."""
    entry: str | None = Field(default=None, max_length=4096)
    """What the job runs: a Python module (``team_idm.train``: ``python -m MODULE --run-dir RUN_DIR``) or
    a command line (``bash scripts/run.sh``, run from the snapshot with ``IDMCTL_RUN_DIR`` set). None is
    idmctl's trainer; ``--entry`` overrides it. The preflight's smoke runs this same entry."""
    launch: Literal["per_rank", "per_node", "single"] | None = None
    """How the entry starts (:data:`LAUNCH_MODES`). None: detected from the command line (torchrun,
    ``python -m torch.distributed.run``, ``accelerate launch``, ``deepspeed`` → ``per_node``), else
    ``per_rank``. A stated mode the command line contradicts is a spec error."""

    @field_validator("roots")
    @classmethod
    def _plain_roots(cls, roots: list[str]) -> list[str]:
        for root in roots:
            if not root.strip() or re.search(r"[\x00-\x1f\x7f]", root):
                raise ValueError(f"{root!r} is not a folder path")
        return roots

    @field_validator("entry")
    @classmethod
    def _plain_entry(cls, entry: str | None) -> str | None:
        if entry is not None and (not entry.strip() or re.search(r"[\x00-\x1f\x7f]", entry)):
            raise ValueError("the entry is empty or holds a control character: a module name or one command line")
        return entry

    @field_validator("launch")
    @classmethod
    def _launch_agrees(cls, launch: str | None, info: ValidationInfo) -> str | None:
        check_launch(info.data.get("entry"), launch)  # entry is declared (so validated) first
        return launch


def detect_launch(entry: str | None) -> str | None:
    """``per_node`` when the command line starts its own ranks (:data:`PER_NODE_LAUNCHERS`), else None
    (nothing to tell from it: a module, or ``bash run.sh`` whose script the command line does not show)."""
    if entry is None or re.fullmatch(ENTRY_MODULE, entry):
        return None
    try:
        words = shlex.split(entry)
    except ValueError:
        return None
    while words and (words[0] == "env" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0])):
        words = words[1:]  # `env A=1 torchrun …`, `OMP_NUM_THREADS=8 torchrun …`
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if re.fullmatch(r"python[0-9.]*", program):
        module = words[words.index("-m") + 1] if "-m" in words[:-1] else None
        return "per_node" if module in ("torch.distributed.run", "torch.distributed.launch") else None
    if program in ("torchrun", "deepspeed") or (program == "accelerate" and words[1:2] == ["launch"]):
        return "per_node"
    return None


def check_launch(entry: str | None, launch: str | None) -> None:
    """A stated launch mode the command line contradicts (``torchrun`` stated ``per_rank``: 8 launchers × 8 ranks)."""
    detected = detect_launch(entry)
    if launch is not None and detected is not None and launch != detected:
        raise ValueError(f"launch {launch!r} contradicts the entry {entry!r}, which starts its own ranks "
                         f"({detected}): say launch: {detected}, or run the script per rank without its launcher")


class ExperimentSpec(Strict):
    """A resolved experiment: every section present, every value typed."""

    description: str = ""
    """One line on what the run is for."""
    data: DataSpec
    model: ModelSpec
    loader: LoaderSpec
    train: TrainSpec
    resources: ResourcesSpec
    stage: StageSpec = StageSpec()
    eval: EvalSpec = EvalSpec()
    latent: LatentCacheSpec | None = None
    """Card B's RGB / PT / FF video-latent cache, for runs that train on Wan VAE latents."""
    code: CodeSpec = CodeSpec()
    """The team's own repositories and entry (default: idmctl's trainer, the project alone)."""
    goal: str | None = None
    """Adoption criterion, e.g. ``eef_mm_24ep <= 125``."""

    @field_validator("goal")
    @classmethod
    def _goal_parses(cls, value: str | None) -> str | None:
        if value is not None:
            Goal.parse(value)
        return value

    @model_validator(mode="after")
    def _batch_divides(self) -> "ExperimentSpec":
        per_step = self.loader.batch_size * self.resources.world_size
        if self.train.effective_batch % per_step:
            raise ValueError(
                f"train.effective_batch: {self.train.effective_batch} is not a multiple of "
                f"batch_size {self.loader.batch_size} × world size {self.resources.world_size} = {per_step}"
            )
        return self

    @property
    def goal_parsed(self) -> Goal | None:
        return Goal.parse(self.goal) if self.goal else None

    @property
    def samples_read_per_step(self) -> int:
        """Distinct samples read per optimizer step over all ranks: ``effective_batch / loader.repeats``."""
        return self.train.effective_batch // self.loader.repeats

    @property
    def grad_accum(self) -> int:
        """Micro-steps per optimizer step to reach ``train.effective_batch``."""
        return self.train.effective_batch // (self.loader.batch_size * self.resources.world_size)

"""The one dataset factory: the trainer and preflight's introspection both build datasets through here.

``dataset_kwargs`` is exactly what the factory passes, so a check can bind it to the class's
signature (``inspect.signature(cls).bind(**kwargs)``) and see the TypeError the job would hit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from cache.dataset import HiddenMultiLayerDataset, HiddenSingleLayerDataset
from ground.class_path import resolve_class
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec.schema import ClassRef, ExperimentSpec

DATASETS: dict[str, type[Dataset]] = {
    "hidden_multilayer": HiddenMultiLayerDataset,
    "hidden_single_layer": HiddenSingleLayerDataset,
}
SPLIT_ROLES = ("train", "eval")
"""``split`` arguments naming a role; the spec maps them to ``data.train_split`` / ``data.eval_split``."""


def dataset_class(spec: ExperimentSpec) -> type[Dataset]:
    """A registry name, or the team's own class by ``{class_path, init_args}`` (within ``code.roots``)."""
    chosen = spec.data.dataset
    if isinstance(chosen, ClassRef):
        return resolve_class(chosen, spec, "data.dataset")
    try:
        return DATASETS[chosen]
    except KeyError:
        raise UserError(f"unknown dataset {chosen!r}", field="data.dataset",
                        hint=f"registered: {', '.join(DATASETS)}; or {{class_path: pkg.module.Class, init_args: {{...}}}}") from None


def split_name(spec: ExperimentSpec, split: str) -> str:
    """``train``/``eval`` → the spec's mask name; anything else is taken as a mask name itself."""
    return {"train": spec.data.train_split, "eval": spec.data.eval_split}.get(split, split)


def dataset_kwargs(spec: ExperimentSpec, split: str, cache_root: str | None = None) -> dict[str, Any]:
    """What the factory passes to the dataset class, derived from the spec (the routed-IDM contract).

    ``cache_root`` overrides ``data.cache_root`` (e.g. the staged copy on node-local disk).
    """
    data = spec.data
    if isinstance(data.dataset, ClassRef):  # the team's class gets what the spec says, and which split
        return {**data.dataset.init_args, "split": split_name(spec, split)}
    return {
        "episodes": str(expand_path(data.episodes)),
        "cache_root": str(expand_path(cache_root or data.cache_root)),
        "split": split_name(spec, split),
        "selected_layer_indices": list(data.selected_layer_indices),
        "frame_window": data.frame_window,
        "action_horizon": data.action_horizon,
        # A routed stage-in copy is always our safetensors, whatever the source format.
        "cache_format": ("safetensors" if cache_root is not None and spec.stage.enabled and spec.stage.layers == "routed"
                         else data.cache_format),
        "mmap": spec.loader.mmap,
        "expected_layers": list(data.cached_layers),
        "frames": data.frames,
        "token_grid": tuple(data.token_grid),
        "channels": data.channels,
        "dtype": data.dtype,
        "action_dim": data.action_dim,
    }


def build_dataset(spec: ExperimentSpec, split: str, cache_root: str | None = None) -> Dataset:
    return dataset_class(spec)(**dataset_kwargs(spec, split, cache_root))


def dataloader_kwargs(spec: ExperimentSpec) -> dict[str, Any]:
    """DataLoader settings per rank: batches of ``loader.batch_size / loader.repeats`` distinct samples.
    ``persistent_workers`` is derived (``num_workers > 0``) unless a
    legacy config sets it explicitly — kept so card A's job 6262 mistake still fails for real."""
    loader = spec.loader
    kwargs: dict[str, Any] = {
        "batch_size": loader.samples_per_batch,  # distinct samples; repeat_samples brings it to batch_size rows
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": (loader.persistent_workers if loader.persistent_workers is not None
                               else loader.derived_persistent_workers),
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.effective_prefetch
    return kwargs


def repeat_samples(tensor: torch.Tensor, repeats: int) -> torch.Tensor:
    """Each sample ``repeats`` times in a row along the batch (``loader.repeats``): copies sit side by
    side, so the flow noise and time drawn per row differ between copies of one sample. ``repeats``
    1 returns the very tensor, so a run without repeats computes exactly what it did before K existed.

    Done on the rank's device after the copy, so /dev/shm and the host→device copy carry each sample once.
    """
    return tensor if repeats == 1 else tensor.repeat_interleave(repeats, dim=0)


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)  # workers only slice bytes; extra threads just fight for cores


def build_dataloader(spec: ExperimentSpec, split: str, *, shuffle: bool, seed: int, rank: int = 0,
                     world_size: int = 1, cache_root: str | None = None) -> DataLoader:
    """This rank's DataLoader; the sampler's order depends only on (seed, epoch), never on num_workers."""
    dataset = build_dataset(spec, split, cache_root)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=False)
    return DataLoader(dataset, sampler=sampler, worker_init_fn=_worker_init, **dataloader_kwargs(spec))

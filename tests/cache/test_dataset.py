"""The routed-IDM dataset and the one factory, on real HDF5 episodes and real cache files."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from cache.dataset import HiddenMultiLayerDataset, HiddenSingleLayerDataset
from cache.episodes import Demo, write_episodes
from cache.hidden import cache_file, write_hidden, write_legacy
from cache.registry import build_dataloader, build_dataset, dataloader_kwargs, dataset_class, dataset_kwargs
from hidden_quick_spec import use_hidden_quick
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec import load_spec
from ground.spec.schema import ExperimentSpec

@pytest.fixture(autouse=True)
def _frozen_quickstart(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_hidden_quick(monkeypatch, tmp_path)


STEPS = {"demo_0": 20, "demo_1": 9, "demo_2": 31, "demo_10": 16}
STRIDE = {"demo_0": 2, "demo_1": 1, "demo_2": 4, "demo_10": 2}


def _spec(**data_updates: object) -> ExperimentSpec:
    spec = load_spec("quickstart").spec
    loader = data_updates.pop("loader", {})
    return spec.model_copy(update={"data": spec.data.model_copy(update=data_updates),
                                   "loader": spec.loader.model_copy(update=loader)})


def _write_data(spec: ExperimentSpec, fmt: str = "safetensors",
                dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Episodes in the robomimic layout and one cache file per demo, in the quickstart geometry."""
    data = spec.data
    rng = np.random.default_rng(0)
    demos = [Demo(name, rng.standard_normal((steps, data.action_dim)).astype(np.float32),
                  rng.standard_normal((steps, 5)), {"robot0_eef_pos": rng.standard_normal((steps, 3))})
             for name, steps in STEPS.items()]
    write_episodes(expand_path(data.episodes), demos, {"env_name": "Lift"},
                   {"train": ["demo_0", "demo_1", "demo_2"], "valid": ["demo_10"]})
    hidden = {}
    for index, name in enumerate(STEPS):
        generator = torch.Generator().manual_seed(index)
        hidden[name] = torch.randn(len(data.cached_layers), data.frames, *data.token_grid, data.channels,
                                   generator=generator).to(dtype)
        path = cache_file(expand_path(data.cache_root), name, fmt)
        if fmt == "safetensors":
            write_hidden(path, hidden[name], data.cached_layers, {"demo": name, "frame_stride": STRIDE[name]})
        else:
            write_legacy(path, hidden[name], data.cached_layers, frame_stride=STRIDE[name])
    return hidden


@pytest.fixture
def quick() -> tuple[ExperimentSpec, dict[str, torch.Tensor]]:
    spec = _spec()
    return spec, _write_data(spec)


def test_samples_follow_the_documented_contract(quick: tuple[ExperimentSpec, dict[str, torch.Tensor]]) -> None:
    spec, hidden = quick
    dataset = build_dataset(spec, "train")
    assert isinstance(dataset, HiddenMultiLayerDataset)
    windows = spec.data.frames - spec.data.frame_window + 1
    assert len(dataset) == 3 * windows
    episodes = expand_path(spec.data.episodes)
    from cache.episodes import read_demo

    for item in (0, windows + 6, len(dataset) - 1):
        sample = dataset[item]
        demo, start = sample["demo"], sample["start"]
        assert sample["hidden"].shape == (2, 2, 4, 4, 32) and sample["hidden"].dtype == hidden[demo].dtype
        torch.testing.assert_close(sample["hidden"], hidden[demo][[0, 2], start:start + 2], rtol=0, atol=0)
        recorded = read_demo(episodes, demo)
        t0 = min(start * STRIDE[demo], STEPS[demo] - 1)
        valid = min(8, STEPS[demo] - t0)
        assert sample["action_mask"].tolist() == [True] * valid + [False] * (8 - valid)
        np.testing.assert_array_equal(sample["actions"][:valid].numpy(), recorded.actions[t0:t0 + valid])
        assert not sample["actions"][valid:].any()
        eef = recorded.obs["robot0_eef_pos"].astype(np.float32)
        assert sample["eef_pos"].shape == (9, 3)
        expected_eef = [eef[min(t, STEPS[demo] - 1)] for t in range(t0, t0 + 9)]
        np.testing.assert_array_equal(sample["eef_pos"].numpy(), np.stack(expected_eef))
    # demo_1 (9 steps, stride 1) reaches past its end: the mask must say so.
    last_of_demo_1 = dataset[2 * windows - 1]
    assert last_of_demo_1["demo"] == "demo_1" and not last_of_demo_1["action_mask"].all()


def test_legacy_cache_gives_the_same_samples() -> None:
    spec = _spec()
    _write_data(spec)
    legacy_spec = _spec(cache_format="legacy_pt")
    _write_data(legacy_spec, "legacy_pt")
    ours, legacy = build_dataset(spec, "train"), build_dataset(legacy_spec, "eval")
    assert len(legacy) == spec.data.frames - spec.data.frame_window + 1  # valid split: demo_10 only
    ours_eval = build_dataset(spec, "eval")
    for item in range(len(legacy)):
        a, b = ours_eval[item], legacy[item]
        for key in ("hidden", "actions", "action_mask", "eef_pos"):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert len(ours) > len(legacy)


def _batches(spec: ExperimentSpec) -> list[dict[str, object]]:
    return list(build_dataloader(spec, "train", shuffle=True, seed=7))


def test_workers_0_and_2_give_identical_batches(quick: tuple[ExperimentSpec, dict[str, torch.Tensor]]) -> None:
    spec, _ = quick
    serial = _batches(spec)
    parallel = _batches(_spec(loader={"num_workers": 2}))
    assert len(serial) == len(parallel) == 6
    for a, b in zip(serial, parallel):
        assert a["demo"] == b["demo"] and torch.equal(a["start"], b["start"])
        for key in ("hidden", "actions", "action_mask", "eef_pos"):
            assert torch.equal(a[key], b[key])
    assert [a["start"].tolist() for a in serial] != sorted(a["start"].tolist() for a in serial)  # shuffled


def test_two_ranks_split_the_data(quick: tuple[ExperimentSpec, dict[str, torch.Tensor]]) -> None:
    spec, _ = quick
    seen = [[(d, int(s)) for batch in build_dataloader(spec, "train", shuffle=True, seed=1, rank=r, world_size=2)
             for d, s in zip(batch["demo"], batch["start"])] for r in (0, 1)]
    # 21 windows over 2 ranks: 11 each, DistributedSampler repeats one sample to even them out.
    assert len(seen[0]) == len(seen[1]) == 11
    assert len(set(seen[0]) | set(seen[1])) == 21


def test_loader_kwargs_derive_persistent_workers() -> None:
    assert dataloader_kwargs(_spec()) == {"batch_size": 4, "num_workers": 0, "pin_memory": False,
                                          "persistent_workers": False}
    assert dataloader_kwargs(_spec(loader={"num_workers": 3})) == {
        "batch_size": 4, "num_workers": 3, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 2}


def test_job_6262_legacy_override_fails_for_real(quick: tuple[ExperimentSpec, dict[str, torch.Tensor]]) -> None:
    spec = _spec(loader={"persistent_workers": True})
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        build_dataloader(spec, "train", shuffle=False, seed=0)


def test_job_6321_wrong_class_fails_at_construction(quick: tuple[ExperimentSpec, dict[str, torch.Tensor]]) -> None:
    spec = _spec(dataset="hidden_single_layer")
    assert dataset_class(spec) is HiddenSingleLayerDataset
    with pytest.raises(TypeError, match="selected_layer_indices"):
        inspect.signature(dataset_class(spec)).bind(**dataset_kwargs(spec, "train"))
    with pytest.raises(TypeError, match="selected_layer_indices"):
        build_dataset(spec, "train")
    # The look-alike is real and usable on its own terms.
    kwargs = dataset_kwargs(spec, "train")
    kwargs.pop("selected_layer_indices")
    single = HiddenSingleLayerDataset(layer_index=3, **kwargs)
    sample = single[0]
    torch.testing.assert_close(sample["hidden"], quick[1]["demo_0"][3, 0:2], rtol=0, atol=0)


def test_unknown_dataset_name() -> None:
    with pytest.raises(UserError) as exc:
        dataset_class(_spec(dataset="hidden_raw"))
    assert exc.value.line() == ("error: data.dataset: unknown dataset 'hidden_raw' "
                                "(registered: hidden_multilayer, hidden_single_layer; "
                                "or {class_path: pkg.module.Class, init_args: {...}})")


def test_selection_outside_cached_layers_names_the_file() -> None:
    spec = _spec()
    _write_data(spec)
    kwargs = dataset_kwargs(spec, "train") | {"selected_layer_indices": [0, 4], "expected_layers": None}
    with pytest.raises(UserError) as exc:
        HiddenMultiLayerDataset(**kwargs)
    first = cache_file(expand_path(spec.data.cache_root), "demo_0", "safetensors")
    assert exc.value.line() == (f"error: {first}:data.selected_layer_indices: selected layer index 4 is outside "
                                f"the 4 cached layers [0, 1, 2, 3] (use indices 0..3)")
    # The spec believes the cache holds 12 blocks; the file holds 4.
    wrong = dataset_kwargs(spec, "train") | {"expected_layers": list(range(12))}
    with pytest.raises(UserError, match=r"file has layers \[0, 1, 2, 3\] but the spec says \[0, 1, 2"):
        HiddenMultiLayerDataset(**wrong)


def test_missing_cache_file_and_wrong_geometry(quick: tuple[ExperimentSpec, dict[str, torch.Tensor]]) -> None:
    spec, _ = quick
    missing = cache_file(expand_path(spec.data.cache_root), "demo_2", "safetensors")
    missing.unlink()
    with pytest.raises(UserError) as exc:
        build_dataset(spec, "train")
    assert exc.value.line() == (f"error: {missing}:data.cache_root: episode demo_2 has no cache file "
                                f"(build it: `idmctl cache build-hidden EXP`)")
    with pytest.raises(UserError, match="file has dtype float32 but the spec says bfloat16"):
        build_dataset(_spec(dtype="bfloat16"), "eval")
    with pytest.raises(UserError, match="actions are 7-D but the spec says 12"):
        build_dataset(_spec(action_dim=12), "eval")

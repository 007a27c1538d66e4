"""The hidden-state cache builder: real diffusers Wan VAE + Cosmos transformer (tiny seeded configs,
random weights; real weights load from local folders), a real SIGKILL mid-build, the CLI and the build
preflight. Two ranks over gloo are tests/trainers/test_build_ranks.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import pytest

from cache.episodes import Demo, write_episodes
from cache.hidden import cache_file, inspect_file, read_hidden
from cache.registry import build_dataset
from hidden_quick_spec import use_hidden_quick
from fork_support import run_forked, sigkill_at_fsync
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec import load_spec
from ground.spec.schema import ExperimentSpec
from trainers.build_hidden_cache import build_hidden_cache
from trainers.cosmos_encode import load_models

@pytest.fixture(autouse=True)
def _frozen_quickstart(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_hidden_quick(monkeypatch, tmp_path)


STEPS = [23, 9, 40, 17]


def _write_demos(spec: ExperimentSpec) -> list[str]:
    rng = np.random.default_rng(0)
    demos = [Demo(f"demo_{i}", rng.standard_normal((steps, 7)).astype(np.float32), rng.standard_normal((steps, 4)),
                  {"robot0_eef_pos": rng.standard_normal((steps, 3)),
                   "robot0_agentview_image": rng.integers(0, 255, (steps, 24, 24, 3), dtype=np.uint8)})
             for i, steps in enumerate(STEPS)]
    write_episodes(expand_path(spec.data.episodes), demos, {"env_name": "Lift"},
                   {"train": ["demo_0", "demo_1", "demo_2"], "valid": ["demo_3"]})
    return [d.name for d in demos]


@pytest.fixture
def quick() -> tuple[ExperimentSpec, list[str]]:
    spec = load_spec("quickstart").spec
    return spec, _write_demos(spec)


def _files(spec: ExperimentSpec, names: list[str]) -> dict[str, bytes]:
    return {n: cache_file(expand_path(spec.data.cache_root), n, "safetensors").read_bytes() for n in names}


def test_build_captures_every_cached_block_and_skips_on_rerun(quick: tuple[ExperimentSpec, list[str]]) -> None:
    spec, names = quick
    summary = build_hidden_cache(spec)
    assert (summary["built"], summary["skipped"], summary["demos"]) == (4, 0, 4)
    for name, steps in zip(names, STEPS):
        info = inspect_file(cache_file(expand_path(spec.data.cache_root), name, "safetensors"))
        assert (info.layers, info.frames, info.height, info.width, info.channels) == ([0, 1, 2, 3], 8, 4, 4, 32)
        # 8 latent frames (29 video frames) spanning the episode: cache frame f = timestep f × stride.
        assert info.frame_stride == max(1, (steps - 1) // 7)
        assert info.meta["demo"] == name and info.meta["text_conditioning"] == "zeros"
        assert info.meta["vae"].startswith("AutoencoderKLWan:tiny config:") and info.meta["vae"].endswith(
            "weights:tiny-seed0")
        assert info.meta["transformer"].startswith("CosmosTransformer3DModel:tiny config:")
        layers = read_hidden(info.path, [0, 1, 2, 3], 0, 8)
        # Deeper blocks transform the residual stream further: no two cached layers are equal.
        assert all(not layers[a].equal(layers[b]) for a in range(4) for b in range(a + 1, 4))
    first = _files(spec, names)
    assert first["demo_0"] != first["demo_1"]  # features depend on the episode's frames
    again = build_hidden_cache(spec)
    assert (again["built"], again["skipped"]) == (0, 4)
    # A corrupt file is not "cached": it is rebuilt, identically.
    broken = cache_file(expand_path(spec.data.cache_root), "demo_2", "safetensors")
    broken.write_bytes(broken.read_bytes()[:-10])
    assert build_hidden_cache(spec)["built"] == 1
    assert _files(spec, names) == first
    dataset = build_dataset(spec, "train")
    assert len(dataset) == 3 * (8 - 2 + 1) and dataset[0]["hidden"].shape == (2, 2, 4, 4, 32)


def test_local_weights_load_with_from_pretrained(quick: tuple[ExperimentSpec, list[str]], tmp_path: Path) -> None:
    spec, names = quick
    vae, transformer, _, _ = load_models(spec.data)
    vae.save_pretrained(tmp_path / "cosmos" / "vae")
    transformer.save_pretrained(tmp_path / "cosmos" / "transformer")
    summary = build_hidden_cache(spec, model_dir=str(tmp_path / "cosmos"))
    assert summary["built"] == 4
    info = inspect_file(cache_file(expand_path(spec.data.cache_root), "demo_0", "safetensors"))
    vae_id, tr_id = info.meta["vae"], info.meta["transformer"]
    assert vae_id.startswith("AutoencoderKLWan:cosmos config:") and "tiny-seed0" not in vae_id
    assert tr_id.startswith("CosmosTransformer3DModel:cosmos config:") and "tiny-seed0" not in tr_id
    reference_root = tmp_path / "reference"
    spec_ref = spec.model_copy(update={"data": spec.data.model_copy(update={"cache_root": str(reference_root)})})
    build_hidden_cache(spec_ref)
    reference = inspect_file(reference_root / "demo_0.safetensors")
    # Same configs (same config hashes), weights named by their bytes instead of the seed.
    assert vae_id.split(" weights:")[0].split(" ")[1] == reference.meta["vae"].split(" weights:")[0].split(" ")[1]
    # The same weights, loaded from disk, give the same features (to float32 rounding: a loaded module's
    # parameters can take another matmul path, ~2e-7 apart; any real difference in weights is O(1)).
    torch.testing.assert_close(read_hidden(info.path, [0, 3], 0, 8), read_hidden(reference.path, [0, 3], 0, 8),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="model directory does not exist"):
        build_hidden_cache(spec, model_dir=str(tmp_path / "nowhere"))


def test_geometry_mismatch_and_legacy_format_are_user_errors(quick: tuple[ExperimentSpec, list[str]]) -> None:
    spec, _ = quick
    wrong = spec.model_copy(update={"data": spec.data.model_copy(update={"cache_format": "legacy_pt"})})
    with pytest.raises(UserError, match="the builder writes safetensors, the spec says legacy_pt"):
        build_hidden_cache(wrong)


@pytest.mark.slow
def test_crash_mid_build_leaves_only_whole_files(quick: tuple[ExperimentSpec, list[str]]) -> None:
    spec, names = quick
    # SIGKILL the builder inside its second write, after the bytes and before the rename.
    def killed_in_second_fsync() -> None:
        sigkill_at_fsync(2)
        build_hidden_cache(load_spec("quickstart").spec)

    # The builder in a child forked from this process (the test's captured stderr has its output): the
    # same real process and SIGKILL as `python -c`, without a fresh diffusers import. Loading the models
    # here first imports diffusers in this process, which the rebuild below needs anyway.
    load_models(spec.data)
    assert run_forked(killed_in_second_fsync, "the builder killed in its second fsync") == -9
    root = expand_path(spec.data.cache_root)
    assert cache_file(root, "demo_0", "safetensors").exists()
    assert not cache_file(root, "demo_1", "safetensors").exists()
    with pytest.raises(UserError, match="episode demo_1 has no cache file"):
        build_dataset(spec, "train")
    summary = build_hidden_cache(spec)
    assert (summary["built"], summary["skipped"]) == (3, 1)
    assert len(build_dataset(spec, "train")) == 21


def test_cli_build_then_inspect(cli, quick: tuple[ExperimentSpec, list[str]]) -> None:
    result = cli("cache", "build-hidden", "quickstart")
    assert result.exit_code == 0, result.output
    assert "built 4 files, skipped 0 already cached, 1 process(es)" in result.output
    shown = cli("cache", "inspect", "quickstart")
    assert shown.exit_code == 0, shown.output
    assert "per sample      2 layers × 2 frames × 4 × 4 × 32 × 4 B = 8,192 B (8.2 kB)" in shown.output
    per_file = 4096 + 4 * 8 * 4 * 4 * 32 * 4  # page-aligned header + (L, T, H, W, C) float32
    assert f"on this machine: 4 files, {4 * per_file:,} B (278.5 kB), demo_0.safetensors matches the spec" in shown.output
    assert "all layers      4 layers × 2 frames × 4 × 4 × 32 × 4 B = 16,384 B (16.4 kB)  → 2.0× less" in shown.output
    assert "built by        transformer: CosmosTransformer3DModel:tiny config:" in shown.output
    assert "built by        text_conditioning: zeros" in shown.output


@pytest.mark.slow
def test_the_spec_names_the_models_the_build_job_and_its_preflight_load(
        quick: tuple[ExperimentSpec, list[str]], tmp_path: Path, cli) -> None:
    """``data.models`` is where a build job (``submit --build hidden``) finds real weights: the builder
    loads them without a flag, and the build preflight checks the folders and the transformer's config
    against the cache's geometry before anything is submitted."""
    import json

    from ground.contract import ENV_EXPERIMENTS

    spec, _ = quick
    vae, transformer, _, _ = load_models(spec.data)
    models = tmp_path / "cosmos"
    vae.save_pretrained(models / "vae")
    transformer.save_pretrained(models / "transformer")
    experiments = Path(os.environ[ENV_EXPERIMENTS])

    def preflight(name: str, models_dir: Path, **data: object) -> dict[str, dict]:
        extra = "".join(f"  {key}: {value}\n" for key, value in data.items())
        (experiments / f"{name}.yaml").write_text(f"extends: quickstart\ndata:\n  models: {models_dir}\n{extra}")
        result = cli("preflight", name, "--build", "hidden", "--json")
        return {c["name"]: c for c in json.loads(result.stdout)["checks"]}

    checks = preflight("real_models", models)
    assert checks["build_weights"]["status"] == "PASS", checks["build_weights"]
    assert f"weights in {models}" in checks["build_weights"]["summary"]
    assert checks["build_smoke"]["status"] == "PASS", checks["build_smoke"]  # loaded through load_models

    missing = preflight("no_models", tmp_path / "nowhere")["build_weights"]
    assert missing["status"] == "FAIL" and missing["numbers"]["field"] == "data.models"
    assert f"model directory {tmp_path / 'nowhere'} does not exist" in missing["summary"]
    wrong = preflight("wrong_width", models, channels=64)["build_weights"]
    assert wrong["status"] == "FAIL" and "hidden size 32 and 4 blocks; the spec caches 64 channels" in wrong["summary"]

    with_models = spec.model_copy(update={"data": spec.data.model_copy(update={"models": str(models)})})
    build_hidden_cache(with_models)  # no --model-dir: the spec says where
    info = inspect_file(cache_file(expand_path(spec.data.cache_root), "demo_0", "safetensors"))
    assert info.meta["vae"].startswith("AutoencoderKLWan:cosmos config:") and "tiny-seed0" not in info.meta["vae"]
    assert "tiny-seed0" not in info.meta["transformer"]

"""The Cosmos-Predict2 tokenizer path on real diffusers architectures (tiny seeded configs): Wan VAE
latents → patch embedding → hooked blocks; where the text conditioning comes from; and preflight
catching a cache built by other models than the spec names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from cache.episodes import Demo, write_episodes
from cache.hidden import cache_file, inspect_file, read_hidden
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec import load_spec
from ground.spec.schema import ExperimentSpec
from hidden_quick_spec import use_hidden_quick
from idmctl.gate import cache as cache_check
from idmctl.core.checks import PreflightContext, Status
from idmctl.gate.runner import gather
from idmctl.core.profile import load_profile
from trainers.build_hidden_cache import build_hidden_cache
from trainers.cosmos_encode import (TINY_TEXT_DIM, encode_latents, hidden_states, load_models, pixel_frames,
                                    pixel_size)


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ExperimentSpec:
    use_hidden_quick(monkeypatch, tmp_path)
    spec = load_spec("quickstart").spec
    rng = np.random.default_rng(1)
    demos = [Demo(f"demo_{i}", rng.standard_normal((30, 7)).astype(np.float32), rng.standard_normal((30, 4)),
                  {"robot0_eef_pos": rng.standard_normal((30, 3)),
                   "robot0_agentview_image": rng.integers(0, 255, (30, 48, 48, 3), dtype=np.uint8)})
             for i in range(2)]
    write_episodes(expand_path(spec.data.episodes), demos, {"env_name": "Lift"}, {"train": ["demo_0"], "valid": ["demo_1"]})
    return spec


def _with(spec: ExperimentSpec, **data: object) -> ExperimentSpec:
    return spec.model_copy(update={"data": spec.data.model_copy(update=data)})


def test_video_goes_through_the_vae_then_the_patch_embedding(quick: ExperimentSpec) -> None:
    vae, transformer, _, _ = load_models(quick.data)
    assert (pixel_frames(8), pixel_size(quick.data)) == (29, (64, 64))  # 1 + 4·7 frames, 16 × the 4×4 grid
    video = torch.rand(1, 3, 29, 64, 64) * 2 - 1
    latents = encode_latents(vae, video)
    assert latents.shape == (1, 4, 8, 8, 8)  # Wan: 4× time (keeping frame 0), 8× space
    embedded: list[torch.Tensor] = []
    hook = transformer.patch_embed.register_forward_hook(lambda _m, inputs, _out: embedded.append(inputs[0]))
    try:
        blocks = hidden_states(transformer, latents, torch.zeros(1, 1, TINY_TEXT_DIM), [0, 3])
    finally:
        hook.remove()
    # What the patch embedding saw: the latents, the all-ones condition mask, the zero padding mask.
    assert torch.equal(embedded[0][:, :4], latents)
    assert torch.equal(embedded[0][:, 4], torch.ones(1, 8, 8, 8)) and torch.equal(embedded[0][:, 5], torch.zeros(1, 8, 8, 8))
    assert [b.shape for b in blocks] == [(8 * 4 * 4, 32)] * 2
    # A different video gives different latents and different block outputs.
    other = hidden_states(transformer, encode_latents(vae, -video), torch.zeros(1, 1, TINY_TEXT_DIM), [0, 3])
    assert not torch.allclose(blocks[1], other[1])


def test_text_conditioning_prefers_prompt_embeddings_and_records_it(quick: ExperimentSpec, tmp_path: Path) -> None:
    build_hidden_cache(quick)
    root = expand_path(quick.data.cache_root)
    zeros = inspect_file(cache_file(root, "demo_0", "safetensors"))
    assert zeros.meta["text_conditioning"] == "zeros"

    prompts = expand_path(quick.data.episodes).parent / "prompt_embeddings"
    prompts.mkdir()
    generator = torch.Generator().manual_seed(3)
    save_file({"prompt_embeds": torch.randn(7, TINY_TEXT_DIM, generator=generator)}, prompts / "demo_0.safetensors")
    save_file({"prompt_embeds": torch.randn(5, TINY_TEXT_DIM, generator=generator)}, prompts / "default.safetensors")
    other = _with(quick, cache_root=str(tmp_path / "with_prompts"))
    build_hidden_cache(other)
    for demo in ("demo_0", "demo_1"):
        info = inspect_file(cache_file(tmp_path / "with_prompts", demo, "safetensors"))
        assert info.meta["text_conditioning"] == f"prompt_embeddings:{prompts}"
    # The prompt reaches the blocks (cross-attention): features differ from the zero-text build.
    assert not torch.equal(read_hidden(zeros.path, [3], 0, 8),
                           read_hidden(cache_file(tmp_path / "with_prompts", "demo_0", "safetensors"), [3], 0, 8))

    save_file({"prompt_embeds": torch.zeros(7, TINY_TEXT_DIM + 1)}, prompts / "demo_0.safetensors")
    with pytest.raises(UserError) as exc:
        build_hidden_cache(_with(quick, cache_root=str(tmp_path / "bad")))
    assert exc.value.line() == (f"error: {prompts / 'demo_0.safetensors'}:prompt_embeds: prompt embedding is (7, 17), "
                                "the transformer wants (S, 16) (recompute it with the transformer's text encoder)")


def test_t5_directory_without_transformers_is_one_line(quick: ExperimentSpec, tmp_path: Path) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        (tmp_path / "t5").mkdir()
        with pytest.raises(UserError, match="the T5 text encoder needs the `transformers` package"):
            build_hidden_cache(quick, text_encoder_dir=str(tmp_path / "t5"))
        # The spec's data.text_encoder reaches the builder without a flag (a build job has none).
        with pytest.raises(UserError, match="the T5 text encoder needs the `transformers` package"):
            build_hidden_cache(_with(quick, text_encoder=str(tmp_path / "t5")))
        return
    with pytest.raises(UserError, match="text encoder directory does not exist"):
        build_hidden_cache(quick, text_encoder_dir=str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="text encoder directory does not exist"):
        build_hidden_cache(_with(quick, text_encoder=str(tmp_path / "nowhere")))


def test_preflight_fails_a_cache_built_by_other_models(quick: ExperimentSpec, tmp_path: Path) -> None:
    build_hidden_cache(quick)
    built = inspect_file(cache_file(expand_path(quick.data.cache_root), "demo_0", "safetensors")).meta
    profile, _ = load_profile("local")
    resolved = load_spec("quickstart")

    def check(spec: ExperimentSpec):
        named = type(resolved)(resolved.name, resolved.path, spec)
        return cache_check.check(PreflightContext(named, profile, gather(named, profile)))

    same = check(_with(quick, vae_id=built["vae"], transformer_id=built["transformer"]))
    assert same.status is Status.PASS, same.summary
    real = "CosmosTransformer3DModel:Cosmos-Predict2-2B config:0123456789abcdef weights:fedcba9876543210"
    stale = check(_with(quick, vae_id=built["vae"], transformer_id=real))
    assert stale.status is Status.FAIL
    assert (f"demo_0: stale cache, transformer built by {built['transformer']} ≠ spec {real}") in stale.summary
    assert "vae built by" not in stale.summary
    assert "rebuild with the models the spec names" in stale.fix
    # The builder refuses to write a cache that would be stale at birth.
    with pytest.raises(UserError, match="the loaded model is 'CosmosTransformer3DModel:tiny config:"):
        build_hidden_cache(_with(quick, transformer_id=real, cache_root=str(tmp_path / "other")))

"""The cache check on a real tiny cache (real HDF5 episodes + real safetensors hidden files), and
the runner's measurements of it (du for stage-in, per-episode inspection)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from idmctl.gate import cache, disk
from idmctl.core.checks import PreflightContext, Status
from idmctl.gate.runner import gather
from idmctl.core.profile import load_profile
from ground.spec import load_spec


REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """quickstart over 8 real demos (6 train, 2 valid) and their safetensors hidden files, staged."""
    from trainers.tiny_data import write_tiny_routed_data

    data = write_tiny_routed_data(tmp_path / "data", demos=8, valid=2, frames=6, layers=4, grid=(2, 2), channels=16)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        f"extends: {REPO / 'experiments' / 'quickstart'}\n"
        f"data:\n  episodes: {data['episodes']}\n  cache_root: {data['cache_root']}\n"
        "  cached_layers: [0, 1, 2, 3]\n  frames: 6\n  token_grid: [2, 2]\n  channels: 16\n"
        f"stage:\n  enabled: true\n  dest: {tmp_path / 'stage'}\n")
    return spec


def check_cache(spec_path: Path):
    profile, _ = load_profile("local")
    resolved = load_spec(str(spec_path))
    measured = gather(resolved, profile)
    return PreflightContext(resolved, profile, measured), cache.check(PreflightContext(resolved, profile, measured))


def test_complete_cache_passes_and_stage_in_is_measured(tiny: Path):
    ctx, result = check_cache(tiny)
    assert result.status is Status.PASS, result.summary
    assert "train: 6/6 episodes ok; valid: 2/2 episodes ok" in result.summary
    files = sorted((tiny.parent / "data" / "hidden").glob("*.safetensors"))
    assert ctx.measurements.cache_bytes == sum(f.stat().st_size for f in files)
    staged = disk.check(ctx)
    assert staged.status is Status.PASS and f"measured under" in staged.summary and "(8 files)" in staged.summary


def test_missing_train_episode_fails_naming_it(tiny: Path):
    (tiny.parent / "data" / "hidden" / "demo_3.safetensors").unlink()
    _, result = check_cache(tiny)
    assert result.status is Status.FAIL
    assert "train: 5/6 episodes ok, missing demo_3" in result.summary


def test_missing_held_out_cache_fails_with_the_build_that_makes_it(tiny: Path):
    """The evaluations read the held-out split: a training run whose held-out cache was never built
    would fail (or score fewer episodes) at its first evaluation, hours in."""
    (tiny.parent / "data" / "hidden" / "demo_7.safetensors").unlink()
    (tiny.parent / "data" / "hidden" / "demo_6.safetensors").unlink()
    _, result = check_cache(tiny)
    assert result.status is Status.FAIL, result.summary
    assert "valid: 0/2 episodes ok, missing demo_6, demo_7" in result.summary
    assert "the evaluations (eef_mm_4ep) read held-out split 'valid' and 2 of its 2 episodes have no usable cache file" \
        in result.summary
    assert result.fix.startswith("build them before training: `idmctl submit tiny --build hidden`")
    assert "cost: 2 of 2 valid episodes to encode" in result.fix


def test_geometry_that_disagrees_with_the_spec_fails(tiny: Path):
    text = tiny.read_text().replace("channels: 16", "channels: 32")
    tiny.write_text(text)
    _, result = check_cache(tiny)
    assert result.status is Status.FAIL
    assert "demo_0: file has channels 16 but the spec says 32" in result.summary


def test_a_cache_in_another_dtype_fails_with_what_it_does_to_the_bytes(tiny: Path):
    """float32 files under a bf16 spec: the exact ranges are cut from the spec's geometry, so the check
    says, as arithmetic, that a frame is twice the bytes the spec's ranges would take (no silent conversion)."""
    tiny.write_text(tiny.read_text().replace("  channels: 16\n", "  channels: 16\n  dtype: bfloat16\n"))
    _, result = check_cache(tiny)
    assert result.status is Status.FAIL
    assert ("demo_0: file has dtype float32 but the spec says bfloat16: a frame is 2 × 2 × 16 × 4 B = 256 B in the "
            "file, 2 × 2 × 16 × 2 B = 128 B by the spec") in result.summary, result.summary


def test_a_truncated_cache_file_fails_naming_the_file_and_the_bytes(tiny: Path):
    """A file cut short (a copy that stopped part-way): the check names it and says where its last layer
    should end against the bytes there are, before any job reads a range past the end."""
    from cache.hidden import cache_file

    path = cache_file(Path(tiny.read_text().split("cache_root: ")[1].split("\n")[0]), "demo_3", "safetensors")
    size = path.stat().st_size
    os.truncate(path, size - 100)
    _, result = check_cache(tiny)
    assert result.status is Status.FAIL
    assert f"demo_3: truncated: layer_3 ends at byte {size:,} but the file has {size - 100:,} B" in result.summary, \
        result.summary

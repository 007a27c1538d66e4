"""Card B's three-way latent cache: layout, PT hash, point-map statistics, slot-wise dataset, builder modes.

Real components throughout: HDF5 episodes written by cache.episodes, diffusers' AutoencoderKLWan
(tiny config, seeded random weights), safetensors files on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cache.latent.layout import LatentLayout, cached_files, validate_key
from cache.latent.scenes import write_scene_episodes
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec import load_spec

SMOKE = "latent_rgbpt_smoke"


@pytest.fixture
def episodes(idmctl_home: Path) -> Path:
    return write_scene_episodes(idmctl_home / "latent_smoke" / "demos.hdf5")


def variant(tmp_path: Path, name: str, latent: str) -> str:
    """A spec extending the smoke experiment with extra ``latent:`` lines; returns its path."""
    path = tmp_path / f"{name}.yaml"
    body = "\n".join(f"  {line}" for line in latent.strip().splitlines())
    path.write_text(f"extends: {SMOKE}\nlatent:\n{body}\n")
    return str(path)


def base_dirs(spec_name: str) -> list[str]:
    layout = LatentLayout.from_spec(load_spec(spec_name).spec.latent)
    return sorted(p.name for p in layout.base.iterdir()) if layout.base.exists() else []


def test_keys_cannot_escape_the_cache_root() -> None:
    layout = LatentLayout(Path("/c"), Path("/c"), 5, 32, 32, "0123456789abcdef")
    assert layout.sample_path("rgb", "demo_12", 4) == Path("/c/cache/video_latent/robocasa_hdf5/5x32x32_rgb/demo_12_s4.safetensors")
    assert layout.slot_dir("pt").name == "5x32x32_pt__0123456789abcdef"
    assert layout.slot_dir("ff").name == "5x32x32_ff__0123456789abcdef"
    assert LatentLayout(Path("/c"), Path("/c"), 5, 32, 32, None, ff_hashed=False).slot_dir("ff").name == "5x32x32_ff"
    assert validate_key("demo_3") == "demo_3"
    for bad in ("../../etc/passwd", "a/b", "..", ".hidden", "", "demo\x00", "/abs"):
        with pytest.raises(UserError, match="could escape the cache root"):
            layout.sample_path("rgb", bad, 0)
    with pytest.raises(UserError, match="non-negative"):
        layout.sample_path("rgb", "demo_1", -1)
    with pytest.raises(UserError, match="PT meta hash"):
        LatentLayout(Path("/c"), Path("/c"), 5, 32, 32).slot_dir("pt")


def test_bad_latent_settings_are_one_line_errors(cli, tmp_path: Path) -> None:
    cases = {
        "build_only_slot: rgbpt": "latent.build_only_slot: Input should be 'rgb', 'pt' or 'ff'",
        "frames: 6": "latent.frames: 6 is not 1+4k",
        "height: 84": "latent.height: 84 px is not a multiple of 16 (it would silently become a 80 px grid",
        "pt_norm_std: [1.0, 0.0, 1.0]": "latent.pt_norm_std: every std must be > 0",
    }
    for index, (line, message) in enumerate(cases.items()):
        result = cli("exp", "validate", variant(tmp_path, f"bad{index}", line))
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert load_spec(SMOKE).spec.latent.build_only_slot is None


def test_pt_hash_stats_each_norm_file_once_and_follows_rewrites(episodes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cache.latent import pt_hash
    from cache.latent.dataset import prepare_pt_norm

    spec = load_spec(SMOKE).spec
    norm = prepare_pt_norm(spec)
    pt_hash.forget()
    calls: list[str] = []
    real_stat = os.stat

    def counting_stat(path, *args, **kwargs):
        calls.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(pt_hash.os, "stat", counting_stat)
    first = [pt_hash.pt_meta_for(spec.latent) for _ in range(5)]
    assert calls.count(os.path.realpath(norm)) == 1
    assert len({m.short for m in first}) == 1 and len(first[0].short) == 16
    assert first[0].key["norm_files"][0][0] == os.path.realpath(norm)
    assert first[0].key["extractor_version"] == "pt-v2-valid-depth"
    monkeypatch.setattr(pt_hash.os, "stat", real_stat)
    prepare_pt_norm(spec, recompute=True)  # rewriting the norm file forgets its memo
    assert pt_hash.pt_meta_for(spec.latent).short != first[0].short


def test_invalid_depth_pixels_do_not_reach_the_statistics(tmp_path: Path) -> None:
    from cache.episodes import EpisodeFile
    from cache.latent.pointmaps import NormAccumulator, compute_norm_stats, frame_points
    from cache.latent.scenes import BOX_HEIGHT_M

    cameras = ["robot0_agentview_left", "robot0_agentview_right"]
    corrupt = EpisodeFile(write_scene_episodes(tmp_path / "corrupt.hdf5", corrupt_last_view=True))
    clean = EpisodeFile(write_scene_episodes(tmp_path / "clean.hdf5", corrupt_last_view=False))
    demos = corrupt.demos("all")
    stats = compute_norm_stats(corrupt, demos, cameras, 1, max_depth=10.0)
    assert all(np.isfinite(stats.mean + stats.std))
    assert max(abs(m) for m in stats.mean) < 1.0 and max(stats.std) < 1.0  # a 2 m scene, not hundreds of metres
    assert stats.invalid_pixels == 3 * 9 * 4 * 8 * 8  # demos × steps × four 8×8 blocks of view 2
    # The same numbers as an independent numpy pass over exactly the valid pixels of the clean scene.
    points, masks = [], []
    for demo in demos:
        for step in range(9):
            for index, camera in enumerate(cameras):
                p, v = frame_points(clean, demo, camera, step, 10.0)
                if index == 1:
                    v[:16, :16] = False
                points.append(p[v])
    reference = np.concatenate(points)
    np.testing.assert_allclose(stats.mean, reference.mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats.std, reference.std(0), rtol=1e-6)
    # Every valid point lies on the table (z = 0) or on the box top.
    z = reference[:, 2]
    assert z.min() > -1e-6 and z.max() < BOX_HEIGHT_M + 1e-6
    # What the card's extractor did: the same pixels, invalid ones included, are not usable statistics.
    naive = NormAccumulator()
    for demo in demos[:1]:
        depth = corrupt.obs(demo, "robot0_agentview_right_depth", 0, 1)[0].astype(np.float64)
        naive.add(np.repeat(depth[..., None], 3, -1), np.ones(depth.shape, bool))
    assert not np.all(np.isfinite(naive.total))


@pytest.mark.parametrize("mode", ["rgb", "pt", "ff"])
def test_each_mode_creates_only_its_slot(episodes: Path, mode: str) -> None:
    from cache.latent.dataset import prepare_pt_norm
    from trainers.build_latent_cache import build

    if mode == "ff":  # ff follows pt (card B), so the norm file is there but no PT latents are
        prepare_pt_norm(load_spec(SMOKE).spec)
    report = build(SMOKE, mode, progress=False)
    names = base_dirs(SMOKE)
    slot_dirs = [n for n in names if not n.endswith("_pt_norm.json")]
    expected = {"rgb": "5x32x32_rgb", "pt": f"5x32x32_pt__{report['pt_hash']}", "ff": f"5x32x32_ff__{report['pt_hash']}"}
    assert slot_dirs == [expected[mode]]
    assert ("5x32x32_pt_norm.json" in names) == (mode != "rgb")
    directory = Path(report["slots"][mode]["dir"])
    assert len(cached_files(directory)) == report["samples"] == report["slots"][mode]["encoded"] == 9
    again = build(SMOKE, mode, progress=False)
    assert again["slots"][mode] == {**report["slots"][mode], "encoded": 0, "skipped": 9}


def test_rewriting_the_norm_file_reencodes_no_rgb_and_keeps_the_old_pt_dir(episodes: Path) -> None:
    from cache.latent.files import read_metadata
    from trainers.build_latent_cache import build

    first = build(SMOKE, "all", progress=False)
    assert {s: v["encoded"] for s, v in first["slots"].items()} == {"rgb": 9, "pt": 9, "ff": 9}
    old_pt = Path(first["slots"]["pt"]["dir"])
    rgb_before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in cached_files(Path(first["slots"]["rgb"]["dir"]))}
    old_pt_before = {p.name: p.read_bytes() for p in cached_files(old_pt)}

    rerun = build(SMOKE, "pt", recompute_norm=True, progress=False)  # the PT extractor runs again
    second = build(SMOKE, "all", progress=False)
    assert rerun["pt_hash"] != first["pt_hash"] == read_metadata(old_pt / "demo_0_s0.safetensors")["pt_meta_hash"][:16]
    assert second["slots"]["rgb"] == {**first["slots"]["rgb"], "encoded": 0, "skipped": 9}
    assert second["slots"]["pt"]["encoded"] == 0 and rerun["slots"]["pt"]["encoded"] == 9
    assert second["slots"]["ff"]["encoded"] == 9  # FF carries the PT first frame, so it follows the hash
    assert Path(second["slots"]["pt"]["dir"]) != old_pt
    rgb_after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in cached_files(Path(second["slots"]["rgb"]["dir"]))}
    assert rgb_after == rgb_before
    assert {p.name: p.read_bytes() for p in cached_files(old_pt)} == old_pt_before
    from cache.latent.status import latent_status

    status = latent_status(load_spec(SMOKE))
    assert [s["dir"] for s in status["stale_pt_dirs"]] == [str(old_pt)]
    assert status["stale_pt_dirs"][0]["files"] == 9


def test_dataset_slots_flags_and_prefilter(episodes: Path, tmp_path: Path) -> None:
    from cache.latent.dataset import LatentCacheDataset, prepare_pt_norm

    spec = load_spec(SMOKE).spec
    prepare_pt_norm(spec)
    builder = LatentCacheDataset(spec, build_only_slot="pt")
    assert builder.slots == ("pt",) and not builder.is_sample_cached("demo_0", 0)
    item = builder[0]
    assert item == {"key": "demo_0", "start": 0, "slot": "pt", "built": True}
    assert builder.is_sample_cached("demo_0", 0) and builder[0]["built"] is False
    assert base_dirs(SMOKE) == ["5x32x32_pt__" + builder.pt_meta.short, "5x32x32_pt_norm.json"]
    # The training view needs every slot: the same sample is not cached for it yet.
    training = LatentCacheDataset(spec)
    assert training.slots == ("rgb", "pt", "ff") and not training.is_sample_cached("demo_0", 0)
    strict = LatentCacheDataset(load_spec(variant(tmp_path, "strict", "strict_rgb_must_exist: true")).spec)
    with pytest.raises(UserError) as error:
        strict[0]
    assert "rgb latent is missing and strict_rgb_must_exist is set" in error.value.line()
    assert error.value.field == "latent.strict_rgb_must_exist" and "5x32x32_rgb/demo_0_s0.safetensors" in error.value.file
    no_ff = LatentCacheDataset(load_spec(variant(tmp_path, "noff", "skip_ff: true")).spec)
    sample = no_ff[0]
    assert no_ff.slots == ("rgb", "pt") and set(sample) == {"key", "start", "actions", "rgb", "pt"}
    assert sample["rgb"].shape == sample["pt"].shape == (2, 4, 2, 4, 4)  # views, z, 1+(5-1)/4, 32/8, 32/8
    assert sample["actions"].shape == (4, 7)
    with pytest.raises(UserError, match="build_only_slot 'depth' is not a slot"):
        LatentCacheDataset(spec, build_only_slot="depth")


def test_recorded_frames_of_the_wrong_size_are_refused(idmctl_home: Path) -> None:
    from cache.latent.dataset import LatentCacheDataset

    write_scene_episodes(idmctl_home / "latent_smoke" / "demos.hdf5", size=48)
    dataset = LatentCacheDataset(load_spec(SMOKE).spec, build_only_slot="rgb")
    with pytest.raises(UserError) as error:
        dataset[0]
    assert "recorded frames are 48×48 px but the spec asks for 32×32 (frames are never resized)" in error.value.line()
    assert not expand_path("${IDMCTL_HOME}/latent_smoke/cache").exists()


def test_real_weights_load_from_a_local_directory_only(episodes: Path, tmp_path: Path) -> None:
    import torch

    from cache.latent.dataset import LatentCacheDataset
    from cache.latent.encoder import load_encoder

    tiny = load_encoder("tiny")
    tiny.vae.save_pretrained(tmp_path / "wan_vae" / "vae")  # a diffusers model dir, as shipped (vae/ subfolder)
    spec = load_spec(variant(tmp_path, "local", f"vae: {tmp_path / 'wan_vae'}")).spec
    local = LatentCacheDataset(spec, build_only_slot="rgb")
    reference = LatentCacheDataset(load_spec(SMOKE).spec, build_only_slot="rgb", encoder=tiny)
    clips = reference._rgb_clips("demo_0", 0, 5)
    assert torch.equal(local.encoder.encode(clips), tiny.encode(clips))
    assert local.encoder.name == "AutoencoderKLWan:wan_vae"
    missing = LatentCacheDataset(load_spec(variant(tmp_path, "missing", f"vae: {tmp_path / 'nope'}")).spec,
                                 build_only_slot="rgb")
    with pytest.raises(UserError, match="VAE weights directory does not exist"):
        missing.encoder


def test_a_window_of_points_is_its_frames_read_one_by_one(tmp_path: Path) -> None:
    """window_points reads each array once for a whole strided window (the PT build's hot path); every
    frame must be what a per-frame read and unprojection gives, and a window past the episode's end is a
    one-line error, not a shorter window."""
    import pickle

    from cache.episodes import EpisodeFile
    from cache.latent.pointmaps import depth_to_points, window_points

    episodes = EpisodeFile(write_scene_episodes(tmp_path / "scenes.hdf5"))
    demo, camera = episodes.demos("all")[0], "robot0_agentview_right"
    window = window_points(episodes, demo, camera, range(1, 9, 3), 10.0)
    assert len(window) == 3
    for (points, valid), step in zip(window, (1, 4, 7)):
        one = [episodes.obs(demo, f"{camera}_{name}", step, step + 1)[0] for name in ("depth", "intrinsics", "extrinsics")]
        expected_points, expected_valid = depth_to_points(*one, 10.0)
        assert np.array_equal(points, expected_points) and np.array_equal(valid, expected_valid)
    with pytest.raises(UserError) as exc:
        window_points(episodes, demo, camera, range(5, 12, 3), 10.0)
    assert f"{camera} frames 5..11 requested, the demo records 9 steps" in exc.value.line()
    # The cached dataset handles never travel to a DataLoader worker: the copy reads through its own.
    copy = pickle.loads(pickle.dumps(episodes))
    assert np.array_equal(copy.obs(demo, f"{camera}_depth", 0, 2), episodes.obs(demo, f"{camera}_depth", 0, 2),
                          equal_nan=True)  # this view holds NaN depth on purpose

"""The standalone latent builder as processes: RGB ‖ PT in parallel, SIGKILL at random points,
sharding over ranks (torchrun, gloo), lazy fill vs pre-built, and the ``idmctl cache build|status`` commands.

Builders run as real OS processes: forked from this (already warm) test process where many runs
are needed (parallel, kill loop), and through torchrun for sharding.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from cache.latent.layout import LatentLayout, cached_files, temp_files
from cache.latent.scenes import write_scene_episodes
from ground.spec import load_spec

SMOKE = "latent_rgbpt_smoke"


@pytest.fixture
def episodes(idmctl_home: Path) -> Path:
    return write_scene_episodes(idmctl_home / "latent_smoke" / "demos.hdf5", demos=4, steps=13)


def _build_in_child(spec: str, mode: str, queue: multiprocessing.Queue) -> None:
    import torch

    from trainers.build_latent_cache import build

    # Two builders on this 2-core host: one CPU each, as their allocation would give them (an in-process
    # build uses every CPU torch sees: two at 2 threads each oversubscribe the host).
    torch.set_num_threads(1)
    queue.put(build(spec, mode, progress=False))


class _DieMidWrite:
    """A file object that writes part of the payload, then SIGKILLs its own process."""

    def __init__(self, handle, fraction: float):
        self.handle, self.fraction = handle, fraction

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)

    def write(self, data: bytes) -> int:
        self.handle.write(data[: int(len(data) * self.fraction)])
        self.handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


def _build_dying_in_write(spec: str, mode: str, queue: multiprocessing.Queue, fraction: float) -> None:
    """The real builder, killed by SIGKILL in the middle of writing its first file."""
    import builtins

    from cache.latent import files

    files.open = lambda path, flags: _DieMidWrite(builtins.open(path, flags), fraction)  # module global shadows open
    _build_in_child(spec, mode, queue)


def _fork(spec: str, mode: str, queue: multiprocessing.Queue, die_in_write: float | None = None) -> multiprocessing.Process:
    target, args = (_build_in_child, (spec, mode, queue)) if die_in_write is None else \
        (_build_dying_in_write, (spec, mode, queue, die_in_write))
    process = multiprocessing.get_context("fork").Process(target=target, args=args)
    process.start()
    return process


def _slot_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in cached_files(directory)}


def _warm() -> None:
    """Import diffusers and build the encoder once here, so forked builders start at once."""
    from cache.latent.encoder import load_encoder

    load_encoder("tiny")


@pytest.mark.slow
def test_rgb_and_pt_builds_overlap_without_conflicts_and_match_sequential(episodes: Path) -> None:
    from cache.latent.dataset import prepare_pt_norm
    from trainers.build_latent_cache import build

    _warm()
    prepare_pt_norm(load_spec(SMOKE).spec)
    queue: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()
    processes = [_fork(SMOKE, "rgb", queue), _fork(SMOKE, "pt", queue)]
    reports = {r["mode"]: r for r in (queue.get(timeout=120) for _ in processes)}
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    windows = {mode: (min(e["began"] for e in r["events"]), max(e["ended"] for e in r["events"]))
               for mode, r in reports.items()}
    overlap = min(w[1] for w in windows.values()) - max(w[0] for w in windows.values())
    assert overlap > 0, windows  # both builders were encoding at the same time
    rgb_dir, pt_dir = (Path(reports[m]["slots"][m]["dir"]) for m in ("rgb", "pt"))
    assert reports["rgb"]["slots"]["rgb"]["encoded"] == reports["pt"]["slots"]["pt"]["encoded"] == 20
    assert not temp_files(rgb_dir) and not temp_files(pt_dir)
    parallel = {"rgb": _slot_bytes(rgb_dir), "pt": _slot_bytes(pt_dir)}
    # Sequential reference in the same place (same norm file → same PT hash): move the parallel
    # results aside and build again, one slot after the other.
    for directory in (rgb_dir, pt_dir):
        shutil.move(directory, directory.with_name(directory.name + ".parallel"))
    assert build(SMOKE, "rgb", progress=False)["slots"]["rgb"]["encoded"] == 20
    assert build(SMOKE, "pt", progress=False)["slots"]["pt"]["encoded"] == 20
    assert _slot_bytes(rgb_dir) == parallel["rgb"] and _slot_bytes(pt_dir) == parallel["pt"]


@pytest.mark.slow
def test_sigkill_at_random_points_never_leaves_a_file_that_reads_as_cached(episodes: Path) -> None:
    from cache.latent.dataset import LatentCacheDataset, prepare_pt_norm
    from cache.latent.files import read_latent
    from trainers.build_latent_cache import build

    _warm()
    spec = load_spec(SMOKE).spec
    prepare_pt_norm(spec)
    dataset = LatentCacheDataset(spec)
    directories = [dataset.layout.slot_dir(slot) for slot in dataset.slots]
    rng = random.Random(1234)
    queue: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()
    kills, leftovers = 0, 0
    # Three runs die inside a write (after 0 %, ~50 %, 100 % of the bytes, before the rename).
    for fraction in (0.0, rng.uniform(0.1, 0.9), 1.0):
        process = _fork(SMOKE, "all", queue, die_in_write=fraction)
        process.join(timeout=60)
        assert process.exitcode == -signal.SIGKILL
        assert sum(len(temp_files(d)) for d in directories) >= 1  # the half-written file exists, hidden
        assert not any(dataset.is_sample_cached(k, s) for k, s in dataset.samples)
    while kills < 10:
        written = sum(len(cached_files(d)) for d in directories)
        process = _fork(SMOKE, "all", queue)
        # Wait for this run's first write (start-up is not an interesting place to die), then kill
        # it at a random point of the encode/write loop.
        deadline = time.monotonic() + 60
        while (process.is_alive() and time.monotonic() < deadline
               and sum(len(cached_files(d)) for d in directories) == written):
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.04))
        if not process.is_alive():
            break  # the build finished before this kill: nothing left to interrupt
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        assert process.exitcode == -signal.SIGKILL
        kills += 1
        leftovers += sum(len(temp_files(d)) for d in directories)
        for directory in directories:
            for path in cached_files(directory):
                tensors = read_latent(path)  # every file under its final name is whole
                assert all(t.numel() > 0 for t in tensors.values())
        for key, start in dataset.samples:
            if dataset.is_sample_cached(key, start):
                assert all(dataset.sample_path(s, key, start).exists() for s in dataset.slots)
    assert kills >= 10, f"only {kills} kills landed before the build finished"
    final = build(SMOKE, "all", progress=False)
    assert all(len(cached_files(d)) == 20 for d in directories)
    assert not any(temp_files(d) for d in directories)  # dead writers' temp files were swept
    assert sum(v["encoded"] for v in final["slots"].values()) < 3 * 20  # it finished the rest, not all
    # What the killed runs wrote equals a clean build elsewhere (a reference layout in a new root).
    reference_spec = spec.model_copy(update={"latent": spec.latent.model_copy(update={"build_only_slot": None})})
    clean = LatentCacheDataset(reference_spec)
    for key, start in clean.samples[:3]:
        for slot in clean.slots:
            assert read_latent(clean.sample_path(slot, key, start)).keys() == {"latent"} or slot == "ff"
    print(f"{kills} kills, {leftovers} temp files seen after kills, final run encoded {final['slots']}")


def test_lazy_fill_gives_the_same_tensors_and_losses_as_a_prebuilt_cache(idmctl_home: Path, tmp_path: Path) -> None:
    import torch

    from cache.latent.dataset import LatentCacheDataset, prepare_pt_norm
    from trainers.build_latent_cache import build

    write_scene_episodes(idmctl_home / "latent_smoke" / "demos.hdf5")  # 3 demos × 3 starts
    build(SMOKE, "all", progress=False)
    lazy_spec = tmp_path / "lazy.yaml"
    lazy_spec.write_text(f"extends: {SMOKE}\nlatent:\n  cache_root: {tmp_path / 'lazy_cache'}\n")
    strict_spec = tmp_path / "strict.yaml"
    strict_spec.write_text(f"extends: {SMOKE}\nlatent:\n  strict_rgb_must_exist: true\n"
                           "  strict_pt_must_exist: true\n  strict_ff_must_exist: true\n")
    prebuilt = LatentCacheDataset(load_spec(str(strict_spec)).spec)  # must load every slot, never encode
    prepare_pt_norm(load_spec(str(lazy_spec)).spec)
    lazy = LatentCacheDataset(load_spec(str(lazy_spec)).spec)
    assert not any(lazy.is_sample_cached(k, s) for k, s in lazy.samples)

    def losses(dataset: LatentCacheDataset) -> list[float]:
        """A few SGD steps of a linear action head on the latents (fixed seed and order)."""
        torch.manual_seed(0)
        head = None
        values = []
        for index in range(4):
            item = dataset[index]
            features = torch.cat([item["rgb"].flatten(), item["pt"].flatten(), item["ff_rgb"].flatten(),
                                  item["ff_pt"].flatten()])
            if head is None:
                head = torch.nn.Linear(features.numel(), item["actions"].numel())
                optimizer = torch.optim.SGD(head.parameters(), lr=1e-3)
            loss = torch.nn.functional.mse_loss(head(features), item["actions"].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            values.append(loss.item())
        return values

    for index in range(len(prebuilt)):
        a, b = prebuilt[index], lazy[index]
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(a[name], torch.Tensor):
                assert torch.equal(a[name], b[name]), name
    assert prebuilt.encoded.total() == 0 and lazy.encoded == {"rgb": 9, "pt": 9, "ff": 9}
    first, second = losses(prebuilt), losses(lazy)
    assert first == second and all(torch.isfinite(torch.tensor(first)))


@pytest.mark.slow
def test_two_ranks_shard_the_work_and_write_the_one_rank_files_bitwise(episodes: Path) -> None:
    from trainers.build_latent_cache import build, launch

    one = build(SMOKE, "pt", progress=False)  # one process: computes the norm file, encodes all 20
    one_dir = Path(one["slots"]["pt"]["dir"])
    single = {p.name: p.read_bytes() for p in cached_files(one_dir)}
    assert len(single) == 20
    shutil.rmtree(one_dir)  # the norm file stays: the same PT hash for the 2-rank build
    reports = sorted(launch(SMOKE, "pt", processes=2), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"], r["my_samples"]) for r in reports] == [(0, 2, 10), (1, 2, 10)]
    assert [r["slots"]["pt"]["encoded"] for r in reports] == [10, 10]
    assert reports[0]["pt_hash"] == reports[1]["pt_hash"] == one["pt_hash"]  # rank 0's hash, broadcast
    assert [r["device"] for r in reports] == ["cpu", "cpu"]
    keys = [{(e["key"], e["start"]) for e in r["events"]} for r in reports]
    assert not keys[0] & keys[1] and len(keys[0] | keys[1]) == 20
    layout = LatentLayout.from_spec(load_spec(SMOKE).spec.latent, reports[0]["pt_hash"])
    assert len(cached_files(layout.slot_dir("pt"))) == 20 and not layout.slot_dir("rgb").exists()
    assert {p.name: p.read_bytes() for p in cached_files(layout.slot_dir("pt"))} == single


def test_cache_status_and_build_commands(cli, episodes: Path) -> None:
    before = cli("cache", "status", SMOKE)
    assert before.exit_code == 0, before.output
    assert "│ rgb  │ 5x32x32_rgb              │ —    │ 0 / 20 " in before.output and "0 / 20" in before.output
    assert "(needs the PT norm file)" in before.output and "does not exist yet" in before.output
    built = cli("cache", "build", SMOKE, "--mode", "pt", "--json")
    assert built.exit_code == 0, built.output
    import json

    summary = json.loads(built.output)
    assert summary["slots"]["pt"]["encoded"] == 20 and list(summary["slots"]) == ["pt"]
    after = json.loads(cli("cache", "status", SMOKE, "--json").output)
    rows = {row["slot"]: row for row in after["slots"]}
    assert rows["pt"]["present"] == 20 and rows["pt"]["expected"] == 20 and rows["pt"]["complete"]
    assert rows["pt"]["hash"] == summary["pt_hash"] and rows["rgb"]["present"] == 0
    assert rows["ff"]["dir"].endswith(f"5x32x32_ff__{summary['pt_hash']}") and after["stale_pt_dirs"] == []
    bad = cli("cache", "build", SMOKE, "--mode", "depth")
    assert bad.exit_code == 2 and bad.output.strip() == "error: --mode: unknown mode 'depth' (one of rgb, pt, ff, all)"

"""The trainer's one-copy loader (cache.batches) against torch's DataLoader path it replaces, on real
HDF5 episodes and real bf16 safetensors / legacy .pt caches as the dataset tests build them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from cache.batches import BatchLoader, sampler_batches, supports, trainer_batches
from cache.prefetch import PREFETCH_DEPTH
from cache.registry import build_dataloader, build_dataset
from ground.contract import ENV_LOADER_DIRECT
from ground.errors import UserError
from hidden_quick_spec import use_hidden_quick
from test_dataset import _spec, _write_data

BF16_EPS = 2.0 ** -8
"""bfloat16 keeps 8 significant bits: one rounding step is at most 2^-8 of the value."""


@pytest.fixture(autouse=True)
def _frozen_quickstart(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_hidden_quick(monkeypatch, tmp_path)


def _bf16_data(fmt: str = "safetensors"):
    spec = _spec(dtype="bfloat16", cache_format=fmt)
    hidden = _write_data(spec, fmt, dtype=torch.bfloat16)
    return spec, hidden


def _old_batches(spec, split="train", seed=0):
    """The path this replaces: DataLoader + default collate, hidden converted to float32 per sample."""
    dataset = build_dataset(spec, split)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=False)
    loader = DataLoader(dataset, sampler=sampler, batch_size=spec.loader.samples_per_batch)
    for batch in loader:
        yield {**batch, "hidden": batch["hidden"].float()}


@pytest.mark.parametrize("fmt", ["safetensors", "legacy_pt"])
def test_batches_are_the_dataloaders_in_the_cache_dtype_with_no_float_copy(fmt: str) -> None:
    spec, _ = _bf16_data(fmt)
    loader = build_dataloader(spec, "train", shuffle=True, seed=0)
    assert supports(loader.dataset)
    new = trainer_batches(loader, 0, torch.device("cpu"))
    assert new is not None
    per_epoch = len(loader)
    for count, old in enumerate(_old_batches(spec)):
        got = next(new)
        assert got["hidden"].dtype == torch.bfloat16  # as on disk: no per-sample float copy
        assert got["hidden"].shape == old["hidden"].shape
        # bf16 → float32 is exact, so the new batch converted on the device equals the old one bit for bit.
        torch.testing.assert_close(got["hidden"].float(), old["hidden"], rtol=0, atol=0)
        for key in ("actions", "action_mask", "eef_pos", "start"):
            torch.testing.assert_close(got[key], old[key], rtol=0, atol=0)
        assert got["demo"] == old["demo"]
    assert count + 1 == per_epoch
    new.close()


def test_loss_and_gradients_match_the_old_path_within_bf16_rounding() -> None:
    """The model sees bf16 and converts on its device; the old path handed it float32 made on the host.
    The difference allowed is one bf16 rounding of the values (2^-8 relative); measured: 0 (the
    conversion is exact and happens once either way, only in another place)."""
    from trainers.registry import build_model
    from trainers.train import noise_generator

    spec, _ = _bf16_data()
    loader = build_dataloader(spec, "train", shuffle=True, seed=0)
    new_batch = next(trainer_batches(loader, 0, torch.device("cpu")))
    old_batch = next(_old_batches(spec))

    def loss_and_grads(batch):
        torch.manual_seed(0)
        model = build_model(spec, device=torch.device("cpu"))
        loss = model(batch["hidden"], batch["actions"], batch["action_mask"], generator=noise_generator(0, 1, 0, 0))
        loss.backward()
        return loss.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]

    new_loss, new_grads = loss_and_grads(new_batch)
    old_loss, old_grads = loss_and_grads(old_batch)
    assert torch.isfinite(new_loss)
    torch.testing.assert_close(new_loss, old_loss, rtol=BF16_EPS, atol=0)
    assert len(new_grads) == len(old_grads) > 0
    for new, old in zip(new_grads, old_grads):
        torch.testing.assert_close(new, old, rtol=BF16_EPS, atol=BF16_EPS * float(old.abs().max()))
    worst = max(float((n - o).abs().max()) for n, o in zip(new_grads, old_grads))
    assert abs(float(new_loss - old_loss)) == 0.0 and worst == 0.0, (float(new_loss - old_loss), worst)


def test_reads_run_ahead_while_the_step_computes_and_read_exactly_the_ranges() -> None:
    spec, _ = _bf16_data()
    dataset = build_dataset(spec, "train")
    order = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    loader = BatchLoader(dataset, order, 2)
    first = next(loader)
    # While "the step" holds the first batch, the reader fills the next PREFETCH_DEPTH buffers.
    deadline = time.monotonic() + 30
    while loader._ready.qsize() < PREFETCH_DEPTH:
        assert time.monotonic() < deadline, f"the reader did not read {PREFETCH_DEPTH} batches ahead in 30 s"
        time.sleep(0.01)
    time.sleep(0.05)
    assert loader._ready.qsize() == PREFETCH_DEPTH  # and no further: every other buffer is taken
    ranges = sum(length for item in range(10) for _, length, _ in dataset.hidden_ranges(item)[1])
    assert first["hidden"].shape[0] == 2
    rest = list(loader)
    assert len(rest) == 4
    assert loader.bytes_read == ranges == 10 * first["hidden"][0].numel() * 2
    assert loader._thread.join(5) is None and not loader._thread.is_alive()


def test_resumed_order_is_the_tail_of_the_full_order_across_epochs() -> None:
    spec, _ = _bf16_data()
    dataset = build_dataset(spec, "train")
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
    full = sampler_batches(sampler, 4)
    per_epoch = -(-len(dataset) // 4)
    stream = [next(full) for _ in range(2 * per_epoch + 3)]
    assert [len(b) for b in stream[:per_epoch]][-1] == len(dataset) - 4 * (per_epoch - 1)  # last one short
    assert stream[0] != stream[per_epoch]  # a new epoch is a new order
    for consumed in (0, 5, per_epoch, per_epoch + 2):
        resumed = sampler_batches(DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3), 4,
                                  consumed)
        assert [next(resumed) for _ in range(3)] == stream[consumed:consumed + 3]


def test_a_file_cut_short_after_the_check_is_one_line_naming_the_file_and_range() -> None:
    spec, _ = _bf16_data()
    dataset = build_dataset(spec, "train")
    info, ranges = dataset.hidden_ranges(3)
    offset, length, what = ranges[-1]
    os.truncate(info.path, offset + length // 2)
    loader = BatchLoader(dataset, [[3]], 1)
    with pytest.raises(UserError) as exc:
        next(loader)
    line = exc.value.line()
    assert line.startswith(f"error: {info.path}:cache: truncated while reading {what} "
                           f"(bytes {offset:,}..{offset + length:,}) at byte "), line
    assert "\n" not in line


def test_a_team_class_or_whole_file_reads_stay_on_the_dataloader() -> None:
    spec, _ = _bf16_data()
    whole = spec.model_copy(update={"loader": spec.loader.model_copy(update={"mmap": False})})
    assert trainer_batches(build_dataloader(whole, "train", shuffle=False, seed=0), 0, torch.device("cpu")) is None
    workers = spec.model_copy(update={"loader": spec.loader.model_copy(update={"num_workers": 1})})
    assert trainer_batches(build_dataloader(workers, "train", shuffle=False, seed=0), 0, torch.device("cpu")) is None
    assert not supports(object())


def test_o_direct_reads_aligned_ranges_into_page_aligned_buffers_and_falls_back_elsewhere(tmp_path: Path) -> None:
    """A geometry whose frame is one page (4 × 4 tokens × 128 channels × 2 B = 4096 B): every range is
    aligned and O_DIRECT carries all of it, with the very bytes the page-cache path gives; the test's
    float32 quickstart geometry (2,048 B frames) is not, and falls back to the page cache."""
    from cache.hidden import DIRECT_ALIGNMENT

    spec = _spec(dtype="bfloat16", channels=128)
    _write_data(spec, dtype=torch.bfloat16)
    dataset = build_dataset(spec, "train")
    order = [[0, 5], [3, 9], [11]]
    direct = BatchLoader(dataset, order, 2, direct=True)
    buffered = BatchLoader(dataset, order, 2)
    for got, want in zip(direct, buffered):
        assert got["hidden"].data_ptr() % DIRECT_ALIGNMENT == 0
        torch.testing.assert_close(got["hidden"], want["hidden"], rtol=0, atol=0)
        assert got["demo"] == want["demo"]
    assert direct.direct_bytes == direct.bytes_read == buffered.bytes_read > 0 and buffered.direct_bytes == 0

    unaligned, _ = _bf16_data()  # 4 × 4 × 32 × 2 B = 1,024 B frames
    fallback = BatchLoader(build_dataset(unaligned, "train"), order, 2, direct=True)
    list(fallback)
    assert fallback.direct_bytes == 0 and fallback.bytes_read > 0


def test_the_trainer_reads_around_the_page_cache_only_when_the_job_was_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's choice reaches the trainer's loader by ``ENV_LOADER_DIRECT`` (the page-aligned geometry
    of the test above: every byte then goes through O_DIRECT); unset or anything but 1, the page cache."""
    spec = _spec(dtype="bfloat16", channels=128)
    _write_data(spec, dtype=torch.bfloat16)
    loader = build_dataloader(spec, "train", shuffle=True, seed=0)
    for value, direct in ((None, False), ("0", False), ("1", True)):
        if value is None:
            monkeypatch.delenv(ENV_LOADER_DIRECT, raising=False)
        else:
            monkeypatch.setenv(ENV_LOADER_DIRECT, value)
        batches = trainer_batches(loader, 0, torch.device("cpu"))
        assert isinstance(batches, BatchLoader)
        next(batches)
        batches.close(wait_s=30)  # the read-ahead ends before the counters are compared
        assert not batches._thread.is_alive(), "the reader thread did not stop within 30 s"
        assert batches.direct is direct and batches.bytes_read > 0
        assert batches.direct_bytes == (batches.bytes_read if direct else 0)


@pytest.mark.parametrize("direct", [False, True])
def test_buffers_the_host_cannot_hold_are_one_line_with_the_multiplication(direct: bool) -> None:
    """Host memory refused (an address-space limit just above what this process holds, so the kernel
    really refuses the allocation): the loader says how many buffers of what size it asked for, as one line,
    whether the buffers come from malloc or, for O_DIRECT, from an anonymous page-aligned mapping."""
    import resource

    spec, _ = _bf16_data()
    dataset = build_dataset(spec, "train")
    shape, dtype = dataset.hidden_shape()
    sample = int(torch.Size(shape).numel()) * dtype.itemsize
    batch = (1 << 30) // sample + 1  # one batch over 1 GiB: three of them cannot fit 256 MiB of headroom
    with open("/proc/self/status") as status:
        held = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (held + (256 << 20), hard))
    try:
        with pytest.raises(UserError) as exc:
            BatchLoader(dataset, [], batch, direct=direct, start=False)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    line = exc.value.line()
    need = (PREFETCH_DEPTH + 1) * batch * sample
    assert line.startswith(f"error: loader.batch_size: cannot allocate the loader's {PREFETCH_DEPTH + 1} batch buffers "
                           f"({PREFETCH_DEPTH} prefetch + 1 in use) × {batch} samples × {sample:,} B = "), line
    assert "lower loader.batch_size or raise resources.mem" in line and "\n" not in line
    assert need > 3 << 30


def test_the_smokes_loader_cpu_is_measured_on_both_read_paths_from_an_empty_cache() -> None:
    """On the page-aligned geometry the smoke measures the loader's CPU per GB through the page cache and
    with O_DIRECT, each over the same batches; each pass starts with the files dropped from the page cache
    (the test reads the drop's effect off the kernel's count of this process's bytes from storage: both
    passes come from the disk, though the files were just written and sit in the page cache)."""
    from trainers.smoke import measure_loader_cpu

    spec = _spec(dtype="bfloat16", channels=128)
    _write_data(spec, dtype=torch.bfloat16)
    dataset = build_dataset(spec, "train")
    before = _bytes_from_storage()
    report = measure_loader_cpu(dataset, 2)
    assert report["loader_bytes"] > 0
    # The O_DIRECT pass reads every range from the disk (loader_bytes); anything beyond that is the
    # page-cache pass reading its (deduplicated) pages from the disk too: the drop took effect.
    assert _bytes_from_storage() - before > report["loader_bytes"]
    assert report["loader_cpu_s_per_gb"] == pytest.approx(report["loader_cpu_s"] / (report["loader_bytes"] / 1e9))
    assert report["loader_direct_cpu_s_per_gb"] is not None and report["loader_direct_cpu_s_per_gb"] > 0


def _bytes_from_storage() -> int:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["read_bytes"])

"""Sample repeats (``loader.repeats: K``): a step reads 1/K of the bytes, copies never share flow noise,
K=1 computes exactly what a spec without the field does; the io check uses the same count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cache.registry import build_dataloader, repeat_samples
from ground.errors import UserError
from ground.geometry import sample_io
from ground.spec.loader import load_spec
from ground.spec.schema import ExperimentSpec
from trainers.tiny_data import tiny_spec, write_tiny_routed_data

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def wide_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Wide enough (4×4 tokens × 256 channels) that the cache reads dominate the episode file's reads."""
    return write_tiny_routed_data(tmp_path_factory.mktemp("wide") / "data", channels=256, grid=(4, 4))


def _spec(data: dict[str, object], repeats: int | None) -> ExperimentSpec:
    loader = {"batch_size": 4} | ({} if repeats is None else {"repeats": repeats})
    return ExperimentSpec.model_validate(tiny_spec(data, loader=loader, train={"effective_batch": 8}))


def _rchar() -> int:
    """Bytes this process read through read(2)/pread(2)/preadv(2), page cache or not (/proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar line")


def _one_step_reads(spec: ExperimentSpec) -> tuple[int, int, int]:
    """(bytes read, hidden bytes delivered, rows after repeats) for one optimizer step's micro-batches."""
    loader = build_dataloader(spec, "train", shuffle=True, seed=0)
    batches = iter(loader)
    before, delivered, rows = _rchar(), 0, 0
    for _ in range(spec.grad_accum):
        batch = next(batches)
        delivered += batch["hidden"].nbytes
        rows += repeat_samples(batch["hidden"], spec.loader.repeats).shape[0]
    return _rchar() - before, delivered, rows


@pytest.mark.parametrize("repeats", [2, 4])
def test_a_step_reads_one_kth_of_the_bytes(wide_data, repeats: int) -> None:
    plain, repeated = _spec(wide_data, 1), _spec(wide_data, repeats)
    sample_bytes = sample_io(plain.data, mmap=True).bytes
    read_1, delivered_1, rows_1 = _one_step_reads(plain)
    read_k, delivered_k, rows_k = _one_step_reads(repeated)
    # Both compute the same number of rows per step (the effective batch is unchanged)...
    assert rows_1 == rows_k == plain.train.effective_batch == 8
    # ...but the cache bytes handed over, and the bytes read from files, drop by K.
    assert delivered_1 == 8 * sample_bytes
    assert delivered_k == repeated.samples_read_per_step * sample_bytes == 8 // repeats * sample_bytes
    assert delivered_k <= read_k < 1.1 * delivered_k, "reads beyond the cache bytes are the episode file's, small"
    assert read_1 / read_k == pytest.approx(repeats, rel=0.1)


def test_copies_of_a_sample_never_share_noise_or_time(tiny_cache) -> None:
    from trainers.registry import build_model
    from trainers.train import noise_generator

    spec = ExperimentSpec.model_validate(tiny_spec(tiny_cache.data, loader={"batch_size": 4, "repeats": 4},
                                                   train={"effective_batch": 4}))
    batch = next(iter(build_dataloader(spec, "train", shuffle=False, seed=0)))
    actions = repeat_samples(batch["actions"], 4)
    assert batch["actions"].shape[0] == 1 and actions.shape[0] == 4
    assert all(torch.equal(actions[0], actions[k]) for k in range(4)), "the copies are one sample"
    model = build_model(spec, device=torch.device("cpu"))
    noise, t = model.draw_noise_and_time(actions, noise_generator(0, 1, 0, 0))
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.equal(noise[i], noise[j])
            assert t[i] != t[j]


def test_repeats_one_is_the_very_same_batch_and_hash(tiny_cache, tmp_path: Path) -> None:
    absent, explicit = _spec(tiny_cache.data, None), _spec(tiny_cache.data, 1)
    tensor = torch.arange(6.0)
    assert repeat_samples(tensor, 1) is tensor, "K=1 adds no op: the trainer computes what it did before K"
    first = next(iter(build_dataloader(absent, "train", shuffle=True, seed=3)))
    second = next(iter(build_dataloader(explicit, "train", shuffle=True, seed=3)))
    assert all(torch.equal(first[k], second[k]) for k in ("hidden", "actions", "action_mask"))
    a = tiny_cache.spec_file(tmp_path / "a", "same")
    b = tiny_cache.spec_file(tmp_path / "b", "same", loader={"repeats": 1})
    assert load_spec(str(a)).hash == load_spec(str(b)).hash, "repeats: 1 keeps the spec's hash"
    c = tiny_cache.spec_file(tmp_path / "c", "same", loader={"repeats": 2})
    assert load_spec(str(c)).hash != load_spec(str(a)).hash


def test_repeats_must_divide_the_batch(tiny_cache, tmp_path: Path) -> None:
    path = tiny_cache.spec_file(tmp_path, "bad", loader={"batch_size": 2, "repeats": 3})
    with pytest.raises(UserError) as caught:
        load_spec(str(path))
    assert caught.value.line() == (f"error: {path}:loader.repeats: 3 does not divide batch_size 2 (each micro-batch "
                                   "holds batch_size / repeats distinct samples) (fix the value)")


def test_trainer_with_repeats_learns_to_the_end(tiny_cache, tmp_path: Path) -> None:
    from test_train import prepare_run, run_trainer

    run_dir = prepare_run(tiny_cache, tmp_path, "repeats", loader={"repeats": 2}, train={"steps": 4})
    done = run_trainer(run_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done: step 4" in done.stdout


def test_io_check_reads_one_kth_per_step() -> None:
    from idmctl.plan.budget import step_estimate
    from idmctl.core.checks import PreflightContext
    from idmctl.core.profile import load_profile

    resolved = load_spec("latent_c_n12_dense")
    spec = resolved.spec.model_copy(update={"loader": resolved.spec.loader.model_copy(update={"repeats": 8})})
    estimate = step_estimate(PreflightContext(type(resolved)(resolved.name, resolved.path, spec), load_profile("card")[0]))
    # Card A's N=12 dense plan at K=8: 128 × 796,262,400 B = 101.9 GB/step; repeats leave the working set
    # (7.2 TB) and so the page cache's 20% hits alone: 80% ÷ 8 GB/s + 20% ÷ 20 GB/s ≈ 11.0 s/step (12.7 s cold; --mem 1600GB is 1600 GiB of page cache).
    assert estimate.step_bytes == 128 * 796_262_400
    assert f"{estimate.data_s:.1f}" == "11.0"
    assert estimate.cache is not None and f"{estimate.cache.cold_data_s:.1f}" == "12.7"
    assert "(eff. batch 1,024 ÷ repeats 8 = 128 samples read) = 101.9 GB/step" in estimate.arithmetic()

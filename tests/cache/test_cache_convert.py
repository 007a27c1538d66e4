"""``idmctl cache convert`` and routed stage-in, on real torch.save legacy files: exact, verified
against the source bytes, resumable after a real SIGKILL; and preflight proposing routed staging."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cache.convert import convert_dir, convert_file
from cache.hidden import inspect_file, read_hidden, write_legacy
from cache.registry import build_dataset
from ground.errors import UserError
from ground.spec import load_spec
from idmctl.job.render import _stage_block
from idmctl.gate import cache as cache_check
from idmctl.gate import disk, qos
from idmctl.core.checks import Measurements, PreflightContext, Status
from idmctl.gate.runner import gather
from idmctl.core.profile import load_profile
from fork_support import run_forked, sigkill_at_fsync
from trainers.tiny_data import tiny_spec, write_tiny_routed_data

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def legacy(tmp_path: Path) -> tuple[Path, Path]:
    """Real episodes + a legacy .pt cache (bf16, card layout) of 5 demos × 4 layers; a spec over it."""
    data = write_tiny_routed_data(tmp_path / "data", demos=5, valid=1, frames=6, layers=4, grid=(2, 3), channels=8)
    legacy_root = tmp_path / "legacy"
    for src in sorted(Path(str(data["cache_root"])).glob("*.safetensors")):
        info = inspect_file(src)
        hidden = read_hidden(src, [0, 1, 2, 3], 0, 6).to(torch.bfloat16)
        write_legacy(legacy_root / f"{src.stem}.pt", hidden, [2, 5, 8, 11], frame_stride=info.frame_stride)
    section = {**data, "cache_root": str(legacy_root), "cache_format": "legacy_pt", "cached_layers": [2, 5, 8, 11],
               "dtype": "bfloat16"}
    spec = tmp_path / "legacy.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec(section, data={"selected_layer_indices": [1, 3]},
                                             stage={"enabled": True, "dest": str(tmp_path / "stage")})))
    return spec, legacy_root


def test_convert_all_then_resume(cli, legacy) -> None:
    spec, legacy_root = legacy
    out = legacy_root.parent / "converted"
    result = cli("cache", "convert", str(spec), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "converted 5, already done 0 of 5 files" in result.output
    for src in sorted(legacy_root.glob("*.pt")):
        dest = out / f"{src.stem}.safetensors"
        info = inspect_file(dest)
        assert info.layers == [2, 5, 8, 11] and info.frame_stride == 2
        assert info.meta["converted_from"]["path"] == str(src.resolve())
        assert torch.equal(read_hidden(dest, [0, 1, 2, 3], 0, 6), torch.load(src, weights_only=True)["hidden_multi"])
    again = cli("cache", "convert", str(spec), "--out", str(out), "--json")
    assert again.exit_code == 0 and '"skipped": 5' in again.output and '"converted": 0' in again.output


def test_routed_copy_reads_the_same_samples(cli, legacy) -> None:
    spec, legacy_root = legacy
    result = cli("cache", "convert", str(spec), "--layers", "routed", "--json")
    assert result.exit_code == 0, result.output
    routed_root = Path(f"{legacy_root}_blocks_5-11")
    assert inspect_file(routed_root / "demo_0.safetensors").layers == [5, 11]
    routed_spec = load_spec(str(spec)).spec
    routed_spec = routed_spec.model_copy(update={"stage": routed_spec.stage.model_copy(update={"layers": "routed"})})
    source = build_dataset(routed_spec, "train")
    staged = build_dataset(routed_spec, "train", cache_root=str(routed_root))
    assert len(source) == len(staged) > 0
    for item in range(len(source)):
        assert torch.equal(source[item]["hidden"], staged[item]["hidden"])
    # Pointed at directly (data.cache_root: the copy), preflight and `cache inspect` accept it too.
    data = routed_spec.data.model_copy(update={"cache_root": str(routed_root), "cache_format": "safetensors"})
    on_copy = routed_spec.model_copy(update={"data": data})
    resolved = load_spec(str(spec))
    named = type(resolved)(resolved.name, resolved.path, on_copy)
    local = load_profile("local")[0]
    assert cache_check.check(PreflightContext(named, local, gather(named, local))).status is Status.PASS
    # The routed copy holds 2 of 4 layers: half the bytes of the tensors.
    legacy_bytes = sum(inspect_file(p).geometry.file_bytes for p in legacy_root.glob("*.pt"))
    routed_bytes = sum(inspect_file(p).geometry.file_bytes for p in routed_root.glob("*.safetensors"))
    assert routed_bytes * 2 == legacy_bytes


def test_sigkill_mid_conversion_then_rerun_finishes(legacy) -> None:
    _, legacy_root = legacy
    out = legacy_root.parent / "killed"
    # A real SIGKILL at the worst moment of the third file: all bytes written, not yet verified or renamed.
    def killed_in_third_fsync() -> int:
        from cache.convert import main

        sigkill_at_fsync(3)
        return main([str(legacy_root), str(out), "--blocks", "5,11"])

    # The converter's entry point in a child forked from this process (the test's captured stderr has
    # its output): the same real process and SIGKILL as `python -c`, without a fresh torch import.
    assert run_forked(killed_in_third_fsync, "the converter killed in its third fsync") == -9
    done = sorted(p.name for p in out.glob("*.safetensors"))
    assert done == ["demo_0.safetensors", "demo_1.safetensors"]
    assert any(p.name.startswith(".demo_2.safetensors.tmp") for p in out.iterdir())  # the torn temp, never renamed
    totals = convert_dir(legacy_root, out, ".pt", [5, 11])
    assert (totals["converted"], totals["skipped"]) == (3, 2)
    for src in sorted(legacy_root.glob("*.pt")):
        expected = torch.load(src, weights_only=True)["hidden_multi"][[1, 3]]
        assert torch.equal(read_hidden(out / f"{src.stem}.safetensors", [0, 1], 0, 6), expected)


def test_source_changed_behind_the_zip_crc_is_refused(tmp_path: Path) -> None:
    hidden = torch.randn(3, 4, 2, 2, 8).to(torch.bfloat16)
    src = tmp_path / "demo_0.pt"
    write_legacy(src, hidden, [1, 2, 3])
    info = inspect_file(src)
    with open(src, "r+b") as handle:  # flip one byte of layer 1 in place; the zip directory still has the old CRC
        handle.seek(info.offsets[2] + 5)
        byte = handle.read(1)
        handle.seek(info.offsets[2] + 5)
        handle.write(bytes([byte[0] ^ 0xFF]))
    dest = tmp_path / "out" / "demo_0.safetensors"
    with pytest.raises(UserError, match="the zip records"):
        convert_file(src, dest)
    assert not dest.exists() and not list(dest.parent.iterdir())
    convert_file(src, dest, [1, 3])  # layers that did not change still convert, checked layer by layer
    assert torch.equal(read_hidden(dest, [0, 1], 0, 4), hidden[[0, 2]])


def test_bad_file_is_one_line_and_nothing_written(cli, legacy) -> None:
    spec, legacy_root = legacy
    torch.save({"hidden_multi": torch.zeros(4, 6, 2, 3, 8, dtype=torch.bfloat16), "layers": [2, 5, 8, 11]},
               legacy_root / "demo_1.pt", _use_new_zipfile_serialization=False)
    out = legacy_root.parent / "bad"
    result = cli("cache", "convert", str(spec), "--out", str(out))
    assert result.exit_code == 2
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"error: {legacy_root / 'demo_1.pt'}:cache: legacy non-zip torch.save format")
    assert not (out / "demo_1.safetensors").exists()
    bad = cli("cache", "convert", str(spec), "--layers", "some")
    assert bad.exit_code == 2 and "--layers 'some' is not routed|all" in bad.output


def test_rendered_routed_stage_in_runs(legacy, tmp_path: Path) -> None:
    spec, legacy_root = legacy
    dest = tmp_path / "node_local"
    block = _stage_block(True, str(legacy_root), str(dest), str(spec), routed_blocks=[5, 11], suffix=".pt",
                         python=sys.executable)
    assert "-m cache.convert" in block and "--blocks 5,11" in block
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for attempt in range(2):
        done = subprocess.run(["bash", "-c", f"set -u; RUN_DIR={run_dir}\n{block}\necho CACHE=$IDMCTL_CACHE_ROOT"],
                              cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"CACHE={dest}" in done.stdout
    assert "stage-in skipped" in done.stdout and "already holds" in done.stdout
    assert sorted(p.name for p in dest.glob("*.safetensors")) == [f"demo_{i}.safetensors" for i in range(5)]
    assert all(inspect_file(p).layers == [5, 11] for p in dest.glob("*.safetensors"))


def test_preflight_proposes_routed_staging_with_its_numbers() -> None:
    """Card A's sub jobs (6054/6108/6158): 7.15 TB at 0.9 GB/s = 2.2 h ≥ 1 h; 4 of 12 layers = 44 min."""
    card = load_profile("card")[0]
    resolved = load_spec(str(REPO / "experiments" / "mistakes" / "preemptible_sub_stage.yaml"))
    result = qos.check(PreflightContext(resolved, card, Measurements()))
    assert result.status is Status.FAIL
    assert ("stage only the routed layers (stage.layers: routed; 4 of 12 blocks [5, 14, 23, 32]): routed layers "
            "only: 1,871 files × 4 layers × 318,504,960 B = 2,383,691,120,640 B") in result.fix
    assert "÷ NAS 900.0 MB/s = 44.1 min < preempt cycle 60.0 min" in result.fix
    # Following the fix: the stage-in no longer outlasts the cycle (the checkpoint interval still must).
    stage = resolved.spec.stage.model_copy(update={"layers": "routed"})
    fixed = type(resolved)(resolved.name, resolved.path, resolved.spec.model_copy(update={"stage": stage}))
    after = qos.check(PreflightContext(fixed, card, Measurements()))
    assert "preempted before the first step" not in after.summary
    assert after.numbers["stage_bytes"] == 1871 * 4 * 318_504_960
    assert "stage only the routed layers" not in after.fix

    small = card.model_copy(update={"node": card.node.model_copy(update={"scratch": "3TB"})})
    n4 = load_spec("latent_c_n4")
    full = disk.check(PreflightContext(n4, small, Measurements()))
    assert full.status is Status.FAIL
    assert "2,383,691,120,640 B" in full.fix and "fits in 3.0 TB" in full.fix
    dense = disk.check(PreflightContext(load_spec("latent_c_n12_dense"), small, Measurements()))
    assert dense.status is Status.FAIL and "routed" not in dense.fix  # N=12 routes every layer: no such fix

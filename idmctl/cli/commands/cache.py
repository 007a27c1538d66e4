"""``idmctl cache inspect|build-hidden``: the multi-layer hidden-state cache of an experiment."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from idmctl.cli.commands import options
from idmctl.cli.output import console, emit_json
from ground.paths import expand_path
from ground.units import format_bytes
from ground.errors import UserError
from ground.paths import why_not_a_directory

if TYPE_CHECKING:
    from ground.geometry import HiddenGeometry
    from ground.spec.schema import ExperimentSpec

app = typer.Typer(help="The hidden-state cache: inspect its geometry and I/O, build it.", no_args_is_help=True)

SUFFIX = {"safetensors": ".safetensors", "legacy_pt": ".pt"}


def _formula(layers: int, frames: int, geometry: HiddenGeometry) -> str:
    total = layers * frames * geometry.frame_bytes
    return (f"{layers} layers × {frames} frames × {geometry.height} × {geometry.width} × {geometry.channels} × "
            f"{geometry.dtype_bytes} B = {total:,} B ({format_bytes(total)})")


def _on_disk(spec: ExperimentSpec) -> dict[str, Any]:
    """What the cache directory holds, if this machine has it; the first file is validated against the spec."""
    data = spec.data
    root = expand_path(data.cache_root)
    if not root.is_dir():

        return {"present": False, "why": why_not_a_directory(root)}
    files = sorted(root.glob(f"*{SUFFIX[data.cache_format]}"))
    found: dict[str, Any] = {"present": True, "files": len(files),
                             "bytes_on_disk": sum(f.stat().st_size for f in files)}
    if files:
        from cache.hidden import check_matches, inspect_file  # imports torch

        info = inspect_file(files[0])
        check_matches(info, layers=data.cached_layers, frames=data.frames, token_grid=data.token_grid,
                      channels=data.channels, dtype=data.dtype, routed=data.selected_blocks)
        found["checked_file"] = str(files[0])
        found["frame_stride"] = info.frame_stride
        found["encoder"] = info.meta.get("encoder")
        for key in ("vae", "transformer", "text_conditioning"):
            found[key] = info.meta.get(key)
    return found


def cache_report(spec: ExperimentSpec) -> dict[str, Any]:
    """Geometry, bytes per sample for the selection, and the reductions; pure arithmetic plus a disk look."""
    from ground.geometry import HiddenGeometry, sample_io  # start-up: pulls pydantic and yaml

    data = spec.data
    geometry = HiddenGeometry.from_spec(data)
    sliced = sample_io(data, mmap=True)
    whole = sample_io(data, mmap=False)
    report: dict[str, Any] = {
        "cache_root": str(expand_path(data.cache_root)),
        "format": data.cache_format,
        "cached_layers": list(data.cached_layers),
        "shape": [geometry.layers, geometry.frames, geometry.height, geometry.width, geometry.channels],
        "dtype": data.dtype,
        "selected_layer_indices": list(data.selected_layer_indices),
        "selected_blocks": data.selected_blocks,
        "frame_window": data.frame_window,
        "mmap": spec.loader.mmap,
        "sample_bytes": sliced.bytes,
        "sample_formula": sliced.formula,
        "all_layers_bytes": sliced.all_layers_bytes,
        "all_layers_formula": _formula(geometry.layers, data.frame_window, geometry),
        "whole_file_bytes": whole.bytes,
        "whole_file_formula": whole.formula,
        "reduction_vs_all_layers": sliced.reduction_vs_all_layers,
        "reduction_vs_whole_file": sliced.reduction_vs_whole_file,
        "loader_reads_bytes": sample_io(data, spec.loader.mmap).bytes,
        "expected_files": data.cache_files,
        **_on_disk(spec),
    }
    if data.cache_files:
        report["expected_total_bytes"] = data.cache_files * geometry.file_bytes
    return report


@app.command("inspect")
def inspect_cmd(experiment: options.Experiment, as_json: options.Json = False) -> None:
    """Cached layers and shapes, bytes per sample for the spec's selection, and what it saves."""
    from ground.spec import load_spec  # pydantic loads only for cache commands

    resolved = load_spec(experiment)
    report = cache_report(resolved.spec)
    if as_json:
        emit_json({"experiment": resolved.name, **report})
        return
    shape = " × ".join(str(n) for n in report["shape"])
    out = console.print
    out(f"# cache of {resolved.name}: {report['format']} at {report['cache_root']}", markup=False)
    out(f"cached layers   {len(report['cached_layers'])} Cosmos blocks {report['cached_layers']}", markup=False)
    out(f"file shape      (L, T, H, W, C) = {shape} {report['dtype']}", markup=False)
    out(f"selection       indices {report['selected_layer_indices']} → blocks {report['selected_blocks']} "
        f"(N={len(report['selected_blocks'])}), window {report['frame_window']} frames", markup=False)
    out(f"per sample      {report['sample_formula']}", markup=False)
    out(f"all layers      {report['all_layers_formula']}  → {report['reduction_vs_all_layers']:.1f}× less "
        f"with the selection", markup=False)
    out(f"no mmap         {report['whole_file_formula']}  → {report['reduction_vs_whole_file']:.1f}× less "
        f"with mmap + selection", markup=False)
    reads = "the selection (mmap: true)" if report["mmap"] else "whole files (mmap: false)"
    out(f"this spec reads {reads}: {report['loader_reads_bytes']:,} B per sample", markup=False)
    if report.get("expected_files"):
        out(f"expected        {report['expected_files']:,} files × {report['whole_file_bytes']:,} B = "
            f"{report['expected_total_bytes']:,} B ({format_bytes(report['expected_total_bytes'])} = "
            f"{format_bytes(report['expected_total_bytes'], binary=True)})", markup=False)
    if not report["present"]:
        out(f"on this machine: not present ({report['cache_root']} {report.get('why', 'does not exist')}); figures come from the spec",
            markup=False)
    else:
        checked = f", {Path(report['checked_file']).name} matches the spec" if report.get("checked_file") else ""
        out(f"on this machine: {report['files']:,} files, {report['bytes_on_disk']:,} B "
            f"({format_bytes(report['bytes_on_disk'])}){checked}", markup=False)
        for key in ("vae", "transformer", "text_conditioning"):
            if report.get("checked_file"):
                out(f"built by        {key}: {report.get(key) or 'unrecorded'}", markup=False)


@app.command("build-hidden")
def build_hidden_cmd(
    experiment: options.Experiment,
    processes: Annotated[int, typer.Option("--processes", **options.PROCESSES, help="builder ranks (torchrun; work is sharded).")] = 1,
    model_dir: Annotated[str | None, typer.Option("--model-dir", help="Local folder with vae/ and transformer/ "
                                                  "(from_pretrained); default: the spec's data.models.")] = None,
    text_encoder_dir: Annotated[str | None, typer.Option("--text-encoder-dir", help="Local T5 (text_encoder/ + "
                                                         "tokenizer/), used when there is no prompt_embeddings/; default: the spec's "
                                                         "data.text_encoder.")] = None,
    as_json: options.Json = False,
) -> None:
    """Encode every episode with the Wan VAE + frozen Cosmos transformer; cache the spec's blocks' hidden states."""
    from trainers.build_hidden_cache import build_hidden_cache  # imports torch only when building

    from ground.spec import load_spec  # pydantic loads only for cache commands

    resolved = load_spec(experiment)
    summary = build_hidden_cache(resolved.spec, processes=processes, model_dir=model_dir,
                                 text_encoder_dir=text_encoder_dir)
    if as_json:
        emit_json({"experiment": resolved.name, **summary})
        return
    console.print(f"built {summary['built']} files, skipped {summary['skipped']} already cached, "
                  f"{summary['processes']} process(es) → {summary['cache_root']}", markup=False)


def default_convert_out(cache_root: str, blocks: list[int] | None) -> str:
    """``<cache_root>_safetensors`` for all layers, ``<cache_root>_blocks_5-14-23-32`` for routed ones."""
    root = str(expand_path(cache_root)).rstrip("/")
    return f"{root}_blocks_{'-'.join(str(b) for b in blocks)}" if blocks else f"{root}_safetensors"


@app.command("convert")
def convert_cmd(
    experiment: options.Experiment,
    layers: Annotated[str, typer.Option("--layers", help="routed: only the blocks the spec selects; all: every "
                                        "cached block.")] = "all",
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default beside data.cache_root).")] = None,
    as_json: options.Json = False,
) -> None:
    """Convert the cache to our per-layer safetensors: exact reads, verified, resumable, kill-safe."""
    from cache.convert import SUFFIXES, convert_dir  # imports torch only when converting

    from ground.spec import load_spec  # start-up: pulls pydantic and yaml

    if layers not in ("all", "routed"):
        raise UserError(f"--layers {layers!r} is not routed|all", field="--layers", hint="use --layers routed or all")
    resolved = load_spec(experiment)
    data = resolved.spec.data
    blocks = data.selected_blocks if layers == "routed" else None
    dest = out or default_convert_out(data.cache_root, blocks)
    totals = convert_dir(expand_path(data.cache_root), expand_path(dest), SUFFIXES[data.cache_format], blocks,
                         progress=not as_json)
    if as_json:
        emit_json({"experiment": resolved.name, "out": str(dest), "layers": layers, "blocks": blocks, **totals})
        return
    console.print(f"converted {totals['converted']}, already done {totals['skipped']} of {totals['files']} files "
                  f"→ {dest}: read {format_bytes(totals['bytes_read'])}, wrote {format_bytes(totals['bytes_written'])} "
                  f"in {totals['seconds']:.1f} s, every layer verified against its source bytes (CRC-32)", markup=False)
    console.print(f"use it: data.cache_root: {dest} and data.cache_format: safetensors"
                  + (" (a routed-only copy: the spec's cached_layers and selected_layer_indices stay as they are)"
                     if blocks else ""), markup=False)

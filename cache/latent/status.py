"""What the latent cache holds for a spec, slot by slot; pure Python + h5py (no torch), for the CLI.

Per slot: its directory, the hash naming it, files present / expected, leftover temp files; plus
the stale ``_pt__<hash>/`` directories of the same geometry (an older norm file or extractor),
each with the key it was built with, so a directory on disk can always be explained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cache.latent.layout import PT_META_FILE, LatentLayout, cached_files, latent_section, sample_starts, temp_files
from cache.latent.pt_hash import norm_path_for, pt_meta_for
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec import ResolvedSpec


def expected_samples(resolved: ResolvedSpec) -> int | None:
    """Samples the spec's split yields, or None when the episode file is not here."""
    from cache.episodes import EpisodeFile

    latent = latent_section(resolved.spec)
    path = expand_path(resolved.spec.data.episodes)
    if not path.exists():
        return None
    episodes = EpisodeFile(path)
    try:
        return sum(len(sample_starts(latent, episodes.num_samples(demo))) for demo in episodes.demos(latent.split))
    finally:
        episodes.close()


def latent_status(resolved: ResolvedSpec) -> dict[str, Any]:
    latent = latent_section(resolved.spec)
    norm_path = norm_path_for(latent)
    notes: list[str] = []
    pt_meta = None
    if latent.use_pointmap or any(slot == "pt" for slot in latent.slots):
        try:
            pt_meta = pt_meta_for(latent)
        except UserError:
            notes.append(f"PT norm file {norm_path} does not exist yet: build --mode pt first (it computes it)")
    layout = LatentLayout.from_spec(latent, pt_meta.short if pt_meta else None)
    expected = expected_samples(resolved)
    if expected is None:
        notes.append(f"episode file {expand_path(resolved.spec.data.episodes)} is not here: expected counts unknown")
    slots = []
    for slot in latent.slots:
        hashed = slot == "pt" or (slot == "ff" and layout.ff_hashed)
        if hashed and pt_meta is None:
            slots.append({"slot": slot, "dir": None, "hash": None, "present": 0, "expected": expected,
                          "temp_files": 0, "complete": False})
            continue
        directory = layout.slot_dir(slot)
        present = len(cached_files(directory))
        slots.append({"slot": slot, "dir": str(directory), "hash": pt_meta.short if hashed and pt_meta else None,
                      "present": present, "expected": expected, "temp_files": len(temp_files(directory)),
                      "complete": expected is not None and present >= expected})
    current_pt = layout.slot_dir("pt") if pt_meta else None
    stale = [_describe_stale(path) for path in layout.pt_dirs() if path != current_pt]
    return {"experiment": resolved.name, "geometry": layout.geometry, "base": str(layout.base),
            "norm_file": str(norm_path), "pt_hash": pt_meta.short if pt_meta else None,
            "slots": slots, "stale_pt_dirs": stale, "notes": notes}


def _describe_stale(directory: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"dir": str(directory), "hash": directory.name.rpartition("__")[2],
                             "files": len(cached_files(directory)), "norm_files": None, "extractor_version": None}
    sidecar = directory / PT_META_FILE
    if sidecar.exists():
        key = json.loads(sidecar.read_text(encoding="utf-8")).get("key", {})
        entry["norm_files"] = key.get("norm_files")
        entry["extractor_version"] = key.get("extractor_version")
    return entry

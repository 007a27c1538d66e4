"""Spec versions in the store, and the values every consumer derives from a spec."""

from __future__ import annotations

from typing import Any

from ground.spec.loader import ResolvedSpec
from ground.spec.schema import ExperimentSpec


def derived_values(spec: ExperimentSpec) -> dict[str, Any]:
    """Values computed from the spec: shown by ``exp show``, never settable in YAML."""
    return {
        "routing_n": spec.data.routing_n,
        "selected_blocks": spec.data.selected_blocks,
        "world_size": spec.resources.world_size,
        "ranks_per_node": spec.resources.ranks_per_node,
        "grad_accum": spec.grad_accum,
        "persistent_workers": spec.loader.derived_persistent_workers,
        "prefetch_per_worker": spec.loader.effective_prefetch,
        "job_name": spec.resources.job_name,
    }


def register_specs(specs: list[ResolvedSpec]) -> set[str]:
    """Record each spec version (idempotent); returns the hashes that were new."""
    from sqlmodel import select

    from idmctl.store import session
    from idmctl.store.models import SpecVersion

    new: set[str] = set()
    with session() as db:
        for resolved in specs:
            if db.exec(select(SpecVersion).where(SpecVersion.hash == resolved.hash)).first():
                continue
            db.add(SpecVersion(hash=resolved.hash, experiment=resolved.name, source_path=str(resolved.path),
                               resolved_json=resolved.canonical_json))
            new.add(resolved.hash)
    return new

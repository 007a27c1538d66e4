"""Spec versions in the store, and the values every consumer derives from a spec."""

from __future__ import annotations

from ground.spec.loader import ResolvedSpec
from ground.spec.schema import ExperimentSpec
from idmctl.record.models import utcnow
from idmctl.record import session
from idmctl.record.models import SpecVersion
from idmctl.record.url import writer


def derived_values(spec: ExperimentSpec) -> dict[str, object]:
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
    """Record each spec version (idempotent, also across processes); returns the hashes that were new.

    ``INSERT OR IGNORE`` rather than look-then-insert: two submits of one spec at the same moment both
    saw it missing and the second died on the primary key (found by the concurrency test)."""
    from sqlalchemy.dialects import postgresql, sqlite

    user, host = writer()  # a Core insert skips the models' default factories
    new: set[str] = set()
    with session() as db:
        # Both dialects spell it ON CONFLICT DO NOTHING; the team's store is PostgreSQL (IDMCTL_DB_URL).
        insert = postgresql.insert if db.get_bind().dialect.name == "postgresql" else sqlite.insert
        for resolved in specs:
            statement = insert(SpecVersion).values(
                hash=resolved.hash, experiment=resolved.name, source_path=str(resolved.path),
                resolved_json=resolved.canonical_json, registered_at=utcnow(), user=user,
                host=host).on_conflict_do_nothing()
            if db.exec(statement).rowcount:  # type: ignore[call-overload]
                new.add(resolved.hash)
    return new

"""A resolved experiment spec and its canonical form: what names one exact version (its content hash).

Its own module so that the loader, the overrides and the sweeps all stand on it without importing one
another in a circle (the loader expands sweeps; a sweep applies overrides; both make resolved specs).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ground.spec.schema import ExperimentSpec


@dataclass(frozen=True)
class ResolvedSpec:
    """A validated experiment with where it came from and its content hash."""

    name: str
    path: Path
    spec: ExperimentSpec
    chain: list[Path] = field(default_factory=list)
    """The files merged, base first."""
    sweep: str | None = None
    """For a variant of a ``sweep:`` spec, the sweep's name (the file's stem); its name is ``<sweep>.<variant>``."""
    axes: dict[str, Any] = field(default_factory=dict)
    """For a sweep variant, the swept fields and this variant's values."""

    @property
    def canonical(self) -> dict[str, Any]:
        return canonical_spec(self.spec)

    @property
    def canonical_json(self) -> str:
        return canonical_json(self.canonical)

    @property
    def hash(self) -> str:
        """sha256 of the canonical JSON of the resolved spec: names this exact version."""
        return hashlib.sha256(self.canonical_json.encode()).hexdigest()

    @property
    def short_hash(self) -> str:
        return self.hash[:12]


HASH_NEUTRAL_DEFAULTS: dict[tuple[str, str], Any] = {("loader", "repeats"): 1, ("resources", "signal_lead"): None,
                                                     ("data", "models"): "tiny", ("data", "text_encoder"): None,
                                                     ("train", "keep_last"): 2, ("train", "keep_best"): True,
                                                     ("resources", "account"): None, ("resources", "constraint"): None,
                                                     ("resources", "reservation"): None, ("code", "launch"): None,
                                                     ("eval", "resources"): None, ("resources", "build"): None}
"""Fields added after specs were recorded, left out of the canonical form at their default: a spec
that does not use them keeps the hash (and the preflight passes) it had before they existed."""


HASH_NEUTRAL_SECTIONS = ("code",)
"""Sections added after specs were recorded, left out of the canonical form when entirely at their defaults."""


def canonical_spec(spec: ExperimentSpec) -> dict[str, Any]:
    dumped = spec.model_dump(mode="json")
    for section in HASH_NEUTRAL_SECTIONS:  # before the fields: a section at its defaults holds them at theirs
        if dumped.get(section) == type(spec).model_fields[section].default.model_dump(mode="json"):
            del dumped[section]
    for (section, key), default in HASH_NEUTRAL_DEFAULTS.items():
        if isinstance(dumped.get(section), dict) and dumped[section].get(key) == default:
            del dumped[section][key]
    return dumped


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

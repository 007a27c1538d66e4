"""A run directory's ``spec.json``: what ``python -m trainers.train --run-dir DIR`` trains.

Torch-free, so the control plane (``idmctl train``, submit) can write it without heavy imports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.contract import SPEC_FILE
from ground.errors import UserError
from ground.paths import atomic_write_text
from ground.spec.schema import ExperimentSpec

if TYPE_CHECKING:
    from ground.spec.loader import ResolvedSpec



@dataclass(frozen=True)
class RunSpec:
    """``DIR/spec.json``: the experiment's name, hash and canonical spec."""

    run_dir: Path
    name: str
    hash: str
    spec: ExperimentSpec
    canonical: dict[str, Any]


def write_run_spec(run_dir: Path, resolved: "ResolvedSpec") -> Path:
    """Write ``run_dir/spec.json`` (atomic); refuses to repoint a run directory at another spec."""
    path = Path(run_dir) / SPEC_FILE
    if path.exists():
        existing = json.loads(path.read_text())
        if existing.get("hash") != resolved.hash:
            raise UserError(f"run directory holds spec {existing.get('name')} {str(existing.get('hash'))[:12]}, "
                            f"not {resolved.name} {resolved.short_hash}", file=str(path),
                            hint="use a new run directory")
        return path
    atomic_write_text(path, json.dumps({"name": resolved.name, "hash": resolved.hash, "spec": resolved.canonical},
                                       indent=2, sort_keys=True))
    return path


def read_run_spec(run_dir: Path) -> RunSpec:
    path = Path(run_dir) / SPEC_FILE
    if not path.exists():
        raise UserError("no spec.json in the run directory", file=str(path), hint="write it with write_run_spec")
    document = json.loads(path.read_text())
    spec = ExperimentSpec.model_validate(document["spec"])
    return RunSpec(Path(run_dir), document["name"], document["hash"], spec, document["spec"])

"""Experiment specs: one declarative YAML per experiment, the single source of truth."""

from ground.spec.loader import ResolvedSpec, list_experiments, load_experiments, load_spec, resolve_spec_path
from ground.spec.schema import ExperimentSpec, Goal

__all__ = ["ExperimentSpec", "Goal", "ResolvedSpec", "list_experiments", "load_experiments", "load_spec", "resolve_spec_path"]

"""A frozen copy of the quickstart spec for the cache tests, so edits to the shipped one cannot move them.

``use_hidden_quick(monkeypatch, tmp_path)`` points ``$IDMCTL_EXPERIMENTS`` at a folder holding it as
``quickstart.yaml`` (CLI tests then run ``idmctl cache ... quickstart`` against this geometry).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.contract import ENV_EXPERIMENTS

QUICK_YAML = """\
description: frozen quickstart geometry for the hidden-cache tests
data:
  episodes: ${IDMCTL_HOME}/quickstart/demos.hdf5
  train_split: train
  eval_split: valid
  cache_root: ${IDMCTL_HOME}/quickstart/hidden_cache
  cache_format: safetensors
  dataset: hidden_multilayer
  cached_layers: [0, 1, 2, 3]
  frames: 8
  token_grid: [4, 4]
  channels: 32
  dtype: float32
  selected_layer_indices: [0, 2]
  frame_window: 2
  action_horizon: 8
  action_dim: 7
model:
  depth: 2
  hidden_dim: 32
  num_heads: 2
  kv_dim: 32
  mlp_ratio: 2.0
  timestep_dim: 32
  inference_steps: 4
loader:
  batch_size: 4
  num_workers: 0
  mmap: true
train:
  steps: 200
  lr: 3.0e-3
  effective_batch: 8
  checkpoint_every: 50
  log_every: 10
resources:
  gpus_per_node: 0
  cpu_ranks: 1
  cpus: 2
  mem: 4GB
  qos: core-own
  time_limit: "0:30:00"
eval:
  metric: eef_mm_4ep
  episodes: [4]
goal: eef_mm_4ep <= 60
"""


def use_hidden_quick(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    folder = tmp_path / "experiments"
    folder.mkdir(exist_ok=True)
    (folder / "quickstart.yaml").write_text(QUICK_YAML)
    monkeypatch.setenv(ENV_EXPERIMENTS, str(folder))
    return folder

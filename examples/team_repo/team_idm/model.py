"""A tiny layer-routed inverse-dynamics model: hidden-state windows in, an action chunk out.

Each routed Cosmos layer has its own projector (the card's kv_projectors, 5120 -> 1024 at full size);
the projected tokens are pooled per layer, and an MLP over the N pooled vectors predicts the chunk.
Constructor keyword arguments only, so a spec's ``init_args`` bind to ``__init__`` as they are.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyIDM(nn.Module):
    def __init__(self, num_layers: int, channels: int, action_dim: int, action_horizon: int,
                 hidden_dim: int = 32):
        super().__init__()
        self.num_layers = num_layers
        self.action_dim = action_dim
        self.action_horizon = action_horizon
        self.projectors = nn.ModuleList(nn.Linear(channels, hidden_dim) for _ in range(num_layers))
        self.head = nn.Sequential(nn.Linear(num_layers * hidden_dim, hidden_dim), nn.GELU(),
                                  nn.Linear(hidden_dim, action_horizon * action_dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` (B, N, T, H, W, C) -> actions (B, action_horizon, action_dim)."""
        if hidden.shape[1] != self.num_layers:
            raise ValueError(f"got {hidden.shape[1]} hidden layers per sample, the model routes {self.num_layers}")
        pooled = [proj(hidden[:, i].flatten(1, -2)).mean(dim=1) for i, proj in enumerate(self.projectors)]
        return self.head(torch.cat(pooled, dim=-1)).view(-1, self.action_horizon, self.action_dim)

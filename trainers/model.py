"""Latent-IDM C: the layer-routed action DiT with a GR00T-style flow-matching head, top to bottom.

Shapes: B batch, N routed Cosmos layers, T_w frames, (H, W) token grid, C Cosmos channels,
S = T_w·H·W context tokens, A action horizon, a action size, D hidden width.

1. ``kv_projectors[j]``: Cosmos layer j's tokens (B, S, C) → (B, S, kv_dim), one Linear per layer.
2. ``routing_map(N, depth)``: DiT block i cross-attends only to projected layer f(i).
3. Each DiT block: AdaLN → self-attention over the A action tokens, AdaLN → cross-attention to
   its routed layer, LayerNorm → MLP. AdaLN's shift/scale come from the timestep embedding.
4. Action encoder (actions + time → D) in, action decoder (D → velocity) out: GR00T's
   flow-matching head (NVIDIA Isaac-GR00T, ``gr00t/model/action_head/flow_matching_action_head.py``):
   each Linear is category-specific, one weight per embodiment (``num_embodiments``, GR00T's default
   32), picked by the sample's embodiment id. Their widths are the DiT's (GR00T's encoder width is its
   DiT's input width, its decoder's hidden width its ``hidden_size``, 1024 as here): no width of
   their own, so nothing can be sized to meet a parameter count. GR00T's state encoder is not built:
   the IDM's samples carry no robot state (``cache.dataset`` yields hidden states, actions, mask).

Time convention (GR00T's; openpi uses the opposite one): t = 0 is pure noise, t = 1 the clean
action. x_t = (1 − t)·noise + t·action; the network predicts the velocity v = action − noise
(masked MSE). Training draws s ~ Beta(1.5, 1) and uses t = 1 − s, so t crowds the noisy end
(E[t] = 0.4). Inference integrates K Euler steps from t = 0 to 1: x ← x + v(x, t)·(1/K).
The context (each layer's K/V) does not depend on t, so it is projected once per sample and
reused by every denoising step (:meth:`LayerRoutedActionDiT.encode_context`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class RoutedDiTConfig:
    """Everything that fixes the architecture; built from a spec by ``trainers.registry``."""

    n_layers: int
    """N: Cosmos layers routed in, one KV projector each."""
    cosmos_channels: int
    """C: hidden size of the cached Cosmos layers."""
    depth: int
    """D: DiT blocks."""
    hidden_dim: int
    """Width of the DiT residual stream."""
    num_heads: int
    """Attention heads (self and cross)."""
    kv_dim: int
    """Output width of each KV projector."""
    mlp_ratio: float
    """MLP width as a multiple of ``hidden_dim``."""
    action_dim: int
    """a: size of one action."""
    action_horizon: int
    """A: actions per chunk (the DiT's sequence length)."""
    num_embodiments: int
    """Embodiments the action encoder/decoder keep one weight set each for (GR00T: 32)."""
    timestep_dim: int
    """Size of the sinusoidal timestep features."""
    inference_steps: int
    """K: Euler steps at inference."""
    time_beta: tuple[float, float] = (1.5, 1.0)
    """s ~ Beta(a, b) and t = 1 − s during training."""


def routing_map(n_layers: int, depth: int) -> list[int]:
    """Block i → routed layer index f(i) = ⌊i·N/D⌋: contiguous, in order, every layer used.

    N = D gives 1:1; D = k·N gives each layer k consecutive blocks (N=4, D=12 → 0,0,0,1,1,1,...).
    Every block cross-attends. D < N would leave layers read from disk but never attended, so it
    is refused.
    """
    if n_layers < 1 or depth < 1:
        raise ValueError(f"routing needs N ≥ 1 and depth ≥ 1, got N={n_layers}, depth={depth}")
    if depth < n_layers:
        raise ValueError(f"depth {depth} < N={n_layers}: {n_layers - depth} routed layers would never be attended")
    return [block * n_layers // depth for block in range(depth)]


def sinusoidal_embedding(t: Tensor, dim: int, max_period: float = 10_000.0) -> Tensor:
    """(B,) times in [0, 1] → (B, dim) sin/cos features of t·1000 (the DiT/GR00T scale)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = (t.float() * 1000.0)[:, None] * freqs[None]
    embedding = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    if dim % 2:
        embedding = F.pad(embedding, (0, 1))
    return embedding


class TimestepEmbedding(nn.Module):
    """t → sinusoid → MLP → (B, D): conditions every AdaLN."""

    def __init__(self, timestep_dim: int, hidden_dim: int):
        super().__init__()
        self.timestep_dim = timestep_dim
        self.mlp = nn.Sequential(nn.Linear(timestep_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, hidden_dim))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(sinusoidal_embedding(t, self.timestep_dim).to(self.mlp[0].weight.dtype))


class CategorySpecificLinear(nn.Module):
    """A Linear with one weight and bias per category (embodiment): (B, L, in) → (B, L, out)."""

    def __init__(self, categories: int, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(categories, in_dim, out_dim))
        self.bias = nn.Parameter(torch.zeros(categories, out_dim))

    def forward(self, x: Tensor, category: Tensor) -> Tensor:
        return torch.bmm(x, self.weight[category]) + self.bias[category][:, None]


class ActionEncoder(nn.Module):
    """GR00T's multi-embodiment action encoder: W1(action) ‖ sinusoid(t) → W2 → swish → W3 → (B, A, D)."""

    def __init__(self, action_dim: int, hidden_dim: int, num_embodiments: int):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.w1 = CategorySpecificLinear(num_embodiments, action_dim, hidden_dim)
        self.w2 = CategorySpecificLinear(num_embodiments, 2 * hidden_dim, hidden_dim)
        self.w3 = CategorySpecificLinear(num_embodiments, hidden_dim, hidden_dim)

    def forward(self, actions: Tensor, t: Tensor, embodiment: Tensor) -> Tensor:
        a = self.w1(actions, embodiment)
        tau = sinusoidal_embedding(t, self.hidden_dim).to(a.dtype)[:, None].expand_as(a)
        return self.w3(F.silu(self.w2(torch.cat([a, tau], dim=-1), embodiment)), embodiment)


class ActionDecoder(nn.Module):
    """GR00T's category-specific MLP: (B, A, D) → ReLU hidden layer of width D → (B, A, a) velocity."""

    def __init__(self, hidden_dim: int, action_dim: int, num_embodiments: int):
        super().__init__()
        self.layer1 = CategorySpecificLinear(num_embodiments, hidden_dim, hidden_dim)
        self.layer2 = CategorySpecificLinear(num_embodiments, hidden_dim, action_dim)

    def forward(self, x: Tensor, embodiment: Tensor) -> Tensor:
        return self.layer2(F.relu(self.layer1(x, embodiment)), embodiment)


class AdaLayerNorm(nn.Module):
    """LayerNorm whose shift and scale are predicted from the timestep embedding."""

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_dim, elementwise_affine=False, eps=1e-6)
        self.modulation = nn.Linear(hidden_dim, 2 * hidden_dim)

    def forward(self, x: Tensor, t_emb: Tensor) -> Tensor:
        shift, scale = self.modulation(F.silu(t_emb))[:, None].chunk(2, dim=-1)
        return self.norm(x) * (1 + scale) + shift


class SelfAttention(nn.Module):
    def __init__(self, hidden_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_dim, 3 * hidden_dim)
        self.out = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (_split_heads(part, self.num_heads) for part in self.qkv(x).chunk(3, dim=-1))
        return self.out(_merge_heads(F.scaled_dot_product_attention(q, k, v)))


class CrossAttention(nn.Module):
    """Queries from the action tokens; keys/values from one routed Cosmos layer (precomputed)."""

    def __init__(self, hidden_dim: int, kv_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(hidden_dim, hidden_dim)
        self.kv = nn.Linear(kv_dim, 2 * hidden_dim)
        self.out = nn.Linear(hidden_dim, hidden_dim)

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, kv_dim) → per-head K and V (B, heads, S, D/heads): once per sample, not per step."""
        k, v = self.kv(context).chunk(2, dim=-1)
        return _split_heads(k, self.num_heads), _split_heads(v, self.num_heads)

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor]) -> Tensor:
        q = _split_heads(self.q(x), self.num_heads)
        return self.out(_merge_heads(F.scaled_dot_product_attention(q, kv[0], kv[1])))


def _split_heads(x: Tensor, heads: int) -> Tensor:
    batch, length, width = x.shape
    return x.view(batch, length, heads, width // heads).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)


class DiTBlock(nn.Module):
    def __init__(self, cfg: RoutedDiTConfig):
        super().__init__()
        d = cfg.hidden_dim
        self.norm_self = AdaLayerNorm(d)
        self.self_attn = SelfAttention(d, cfg.num_heads)
        self.norm_cross = AdaLayerNorm(d)
        self.cross_attn = CrossAttention(d, cfg.kv_dim, cfg.num_heads)
        self.norm_mlp = nn.LayerNorm(d)
        hidden = int(d * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, d))

    def forward(self, x: Tensor, t_emb: Tensor, kv: tuple[Tensor, Tensor]) -> Tensor:
        x = x + self.self_attn(self.norm_self(x, t_emb))
        x = x + self.cross_attn(self.norm_cross(x, t_emb), kv)
        return x + self.mlp(self.norm_mlp(x))


Context = list[tuple[Tensor, Tensor]]
"""Per DiT block, the (K, V) of its routed layer."""


class LayerRoutedActionDiT(nn.Module):
    """Block i of the DiT cross-attends only to Cosmos layer ``routing[i]``."""

    def __init__(self, cfg: RoutedDiTConfig):
        super().__init__()
        self.cfg = cfg
        self.routing = routing_map(cfg.n_layers, cfg.depth)
        self.kv_projectors = nn.ModuleList(nn.Linear(cfg.cosmos_channels, cfg.kv_dim) for _ in range(cfg.n_layers))
        self.time_embedding = TimestepEmbedding(cfg.timestep_dim, cfg.hidden_dim)
        self.action_encoder = ActionEncoder(cfg.action_dim, cfg.hidden_dim, cfg.num_embodiments)
        self.action_position = nn.Parameter(torch.zeros(cfg.action_horizon, cfg.hidden_dim))
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.norm_out = AdaLayerNorm(cfg.hidden_dim)
        self.action_decoder = ActionDecoder(cfg.hidden_dim, cfg.action_dim, cfg.num_embodiments)
        self.apply(_init_weights)

    # -- context -------------------------------------------------------------------------------
    def encode_context(self, hidden: Tensor) -> Context:
        """(B, N, T_w, H, W, C) cached layers → each block's (K, V); independent of t."""
        if hidden.shape[1] != self.cfg.n_layers:
            raise ValueError(f"hidden has {hidden.shape[1]} layers, the model routes {self.cfg.n_layers}")
        dtype = self.kv_projectors[0].weight.dtype
        projected = [proj(hidden[:, j].flatten(1, 3).to(dtype)) for j, proj in enumerate(self.kv_projectors)]
        return [block.cross_attn.project_kv(projected[self.routing[i]]) for i, block in enumerate(self.blocks)]

    # -- the velocity field --------------------------------------------------------------------
    def velocity(self, x_t: Tensor, t: Tensor, context: Context, embodiment: Tensor | None = None) -> Tensor:
        """Predicted v = action − noise at (x_t, t); x_t (B, A, a), t (B,), embodiment (B,) ids (default 0)."""
        if embodiment is None:
            embodiment = torch.zeros(x_t.shape[0], dtype=torch.long, device=x_t.device)
        t_emb = self.time_embedding(t)
        x = self.action_encoder(x_t, t, embodiment) + self.action_position[: x_t.shape[1]]
        for block, kv in zip(self.blocks, context):
            x = block(x, t_emb, kv)
        return self.action_decoder(self.norm_out(x, t_emb), embodiment)

    # -- training ------------------------------------------------------------------------------
    def forward(self, hidden: Tensor, actions: Tensor, action_mask: Tensor,
                generator: torch.Generator | None = None) -> Tensor:
        """Flow-matching loss: masked MSE between predicted and true velocity at a random t."""
        noise, t = self.draw_noise_and_time(actions, generator)
        x_t = interpolate(noise, actions, t)
        predicted = self.velocity(x_t, t, self.encode_context(hidden))
        return masked_mse(predicted, actions - noise, action_mask)

    def draw_noise_and_time(self, actions: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """Noise ~ N(0, I) and t = 1 − Beta(a, b), drawn on the CPU generator so runs replay exactly."""
        a, b = self.cfg.time_beta
        noise = torch.randn(actions.shape, generator=generator, dtype=torch.float32)
        t = sample_time(actions.shape[0], a, b, generator)
        return noise.to(actions.device, actions.dtype), t.to(actions.device)

    # -- inference -----------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, hidden: Tensor, steps: int | None = None, generator: torch.Generator | None = None) -> Tensor:
        """(B, N, T_w, H, W, C) → action chunks (B, A, a) by K Euler steps from noise."""
        batch = hidden.shape[0]
        shape = (batch, self.cfg.action_horizon, self.cfg.action_dim)
        noise = torch.randn(shape, generator=generator).to(hidden.device, self.kv_projectors[0].weight.dtype)
        context = self.encode_context(hidden)
        return euler_integrate(lambda x, t: self.velocity(x, t, context), noise, steps or self.cfg.inference_steps)


def interpolate(noise: Tensor, actions: Tensor, t: Tensor) -> Tensor:
    """x_t = (1 − t)·noise + t·action; t (B,) broadcast over the chunk."""
    t = t.to(actions.dtype).view(-1, *([1] * (actions.ndim - 1)))
    return (1 - t) * noise + t * actions


def sample_time(batch: int, a: float, b: float, generator: torch.Generator | None = None) -> Tensor:
    """t = 1 − s with s ~ Beta(a, b): GR00T's skew towards the noisy end (t = 0).

    Beta is drawn as X/(X+Y) with X ~ Gamma(a), Y ~ Gamma(b) through ``torch._standard_gamma``
    so it honours ``generator`` (``torch.distributions.Beta`` does not take one).
    """
    alphas = torch.full((batch,), a, dtype=torch.float64)
    betas = torch.full((batch,), b, dtype=torch.float64)
    x = torch._standard_gamma(alphas, generator=generator)
    y = torch._standard_gamma(betas, generator=generator)
    return (1.0 - x / (x + y)).float()


def masked_mse(predicted: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error over the valid steps of each chunk (mask (B, A) bool) and all action dims."""
    weights = mask.to(predicted.dtype)[..., None]
    squared = (predicted.float() - target.float()) ** 2 * weights
    return squared.sum() / (weights.sum() * predicted.shape[-1]).clamp_min(1.0)


def euler_integrate(velocity: Callable[[Tensor, Tensor], Tensor], noise: Tensor, steps: int) -> Tensor:
    """Integrate dx/dt = v(x, t) from t = 0 (noise) to t = 1 (action) in ``steps`` equal Euler steps."""
    x, dt = noise, 1.0 / steps
    for k in range(steps):
        t = torch.full((noise.shape[0],), k * dt, device=noise.device)
        x = x + dt * velocity(x, t)
    return x


def _init_weights(module: nn.Module) -> None:
    # Zero-init the AdaLN modulation so every block starts as plain LayerNorm (DiT's adaLN-zero idea).
    if isinstance(module, AdaLayerNorm):
        nn.init.zeros_(module.modulation.weight)
        nn.init.zeros_(module.modulation.bias)
    elif isinstance(module, CategorySpecificLinear) and module.weight.device.type != "meta":
        # Xavier per embodiment, like the Linears here; GR00T's fixed 0.02·randn suits its 1536 width
        # only (at a tiny width the head starts near zero and barely learns).
        for weight in module.weight:
            nn.init.xavier_uniform_(weight)
    elif isinstance(module, nn.Linear) and module.weight.device.type != "meta":
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)

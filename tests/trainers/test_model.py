"""The layer-routed DiT: routing maps, the flow-matching time convention, K/V reuse, parameter table."""

from __future__ import annotations

import pytest
import torch

from ground.spec.loader import load_spec
from trainers.model import (LayerRoutedActionDiT, RoutedDiTConfig, euler_integrate, interpolate, masked_mse,
                            routing_map, sample_time)
from trainers.registry import build_model, parameter_table

torch.set_num_threads(1)


def tiny_config(**overrides: object) -> RoutedDiTConfig:
    values = dict(n_layers=2, cosmos_channels=8, depth=4, hidden_dim=16, num_heads=2, kv_dim=8, mlp_ratio=2.0,
                  action_dim=3, action_horizon=5, num_embodiments=2, timestep_dim=8, inference_steps=4)
    values.update(overrides)
    return RoutedDiTConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "depth", "expected"), [
    (4, 4, [0, 1, 2, 3]),
    (4, 12, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]),
    (6, 12, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
    (12, 12, list(range(12))),
])
def test_routing_map_pins_card_variants(n: int, depth: int, expected: list[int]) -> None:
    assert routing_map(n, depth) == expected


def test_routing_refuses_layers_that_no_block_reads() -> None:
    with pytest.raises(ValueError, match="depth 4 < N=12"):
        routing_map(12, 4)


def test_interpolation_runs_from_noise_at_t0_to_action_at_t1() -> None:
    noise, action = torch.randn(3, 5, 2), torch.randn(3, 5, 2)
    assert torch.equal(interpolate(noise, action, torch.zeros(3)), noise)
    assert torch.equal(interpolate(noise, action, torch.ones(3)), action)
    half = interpolate(noise, action, torch.full((3,), 0.25))
    torch.testing.assert_close(half, 0.75 * noise + 0.25 * action)


@pytest.mark.parametrize("steps", [1, 4])
def test_euler_with_the_true_velocity_lands_on_the_action(steps: int) -> None:
    # On the straight path the velocity action − noise is constant, so Euler is exact for any K.
    noise, action = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    times: list[float] = []

    def oracle(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        times.append(float(t[0]))
        torch.testing.assert_close(x, interpolate(noise, action, t))
        return action - noise

    torch.testing.assert_close(euler_integrate(oracle, noise, steps), action)
    assert times == [k / steps for k in range(steps)]


def test_training_time_is_skewed_to_the_noisy_end() -> None:
    t = sample_time(20_000, 1.5, 1.0, torch.Generator().manual_seed(0))
    assert 0.0 <= float(t.min()) and float(t.max()) <= 1.0
    # t = 1 − Beta(1.5, 1): mean 1 − 1.5/2.5 = 0.4, P(t < 0.5) = 1 − 0.5**1.5 ≈ 0.646.
    assert abs(float(t.mean()) - 0.4) < 0.01
    assert abs(float((t < 0.5).float().mean()) - (1 - 0.5 ** 1.5)) < 0.015
    again = sample_time(20_000, 1.5, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(t, again)


def test_masked_steps_do_not_count() -> None:
    target = torch.zeros(1, 4, 2)
    mask = torch.tensor([[True, True, False, False]])
    predicted = torch.tensor([[[1.0, 1.0], [3.0, 3.0], [100.0, 100.0], [-50.0, 7.0]]])
    assert float(masked_mse(predicted, target, mask)) == pytest.approx((1 + 1 + 9 + 9) / 4)


def test_kv_is_projected_once_per_sample_across_denoising_steps() -> None:
    cfg = tiny_config(n_layers=2, depth=4, inference_steps=4)
    model = LayerRoutedActionDiT(cfg).eval()
    projector_calls = [0] * cfg.n_layers
    block_kv_calls = [0] * cfg.depth
    velocity_calls = [0]
    for j, proj in enumerate(model.kv_projectors):
        proj.register_forward_hook(lambda *_, j=j: projector_calls.__setitem__(j, projector_calls[j] + 1))
    for i, block in enumerate(model.blocks):
        block.cross_attn.kv.register_forward_hook(lambda *_, i=i: block_kv_calls.__setitem__(i, block_kv_calls[i] + 1))
    model.time_embedding.register_forward_hook(lambda *_: velocity_calls.__setitem__(0, velocity_calls[0] + 1))
    hidden = torch.randn(3, cfg.n_layers, 2, 2, 2, cfg.cosmos_channels)
    actions = model.sample(hidden, generator=torch.Generator().manual_seed(0))
    assert actions.shape == (3, cfg.action_horizon, cfg.action_dim)
    assert velocity_calls[0] == 4
    assert projector_calls == [1, 1]
    assert block_kv_calls == [1, 1, 1, 1]


def test_block_reads_only_its_routed_layer() -> None:
    cfg = tiny_config(n_layers=2, depth=4)
    model = LayerRoutedActionDiT(cfg)
    hidden = torch.randn(1, 2, 1, 2, 2, cfg.cosmos_channels)
    context = model.encode_context(hidden)
    changed = hidden.clone()
    changed[:, 1] += 1.0  # layer 1 feeds blocks 2 and 3 only (routing [0, 0, 1, 1])
    context_changed = model.encode_context(changed)
    for block in range(4):
        same = torch.equal(context[block][0], context_changed[block][0])
        assert same == (model.routing[block] == 0)


def test_tiny_model_learns_a_fixed_batch() -> None:
    torch.manual_seed(0)
    cfg = tiny_config()
    model = LayerRoutedActionDiT(cfg)
    hidden = torch.randn(4, cfg.n_layers, 1, 2, 2, cfg.cosmos_channels)
    actions = torch.randn(4, cfg.action_horizon, cfg.action_dim)
    mask = torch.ones(4, cfg.action_horizon, dtype=torch.bool)

    def held_out_loss() -> float:
        # The same noise and times before and after training, so only the weights differ.
        with torch.no_grad():
            return float(model(hidden.repeat(8, 1, 1, 1, 1, 1), actions.repeat(8, 1, 1), mask.repeat(8, 1),
                               generator=torch.Generator().manual_seed(123)))

    before = held_out_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(90):
        loss = model(hidden, actions, mask, generator=generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert held_out_loss() < 0.9 * before


def _groot_head_count(n: int, channels: int, depth: int, d: int, kv: int, mlp_ratio: float, a: int, horizon: int,
                      timestep_dim: int, embodiments: int) -> dict[str, int]:
    """Parameters counted from the formulas of card A's routed DiT and GR00T's flow-matching head
    (Isaac-GR00T's MultiEmbodimentActionEncoder, CategorySpecificMLP decoder, TimestepEncoder),
    written out here independently of the model's code."""
    def linear(i: int, o: int) -> int:
        return i * o + o

    ada_ln = linear(d, 2 * d)
    hidden = int(d * mlp_ratio)
    block = (2 * ada_ln + linear(d, 3 * d) + linear(d, d)                  # AdaLNs, self-attention
             + linear(d, d) + linear(kv, 2 * d) + linear(d, d)             # cross-attention q, kv, out
             + 2 * d + linear(d, hidden) + linear(hidden, d))              # LayerNorm, MLP
    encoder = embodiments * (linear(a, d) + linear(2 * d, d) + linear(d, d))   # W1, W2, W3
    decoder = embodiments * (linear(d, d) + linear(d, a))                      # layer1, layer2
    timestep = linear(timestep_dim, d) + linear(d, d)
    parts = {"dit": depth * block, "kv_projectors": n * linear(channels, kv),
             "action_io": encoder + decoder + timestep + horizon * d + ada_ln}  # + positions, output AdaLN
    return {**parts, "total": sum(parts.values())}


def test_card_model_total_is_the_groot_head_count_computed_on_the_meta_device() -> None:
    spec = load_spec("latent_c_n4").spec
    model = build_model(spec, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    m, data = spec.model, spec.data
    expected = _groot_head_count(data.routing_n, data.channels, m.depth, m.hidden_dim, m.kv_dim, m.mlp_ratio,
                                 data.action_dim, data.action_horizon, m.timestep_dim, m.num_embodiments)
    assert parameter_table(model) == expected
    assert expected["total"] == sum(p.numel() for p in model.parameters())
    assert m.num_embodiments == 32 and m.hidden_dim == 1024  # GR00T's max_num_embodiments and hidden_size


def test_no_width_of_the_action_head_is_configurable() -> None:
    # The head's widths are the DiT's (as in GR00T): a spec cannot size it to meet a parameter count.
    from ground.spec.schema import ModelSpec

    assert not [name for name in ModelSpec.model_fields if name.startswith("action")]


def test_model_summary_marks_the_card_figures_and_shows_the_difference(cli) -> None:
    result = cli("model", "summary", "latent_c_n4")
    assert result.exit_code == 0, result.output
    total = parameter_table(build_model(load_spec("latent_c_n4").spec, device="meta"))["total"]
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:5]]
            for line in result.output.splitlines() if line.startswith("│")}
    assert rows["total trainable"] == [f"{total:,}", f"{total / 1e6:.1f}M", "242.6M (card)"]
    assert rows["DiT blocks"][2] == "84.2M (card)" and rows["KV projectors"][2] == "20.5M (card)"
    assert rows["action enc/dec, timestep, position, out-norm"][2] == "~138M (card)"
    difference = total - 242.6e6
    assert (f"total {total:,} computed − 242.6M (card) = {difference / 1e6:+.2f}M ({difference / 242.6e6:+.2%}); "
            "why they differ: runbook, The routed DiT") in result.output


def test_model_summary_command_prints_the_card_table_and_routing(cli) -> None:
    result = cli("model", "summary", "latent_c_n4_d12")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "N=4 routed layers, depth 12" in lines[0]
    assert any("KV projectors" in line and "20,975,616" in line and "20.5M (card)" in line for line in lines)
    assert "KV projectors: 4 × (5120 × 1024 + 1024) = 20,975,616 exactly" in result.output
    assert "card A's 242.6M (card) is for N=4, depth 4: no difference shown" in result.output
    rows = [line.split("│")[1:5] for line in lines if line.startswith("│") and line.split("│")[1].strip().isdigit()]
    routing = [tuple(cell.strip() for cell in row) for row in rows]
    assert routing == [(str(b), str(b // 3), str([1, 4, 7, 10][b // 3]), str([5, 14, 23, 32][b // 3]))
                       for b in range(12)]


def test_model_summary_json_matches_the_meta_model(cli) -> None:
    import json

    result = cli("model", "summary", "latent_c_n4", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["params"] == parameter_table(build_model(load_spec("latent_c_n4").spec, device="meta"))
    assert document["total_minus_card"] == document["params"]["total"] - 242_600_000
    assert [row["cosmos_block"] for row in document["routing"]] == [5, 14, 23, 32]


def test_depth_below_n_is_a_one_line_spec_error(cli, tmp_path) -> None:
    path = tmp_path / "too_shallow.yaml"
    path.write_text("extends: latent_c_n12_dense\nmodel:\n  depth: 4\n")
    result = cli("model", "summary", str(path))
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: {path}:model.depth: depth 4 < N=12: 8 routed layers would never be attended "
                                     "(use depth ≥ 12 or select fewer layers)")

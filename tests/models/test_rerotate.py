"""Moving a cached key to a new position by rotating it by the position difference."""

import torch

from vidsight.models.decoder import apply_rotary


def test_mrope_delta_rotation_equals_rotating_the_raw_key_at_the_new_position(tiny_adapter):
    torch.manual_seed(0)
    raw = torch.randn(1, tiny_adapter.num_kv_heads, 6, tiny_adapter.head_dim)
    old = torch.tensor([[4, 4, 4, 9, 9, 30], [4, 5, 6, 9, 10, 30], [4, 6, 5, 11, 9, 30]])
    new = old + torch.tensor([[-8], [0], [0]])  # a window slid by 8 temporal ticks
    new[:, -1] += 5                             # a text token moved on all three axes
    cached = apply_rotary(raw, tiny_adapter.rotary(old))
    moved = tiny_adapter.rerotate_keys(cached, old, new)
    assert torch.allclose(moved, apply_rotary(raw, tiny_adapter.rotary(new)), atol=1e-5)
    assert not torch.allclose(moved, cached, atol=1e-3)


def test_one_dimensional_rope_delta_rotation():
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    rope = Qwen2RotaryEmbedding(Qwen2Config(hidden_size=64, num_attention_heads=2, rope_theta=10000.0))
    torch.manual_seed(1)
    raw = torch.randn(1, 2, 5, 32)

    def rotary(positions):
        return rope(raw, positions[None])

    old = torch.tensor([3, 10, 11, 50, 400])
    new = old - 7
    moved = apply_rotary(apply_rotary(raw, rotary(old)), rotary(new - old))
    assert torch.allclose(moved, apply_rotary(raw, rotary(new)), atol=1e-4)

"""The Qwen vision towers' attention batched by sequence length: the attention of each sequence
alone, in one call per length, and transformers' own forward back in place after."""

import pytest
import torch
import torch.nn.functional as F

from vidsight.models import vision_attention
from vidsight.models.vision_attention import grouped_attention, grouped_vision_attention
from vidsight.vision import preprocess_video


def per_sequence(query, key, value, cu_seqlens, scaling):
    """The definition: each sequence's attention over itself alone, ``(tokens, heads, dim)``."""
    outputs = []
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        weights = torch.softmax(q @ k.transpose(-1, -2) * scaling, dim=-1)
        outputs.append((weights @ v).transpose(0, 1))
    return torch.cat(outputs)


def count_attention_calls(monkeypatch):
    calls, attention = [], F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return attention(*args, **kwargs)

    monkeypatch.setattr(vision_attention.F, "scaled_dot_product_attention", counted)
    return calls


def test_each_sequence_attends_over_itself_alone_one_call_per_length(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    lengths = [16, 4, 16, 0, 8, 16, 4, 12]   # an empty sequence, as a pruned window gives
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    query, key, value = (torch.randn(sum(lengths), 3, 8, generator=generator) for _ in range(3))
    calls = count_attention_calls(monkeypatch)
    out = grouped_attention(query, key, value, cu_seqlens, scaling=8 ** -0.5)
    torch.testing.assert_close(out, per_sequence(query, key, value, cu_seqlens, 8 ** -0.5), rtol=0, atol=1e-6)
    assert sorted(shape[0] * shape[2] for shape in calls) == [4 * 2, 8, 12, 16 * 3]   # sequences x length
    # A token's output depends on its own sequence only: changing another sequence's keys changes nothing.
    changed = key.clone()
    changed[:16] += 1.0
    again = grouped_attention(query, changed, value, cu_seqlens, scaling=8 ** -0.5)
    assert torch.equal(again[16:], out[16:]) and not torch.allclose(again[:16], out[:16])


def test_more_sequences_than_one_call_takes_go_over_several(monkeypatch):
    monkeypatch.setattr(vision_attention, "MAX_SEQUENCES", 3)
    cu_seqlens = torch.arange(0, 8 * 5, 5, dtype=torch.int32)   # seven sequences of 5
    query, key, value = (torch.randn(35, 2, 4, generator=torch.Generator().manual_seed(s)) for s in range(3))
    calls = count_attention_calls(monkeypatch)
    out = grouped_attention(query, key, value, cu_seqlens, scaling=0.5)
    assert [shape[0] for shape in calls] == [3, 3, 1]
    torch.testing.assert_close(out, per_sequence(query, key, value, cu_seqlens, 0.5), rtol=0, atol=1e-6)


def encode(adapter, keep_share=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    clip = torch.randint(0, 256, (6, 280, 336, 3), dtype=torch.uint8, generator=generator)  # several windows a frame
    video = preprocess_video(clip, adapter.vision)
    keep = None
    if keep_share is not None:
        t, h, w = video.grid_thw
        keep = torch.rand(t, h // 2, w // 2, generator=generator) < keep_share
    with torch.inference_mode():
        return adapter.encode_video(video.pixel_values, video.grid_thw, keep), video, keep


@pytest.mark.parametrize("family", ["tiny_adapter", "qwen3_adapter"])
@pytest.mark.parametrize("keep_share", [None, 0.4], ids=["whole", "pruned"])
def test_the_tower_encodes_as_transformers_own_forward(family, keep_share, request, monkeypatch):
    adapter = request.getfixturevalue(family)
    tower = adapter._visual
    layers = sum(type(m).__name__ in vision_attention._ATTENTION_CLASSES for m in tower.modules())
    forwards, grouped_forward = [], vision_attention._forward

    def counted(self, *args, **kwargs):
        forwards.append(self)
        return grouped_forward(self, *args, **kwargs)

    plans, length_plan = [], vision_attention.length_plan

    def planned(cu_seqlens):
        plans.append(cu_seqlens)
        return length_plan(cu_seqlens)

    monkeypatch.setattr(vision_attention, "_forward", counted)
    monkeypatch.setattr(vision_attention, "length_plan", planned)
    grouped, video, keep = encode(adapter, keep_share)
    assert layers and len(forwards) == layers   # every attention layer ran the grouped forward
    # One plan per boundaries tensor the tower passes: its windows' and its frames' (Qwen3-VL has no windows).
    assert len(plans) == (2 if family == "tiny_adapter" else 1)
    # transformers' forward: the same encoding with the grouping taken out.
    monkeypatch.setattr(vision_attention, "_ATTENTION_CLASSES", ())
    with torch.inference_mode():
        stock = adapter.encode_video(video.pixel_values, video.grid_thw, keep)
    assert len(forwards) == layers
    torch.testing.assert_close(grouped, stock, rtol=0, atol=1e-6)
    assert not any("forward" in vars(m) for m in tower.modules())   # nothing left patched


def test_the_grouping_is_in_place_only_inside_the_block(tiny_adapter, monkeypatch):
    tower = tiny_adapter._visual
    layers = [m for m in tower.modules() if type(m).__name__ == "Qwen2_5_VLVisionAttention"]
    calls = count_attention_calls(monkeypatch)
    with grouped_vision_attention(tower):
        assert all("forward" in vars(layer) for layer in layers)
        encode(tiny_adapter)
    assert calls and not any("forward" in vars(layer) for layer in layers)
    # Per layer, one call per distinct sequence length: far fewer than the windows and frames.
    assert len(calls) <= 2 * len(layers)

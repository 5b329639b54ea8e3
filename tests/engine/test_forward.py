"""The layer loop with a pruning hook, against a direct computation of what it should store."""

import pytest
import torch

from vidsight.engine.forward import attend, attend_chunk_after_past, forward
from vidsight.kv import TEXT, VIDEO, GroupPruner, KVCache, PruneConfig, TokenTable
from vidsight.kv.policies import Step

KINDS = [TEXT] * 3 + [VIDEO] * 12 + [TEXT] * 2


def chunk(adapter, seed=0):
    generator = torch.Generator().manual_seed(seed)
    n = len(KINDS)
    hidden_size = adapter.model.config.text_config.hidden_size
    embeds = torch.randn(1, n, hidden_size, generator=generator) * 0.1
    positions = torch.arange(n).expand(3, -1)
    rows = TokenTable.text(positions)
    rows.kind = torch.tensor(KINDS, dtype=torch.int8)
    return embeds.to(adapter.dtype), positions, rows


def reference_keys(adapter, embeds, positions, keep_from_layer, kept):
    """Each layer's keys when only the ``kept`` offsets continue after layer ``keep_from_layer``."""
    hidden, index, keys = embeds, torch.arange(embeds.shape[1]), []
    for layer in range(adapter.num_layers):
        q, k, v = adapter.qkv(layer, hidden, adapter.rotary(positions[:, index]))
        keys.append(k)
        hidden = adapter.finish_layer(layer, hidden, attend(q, k, v, 0))
        if layer == keep_from_layer:
            hidden, index = hidden[:, kept], index[kept]
    return keys, hidden


def test_skip_pruned_tokens_leave_the_layers_above_the_start_layer(tiny_adapter):
    adapter, start = tiny_adapter, 1
    embeds, positions, rows = chunk(adapter)
    n = len(KINDS)
    cache = KVCache(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim, n, adapter.dtype, adapter.device)
    config = PruneConfig(rho=0.5, start_layer=start, skip_pruned=True)
    hidden = forward(adapter, cache, embeds, positions, rows, GroupPruner(config))

    # Up to the start layer nothing is pruned, so its keys are the plain forward's; the kept
    # video tokens are the six with the smallest key norms there; text is always kept.
    plain_keys, _ = reference_keys(adapter, embeds, positions, adapter.num_layers, None)
    video = torch.arange(3, 15)
    norms = plain_keys[start][0, :, video].norm(dim=-1).mean(0)
    kept = torch.cat([torch.arange(3), video[torch.topk(-norms, 6).indices], torch.arange(15, 17)]).sort().values

    keys, last_hidden = reference_keys(adapter, embeds, positions, start, kept)
    for layer in range(adapter.num_layers):
        expected = torch.arange(n) if layer < start else kept
        assert cache.filled[layer] == len(expected)
        assert torch.equal(cache.slot_rows[layer, : len(expected)], expected)
        # The start layer computed every token's key and kept some; the layers above only kept ones.
        stored = keys[layer][:, :, kept] if layer == start else keys[layer]
        assert torch.allclose(cache.keys[layer, :, :, : len(expected)], stored, atol=1e-5)
    assert hidden.shape[1] == len(kept)
    assert torch.allclose(hidden, last_hidden, atol=1e-5)


def test_per_layer_pruning_passes_every_token_through_every_layer(tiny_adapter):
    adapter = tiny_adapter
    embeds, positions, rows = chunk(adapter)
    n = len(KINDS)
    cache = KVCache(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim, n, adapter.dtype, adapter.device)
    hidden = forward(adapter, cache, embeds, positions, rows, GroupPruner(PruneConfig(rho=0.5)))
    _, plain_hidden = reference_keys(adapter, embeds, positions, adapter.num_layers, None)
    assert hidden.shape[1] == n
    # Pruning after the chunk attended leaves the chunk's own hidden states untouched.
    assert torch.allclose(hidden, plain_hidden, atol=1e-5)
    assert all(filled == 3 + 6 + 2 for filled in cache.filled)


class Recorder:
    """A policy that attends to everything and keeps what a policy sees at each layer."""

    name = "recorder"

    def __init__(self):
        self.seen = {}

    def report(self):
        return {}

    def select(self, layer, cache, q, step):
        self.seen[layer] = (q, step.positions, step.unrotate)
        return None


def test_a_step_takes_queries_and_keys_back_to_before_the_rotary_embedding(family_adapter):
    adapter = family_adapter
    embeds, positions, rows = chunk(adapter, seed=3)
    positions = positions + torch.tensor([[200], [3], [5]])   # late in a stream, off the diagonal
    cache = KVCache(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim, len(KINDS), adapter.dtype,
                    adapter.device)
    recorder = Recorder()
    forward(adapter, cache, embeds, positions, rows, policy=recorder, step=Step("frame"))
    q, seen_positions, unrotate = recorder.seen[0]
    assert torch.equal(seen_positions, positions)
    # At position 0 the rotary embedding is the identity: the projections as they were before it.
    plain_q, plain_k, _ = adapter.qkv(0, embeds, adapter.rotary(torch.zeros_like(positions)))
    assert torch.allclose(unrotate(q, positions), plain_q, atol=1e-4)
    assert torch.allclose(unrotate(cache.read(0)[0], positions), plain_k, atol=1e-4)
    assert not torch.allclose(q, plain_q, atol=1e-2)


@pytest.mark.parametrize("past, length", [(5, 3), (40, 16), (1, 7)])
def test_a_chunk_after_past_attends_as_the_lower_right_causal_mask(past, length):
    """The CUDA path (a lower-right causal bias over repeated key heads) equals the mask path."""
    torch.manual_seed(0)
    q = torch.randn(1, 14, length, 32)
    keys, values = torch.randn(2, 1, 2, past + length, 32)
    expected = attend(q, keys, values, past)   # the CPU path: an explicit boolean mask, grouped heads
    torch.testing.assert_close(attend_chunk_after_past(q, keys, values), expected, rtol=1e-5, atol=1e-5)
    changed = keys.clone()
    changed[:, :, -1] += 1   # the chunk's last key is seen by its last query alone
    assert torch.equal(attend_chunk_after_past(q, changed, values)[:, :, :-1],
                       attend_chunk_after_past(q, keys, values)[:, :, :-1])

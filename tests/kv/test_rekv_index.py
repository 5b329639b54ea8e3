"""ReKV's block index taken at frame steps equals the index taken from the cache at question time."""

import torch

from vidsight.engine.forward import unrotation
from vidsight.kv import VIDEO, KVCache, TokenTable
from vidsight.kv.policies import ReKVConfig, ReKVPolicy, Step


class LazyReKV(ReKVPolicy):
    """The definition: every block mean computed from the cache when a question comes."""

    def select(self, layer, cache, q, step):
        if step.kind != "frame":
            return super().select(layer, cache, q, step)
        self._update = lambda *args: None   # no upkeep at frame steps
        try:
            return super().select(layer, cache, q, step)
        finally:
            del self._update


def test_the_index_kept_at_frame_steps_retrieves_what_one_built_at_the_question_does(tiny_adapter, frames,
                                                                                     ask_along):
    config = ReKVConfig(local_tokens=16, top_frames=2)
    eager, eager_session = ask_along(tiny_adapter, frames, ReKVPolicy(config))
    lazy, lazy_session = ask_along(tiny_adapter, frames, LazyReKV(config))
    for a, b in zip(eager, lazy, strict=True):
        assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-5)
        assert a.stats.retrieved_tokens == b.stats.retrieved_tokens > 0


def test_rekv_scores_blocks_by_their_content_before_the_rotary_embedding(tiny_adapter):
    """Three frame blocks; before rotation the middle one points where the question does, the
    others nearly so. Rotated, each block's keys turn by its place relative to the question's, and
    the inner products ReKV's code avoids rank the last block first here."""
    adapter = tiny_adapter
    heads, kv_heads, dim = adapter.model.config.text_config.num_attention_heads, adapter.num_kv_heads, adapter.head_dim
    generator = torch.Generator().manual_seed(0)
    direction = torch.randn(1, kv_heads, 1, dim, generator=generator)
    plain_keys = 0.3 * torch.randn(1, kv_heads, 12, dim, generator=generator)
    plain_keys[:, :, 4:8] += direction
    plain_keys[:, :, 0:4] += 0.8 * direction
    plain_keys[:, :, 8:12] += 0.8 * direction
    cell = torch.arange(4)
    positions = torch.stack([torch.tensor([7] * 4 + [30] * 4 + [161] * 4), cell.repeat(3) // 2, cell.repeat(3) % 2])
    rows = TokenTable.text(positions)
    rows.kind = torch.full((12,), VIDEO, dtype=torch.int8)
    rows.frame_index = torch.tensor([0] * 4 + [2] * 4 + [4] * 4)
    keys = adapter.rerotate_keys(plain_keys.to(adapter.dtype), torch.zeros_like(positions), positions)
    cache = KVCache(adapter.num_layers, kv_heads, dim, 16, adapter.dtype, adapter.device)
    for layer in range(adapter.num_layers):
        cache.write(layer, keys, keys)
        cache.keep(layer, 12)
    cache.commit(rows)
    question_at = torch.full((3, 2), 400) + torch.arange(2)
    plain_q = direction.repeat_interleave(heads // kv_heads, dim=1).expand(-1, -1, 2, -1)
    q = adapter.rerotate_keys(plain_q.to(adapter.dtype), torch.zeros_like(question_at), question_at)
    step = Step("question", positions=question_at, unrotate=unrotation(adapter))
    chosen = ReKVPolicy(ReKVConfig(local_tokens=1, top_frames=1)).select(0, cache, q, step)
    assert chosen.tolist() == [4, 5, 6, 7, 11]   # the middle block, and the local window's last slot
    rotated = ReKVPolicy(ReKVConfig(local_tokens=1, top_frames=1, rotated=True)).select(0, cache, q, step)
    assert rotated.tolist() == [8, 9, 10, 11]

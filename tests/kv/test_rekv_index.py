"""ReKV's block index taken at frame steps equals the index taken from the cache at question time."""

import torch

from vidsight.kv.retrieval import ReKVConfig, ReKVPolicy


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

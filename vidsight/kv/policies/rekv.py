"""``rekv``: ReKV's frame retrieval (Di et al., ICLR 2025)."""

from __future__ import annotations

import dataclasses

import torch

from vidsight.kv.policies.base import Step
from vidsight.kv.policies.common import NewVideo, QuestionChoice, sink_mask, window_mask
from vidsight.kv.policies.configs import ReKVConfig
from vidsight.kv.store import KVStore


@dataclasses.dataclass
class _BlockIndex:
    """One layer's frame blocks: the sum and count of each block's keys."""

    frames: torch.Tensor   # (blocks,) frame index of each block's first frame
    sums: torch.Tensor     # (kv_heads, blocks, head_dim) float32
    counts: torch.Tensor   # (blocks,)


class ReKVPolicy:
    """Streaming prefill sees the sinks and the local window; a question retrieves frame blocks.

    At a question, per layer, each temporal patch's block is represented by the mean of its keys
    and the question by the mean of its queries; the ``top_frames`` blocks with the largest inner
    product (over all heads, each query head against its key head) are attended to together with
    the sinks (the system prompt) and the local window, and stay chosen for the answer's tokens.
    The block means are kept as an index, updated at every frame step with the patch written in
    the step before (still on the device, as in ReKV, where a block's mean is taken while the
    block is in GPU memory), so a question reads no offloaded keys to score the blocks.
    """

    name = "rekv"

    def __init__(self, config: ReKVConfig = ReKVConfig()):
        self.config = config
        self._chosen = QuestionChoice()
        self._new = NewVideo()
        self._index: dict[int, _BlockIndex] = {}

    def start(self, cache: KVStore) -> "ReKVPolicy":
        return ReKVPolicy(self.config)

    def report(self) -> dict:
        """The bytes of its block index (the device holds it)."""
        return {"index_bytes": sum(index.sums.nbytes for index in self._index.values())}

    def select(self, layer, cache, q, step):
        filled = cache.filled[layer]
        keep = sink_mask(cache, layer, first_frame=False) | window_mask(filled, self.config.local_tokens)
        if step.kind == "frame":
            self._update(layer, cache, step)
        elif step.kind == "question":
            self._chosen.remember(layer, self._retrieve(layer, cache, q, step), filled)
        recalled = self._chosen.recall(layer, filled) if step.kind != "frame" else None
        if recalled is not None:
            retrieved = recalled[0]
            step.retrieved += int((retrieved & ~keep).sum())
            keep |= retrieved
        return torch.nonzero(keep).flatten()

    def _content(self, x: torch.Tensor, positions: torch.Tensor, step: Step) -> torch.Tensor:
        """``(1, heads, n, head_dim)`` queries or keys as scored: unrotated unless ``rotated``."""
        return x if self.config.rotated else step.unrotate(x, positions.to(x.device))

    def _update(self, layer: int, cache: KVStore, step: Step) -> _BlockIndex:
        """The layer's index, with the video slots written since it was last read."""
        index = self._index.get(layer)
        if index is None:
            kv_heads, head_dim = cache.shape
            index = self._index[layer] = _BlockIndex(torch.empty(0, dtype=torch.long),
                                                     torch.zeros((kv_heads, 0, head_dim)), torch.zeros(0))
        new = self._new.take(cache, layer)
        if len(new):
            held = cache.layer_tokens(layer, new)
            frames, block_of = torch.unique(held.frame_index, return_inverse=True)
            keys = self._content(cache.read(layer, new)[0], held.position.T, step)
            keys = keys[0].float().cpu()                                          # (kv_heads, n, head_dim)
            sums = torch.zeros((keys.shape[0], len(frames), keys.shape[2]))
            sums.index_add_(1, block_of, keys)
            index.frames = torch.cat([index.frames, frames])
            index.sums = torch.cat([index.sums, sums], dim=1)
            index.counts = torch.cat([index.counts, torch.bincount(block_of, minlength=len(frames)).float()])
        return index

    def _retrieve(self, layer: int, cache: KVStore, q: torch.Tensor, step: Step) -> torch.Tensor:
        """Slots of the ``top_frames`` blocks whose mean key best matches the question's mean query."""
        index = self._update(layer, cache, step)
        q = self._content(q, step.positions, step)
        if len(index.frames) == 0:
            return torch.empty(0, dtype=torch.long)
        heads, kv_heads = q.shape[1], index.sums.shape[0]
        # (kv_heads, head_dim) mean query, summed over the query heads that share each key head.
        query = q[0].float().cpu().mean(dim=1).reshape(kv_heads, heads // kv_heads, -1).sum(dim=1)
        scores = torch.einsum("hd,hbd->b", query, index.sums / index.counts[None, :, None])
        top = index.frames[torch.topk(scores, min(self.config.top_frames, len(index.frames))).indices]
        video = cache.video_slots(layer)
        return video[torch.isin(cache.layer_tokens(layer, video).frame_index, top)]

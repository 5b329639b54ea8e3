"""The KV a watch window reuses from the one before (CodecSight section 3.4): which of its temporal
patches overlap, and the cache that carries them into the new window, re-rotated and refreshed."""

from __future__ import annotations

import dataclasses

import torch

from vidsight.engine.forward import attend
from vidsight.engine.refresh import Overlap, RefreshPolicy
from vidsight.engine.stats import StageClock
from vidsight.kv import KVCache, TokenTable
from vidsight.models.base import VLMAdapter


@dataclasses.dataclass
class _Window:
    """What the next window reuses: the cache and the visual embeddings behind it."""

    cache: KVCache
    samples: list[int]          # stream sample number of each frame
    gop_starts: list[bool]      # each frame: the first sampled frame of its GOP
    video_embeds: torch.Tensor  # (video tokens, hidden)
    video_start: int
    patch_tokens: list[int]     # tokens of each temporal patch (after pruning)


class WindowKV:
    """The previous window's cache and what the next window takes from it.

    Args:
        adapter: The model.
        policy: Which reused tokens are recomputed (`refresh.refresh_policy`).
        in_place: Update the previous window's cache where it lies instead of copying into a new one.
    """

    def __init__(self, adapter: VLMAdapter, policy: RefreshPolicy, in_place: bool):
        self.adapter, self.policy, self.in_place = adapter, policy, in_place
        self.previous: _Window | None = None

    def remember(self, cache: KVCache, samples: list[int], gop_starts: list[bool], reused: int,
                 new_embeds: torch.Tensor, video_start: int, patch_tokens: list[int]) -> None:
        """Keep a judged window for the next one: its cache and the visual embeddings of its video
        (the ``reused`` last ones of the window before, then ``new_embeds``)."""
        if not self.policy.reuses:
            return
        old = self.previous.video_embeds[self.previous.video_embeds.shape[0] - reused:] if reused else new_embeds[:0]
        self.previous = _Window(cache, samples, gop_starts, torch.cat([old, new_embeds]), video_start, patch_tokens)

    def reusable_patches(self, samples: list[int], patch_tokens: list[int], video_start: int) -> int:
        """Temporal patches at the start of this window that the previous window also held."""
        previous, tp = self.previous, self.adapter.vision.temporal_patch_size
        if previous is None or previous.video_start != video_start or samples[0] not in previous.samples:
            return 0
        shift = previous.samples.index(samples[0])
        overlap = len(previous.samples) - shift
        if shift % tp or overlap % tp or samples[:overlap] != previous.samples[shift:]:
            return 0
        patches = overlap // tp
        if previous.patch_tokens[shift // tp :] != patch_tokens[:patches]:
            return 0
        return patches

    def reuse(self, patches: int, positions: torch.Tensor, rows: TokenTable, video_start: int, capacity: int,
               clock: StageClock) -> tuple[KVCache, int, torch.Tensor]:
        """The window's cache holding the prefix and the reused patches, re-rotated to their new
        positions and refreshed; returns (cache, tokens filled, slots refreshed)."""
        adapter, previous, tp = self.adapter, self.previous, self.adapter.vision.temporal_patch_size
        count = sum(previous.patch_tokens[len(previous.patch_tokens) - patches:])
        first_old = video_start + previous.video_embeds.shape[0] - count  # the previous video's last tokens
        done = video_start + count
        with clock.stage("prefill"):
            source = torch.cat([torch.arange(video_start), torch.arange(first_old, first_old + count)])
            old_positions = previous.cache.tokens.position[source].T
            new_positions = positions[:, :done]
            with clock.part("carry_s"):
                cache = self._carry(source, rows[:done], capacity, old_positions, new_positions)
            overlap = Overlap(previous.patch_tokens[len(previous.patch_tokens) - patches:],
                              previous.gop_starts[len(previous.gop_starts) - patches * tp:], tp)
            picked = self.policy.choose(overlap)
            refreshed = _refresh(adapter, cache, picked + video_start, previous.video_embeds[-count:][picked],
                                 positions[:, picked + video_start], self.policy)
        return cache, done, refreshed

    def _carry(self, source: torch.Tensor, rows: TokenTable, capacity: int, old_positions: torch.Tensor,
               new_positions: torch.Tensor) -> KVCache:
        """A cache of ``capacity`` slots holding the previous cache's tokens at ``source`` first,
        keys re-rotated to ``new_positions``: the previous cache itself when reusing in place."""
        adapter, old, done = self.adapter, self.previous.cache, len(source)
        if self.in_place:
            old.retain(source, rows, lambda keys, kept: adapter.rerotate_keys(keys, old_positions[:, kept],
                                                                               new_positions[:, kept]))
            old.reserve(capacity - done)
            return old
        cache = KVCache(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim, capacity, adapter.dtype,
                        adapter.device)
        for layer in range(adapter.num_layers):
            keys, values = old.read(layer, source)
            cache.write(layer, adapter.rerotate_keys(keys, old_positions, new_positions), values)
            cache.keep(layer, done)
        cache.commit(rows)
        return cache


def _refresh(adapter: VLMAdapter, cache: KVCache, slots: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
             policy: RefreshPolicy) -> torch.Tensor:
    """Recompute the KV of the tokens at ``slots`` from their visual ``embeds`` (``(n, hidden)``), each
    attending to every cached token before it. Returns the slots the last layer refreshed."""
    if len(slots) == 0:
        return slots
    hidden = embeds[None].to(adapter.dtype)
    cos, sin = adapter.rotary(positions)  # (1, n, head_dim) each
    for layer in range(adapter.num_layers):
        q, k, v = adapter.qkv(layer, hidden, (cos, sin))
        if layer == policy.narrow_layer:
            keep = policy.narrow(v, cache.read(layer, slots)[1])
            slots, cos, sin, hidden, q, k, v = (slots[keep], cos[:, keep], sin[:, keep], hidden[:, keep],
                                                q[:, :, keep], k[:, :, keep], v[:, :, keep])
        cache.overwrite(layer, slots, k, v)
        keys, values = cache.read(layer)
        hidden = adapter.finish_layer(layer, hidden, attend(q, keys, values, 0, query_slots=slots))
    return slots



"""The KV a watch window reuses from the one before (CodecSight section 3.4): which of its temporal
patches overlap, and the cache that carries them into the new window, re-rotated and refreshed."""

from __future__ import annotations

import dataclasses

import torch

from vidsight.engine.forward import add_level, attend, new_cache, split_levels
from vidsight.engine.refresh import Overlap, RefreshPolicy
from vidsight.engine.stats import StageClock
from vidsight.engine.prompt import VideoPrompt
from vidsight.kv import VIDEO, TokenTable
from vidsight.kv.store import KVStore
from vidsight.models.base import VLMAdapter


@dataclasses.dataclass
class _Window:
    """What the next window reuses: the cache and the visual embeddings behind it."""

    cache: KVStore
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

    def remember(self, cache: KVStore, samples: list[int], gop_starts: list[bool], reused: int,
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

    def reuse(self, patches: int, prompt: VideoPrompt, capacity: int, clock: StageClock
              ) -> tuple[KVStore, int, torch.Tensor]:
        """The window's cache holding the prefix and the reused patches, re-rotated to their new
        positions and refreshed; returns (cache, tokens filled, slots refreshed).

        Text the family writes around each patch (InternVL's frame labels, numbered by place in
        the window) is recomputed with every reuse: its words change between windows.
        """
        adapter, previous, tp = self.adapter, self.previous, self.adapter.vision.temporal_patch_size
        video_start, positions, rows = prompt.video_start, prompt.positions, prompt.rows
        count = sum(previous.patch_tokens[len(previous.patch_tokens) - patches:])
        done = prompt.patch_starts[patches] if patches < len(prompt.patch_starts) else prompt.suffix[0]
        region = rows[video_start:done]
        video = torch.nonzero(region.kind == VIDEO).flatten() + video_start    # reused tokens' new slots
        text = torch.nonzero(region.kind != VIDEO).flatten() + video_start     # labels: recomputed
        old_video = torch.nonzero(previous.cache.tokens.kind == VIDEO).flatten()[-count:] if count else video[:0]
        with clock.stage("prefill"):
            source = torch.arange(done)
            source[video] = old_video
            source[text] = 0  # a stand-in: these slots are recomputed below
            old_positions = previous.cache.tokens.position[source].T
            new_positions = positions[:, :done]
            with clock.part("carry_s"):
                # In place, the carried tokens close up at the front: labels between them need the copy.
                cache = self._carry(source, rows[:done], capacity, old_positions, new_positions,
                                    self.in_place and not len(text))
            overlap = Overlap(previous.patch_tokens[len(previous.patch_tokens) - patches:],
                              previous.gop_starts[len(previous.gop_starts) - patches * tp:], tp)
            picked = self.policy.choose(overlap)
            slots, order = torch.cat([video[picked], text]).sort()
            embeds = torch.cat([previous.video_embeds[-count:][picked].to(adapter.dtype),
                                adapter.embed_tokens(prompt.ids[text]).to(adapter.dtype)])[order]
            always = (order >= len(picked))
            refreshed = _refresh(adapter, cache, slots, embeds, positions[:, slots], self.policy, always)
        return cache, done, refreshed[~torch.isin(refreshed, text)]

    def _carry(self, source: torch.Tensor, rows: TokenTable, capacity: int, old_positions: torch.Tensor,
               new_positions: torch.Tensor, in_place: bool) -> KVStore:
        """A cache of ``capacity`` slots holding the previous cache's tokens at ``source`` first,
        keys re-rotated to ``new_positions``: the previous cache itself ``in_place`` (``source``
        then ascending and without repeats)."""
        adapter, old, done = self.adapter, self.previous.cache, len(source)
        if in_place:
            old.retain(source, rows, lambda keys, kept: adapter.rerotate_keys(keys, old_positions[:, kept],
                                                                               new_positions[:, kept]))
            old.reserve(capacity - done)
            return old
        cache = new_cache(adapter, capacity)
        for layer in range(adapter.num_layers):
            keys, values = old.read(layer, source)
            cache.write(layer, adapter.rerotate_keys(keys, old_positions, new_positions), values)
            cache.keep(layer, done)
        cache.commit(rows)
        return cache


def _refresh(adapter: VLMAdapter, cache: KVStore, slots: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
             policy: RefreshPolicy, always: torch.Tensor) -> torch.Tensor:
    """Recompute the KV of the tokens at ``slots`` (ascending) from their input ``embeds``
    (``(n, hidden)``, or ``(n, levels, hidden)``), each attending to every cached token before it; the policy's narrowing
    never drops the ``always`` ones. Returns the slots the last layer refreshed."""
    if len(slots) == 0:
        return slots
    hidden, added = split_levels(embeds[None].to(adapter.dtype))
    cos, sin = adapter.rotary(positions)  # (1, n, head_dim) each
    for layer in range(adapter.num_layers):
        q, k, v = adapter.qkv(layer, hidden, (cos, sin))
        if layer == policy.narrow_layer:
            optional = torch.nonzero(~always).flatten()
            narrowed = (optional[policy.narrow(v[:, :, optional], cache.read(layer, slots[optional])[1])]
                        if len(optional) else optional)
            keep = torch.cat([narrowed, torch.nonzero(always).flatten()]).sort().values
            slots, cos, sin, hidden, q, k, v = (slots[keep], cos[:, keep], sin[:, keep], hidden[:, keep],
                                                q[:, :, keep], k[:, :, keep], v[:, :, keep])
            added = added[:, keep] if added is not None else None
        cache.overwrite(layer, slots, k, v)
        keys, values = cache.read(layer)
        hidden = add_level(adapter.finish_layer(layer, hidden, attend(q, keys, values, 0, query_slots=slots)),
                           added, layer)
    return slots



"""Prefill and decode through the adapter's primitives with vidsight's own KV cache."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from vidsight.kv import KVCache, LayerHook, TokenTable
from vidsight.kv.policies import KVPolicy, Selection, Step
from vidsight.kv.store import KVStore
from vidsight.kv.tiers import TierConfig, TieredKVCache
from vidsight.models.base import VLMAdapter


def new_cache(adapter: VLMAdapter, capacity: int, tiers: TierConfig | None = None) -> KVStore:
    """An empty cache for ``adapter``'s layers on its device: one buffer of ``capacity`` slots per
    layer (it grows by doubling on `reserve`), or blocks in the ``tiers`` given."""
    shape = (adapter.num_layers, adapter.num_kv_heads, adapter.head_dim)
    if tiers is None:
        return KVCache(*shape, capacity, adapter.dtype, adapter.device)
    return TieredKVCache(*shape, adapter.dtype, adapter.device, tiers)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int,
           query_slots: torch.Tensor | None = None, past_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of queries ``(1, H, L, D)`` over keys ``(1, KVH, n, D)``.

    By default the queries are a chunk following ``past`` earlier keys (``n = past + L``). With
    ``query_slots`` they are tokens already among the keys, each at its slot, and each sees the
    keys up to its own slot (a refresh of cached tokens); ``past`` is then unused. ``past_mask``
    ``(KVH, past)`` says which earlier keys each key head's queries see (a per-head selection).
    """
    length = q.shape[2]
    if past_mask is not None:
        heads = q.shape[1]
        earlier = past_mask.to(q.device).repeat_interleave(heads // past_mask.shape[0], dim=0)
        own = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        mask = torch.cat([earlier[:, None, :].expand(-1, length, -1), own.expand(heads, -1, -1)], dim=-1)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[None], enable_gqa=True)
    if query_slots is not None:
        rows = query_slots.to(q.device)[:, None]
    elif length == 1 or past == 0:
        return F.scaled_dot_product_attention(q, keys, values, is_causal=past == 0 and length > 1, enable_gqa=True)
    elif q.is_cuda:
        return attend_chunk_after_past(q, keys, values)
    else:
        rows = torch.arange(length, device=q.device)[:, None] + past
    mask = torch.arange(keys.shape[2], device=q.device)[None, :] <= rows
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


def attend_chunk_after_past(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A chunk's queries over every earlier key and its own causally: the causal mask aligned at the
    bottom right. As a boolean mask it keeps SDPA off the flash and memory-efficient kernels on CUDA
    (they take no mask), which then materialises heads x chunk x keys scores, gigabytes per layer
    at QuickVideo's groups over a long video; as the lower-right causal bias those kernels run it.
    That path has no grouped-query support, so key heads are repeated to the query heads."""
    group = q.shape[1] // keys.shape[1]
    bias = causal_lower_right(q.shape[2], keys.shape[2])
    return F.scaled_dot_product_attention(q, keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1),
                                          attn_mask=bias)


def split_levels(embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token inputs ``(1, L, hidden)``, or ``(1, L, levels, hidden)`` for a family with DeepStack
    levels, as the first layer's input ``(1, L, hidden)`` and what is added after each of the
    first layers ``(1, L, levels - 1, hidden)`` (None: nothing)."""
    if embeds.ndim == 3:
        return embeds, None
    return embeds[:, :, 0], embeds[:, :, 1:]


def first_level(embeds: torch.Tensor) -> torch.Tensor:
    """The input embeddings of ``(n, hidden)`` or ``(n, levels, hidden)`` token inputs: ``(n, hidden)``."""
    return embeds if embeds.ndim == 2 else embeds[:, 0]


def add_level(hidden: torch.Tensor, added: torch.Tensor | None, layer: int) -> torch.Tensor:
    """``hidden`` after ``layer`` with that layer's DeepStack addition, where there is one (zero for text)."""
    if added is None or layer >= added.shape[2]:
        return hidden
    return hidden + added[:, :, layer]


def unrotation(adapter: VLMAdapter):
    """``(x, positions) -> x`` rotated back to position 0, where the rotary embedding is the
    identity: what a `Step` carries as ``unrotate``."""
    return lambda x, at: adapter.rerotate_keys(x, at, torch.zeros_like(at))


def attend_cached(layer: int, cache: KVStore, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  policy: KVPolicy | None = None, step: Step | None = None) -> torch.Tensor:
    """One layer's attention of a chunk over the cached tokens ``policy`` picks and itself, causally.

    Writes the chunk's ``(1, kv_heads, L, head_dim)`` keys and values to ``cache`` (the caller
    settles them with ``cache.keep``) and counts what was attended in ``step``.

    Returns:
        ``(1, heads, L, head_dim)`` attention output of the chunk's queries ``q``.
    """
    past = cache.filled[layer]
    started = time.perf_counter()
    chosen = policy.select(layer, cache, q, step) if policy is not None else None
    if step is not None:
        step.policy_s += time.perf_counter() - started
    summary = chosen if isinstance(chosen, Selection) else None
    if summary is not None:
        chosen = summary.slots
    keys, values = cache.write(layer, k, v, chosen, None if summary is None else summary.heads)
    summaries = 0 if summary is None or summary.keys is None else summary.keys.shape[2]
    if summaries:
        # Summaries come first: they are past entries every query of the chunk may see.
        keys = torch.cat([summary.keys.to(keys.device, keys.dtype), keys], dim=2)
        values = torch.cat([summary.values.to(values.device, values.dtype), values], dim=2)
    past_mask = None if summary is None or summary.heads is None else torch.cat(
        [torch.ones((summary.heads.shape[0], summaries), dtype=torch.bool), summary.heads], dim=1)
    if step is not None:
        step.cached += past
        step.attended += (past if chosen is None else len(chosen) if past_mask is None
                          else float(summary.heads.sum(dim=1).float().mean()))
        step.summaries += summaries
        step.layers += 1
    return attend(q, keys, values, keys.shape[2] - k.shape[2], past_mask=past_mask)


@torch.inference_mode()
def forward(adapter: VLMAdapter, cache: KVStore, embeds: torch.Tensor, positions: torch.Tensor, rows: TokenTable,
            hook: LayerHook | None = None, policy: KVPolicy | None = None, step: Step | None = None
            ) -> torch.Tensor:
    """Run one chunk through every layer, appending its keys and values to ``cache``.

    Args:
        adapter: The model's primitives.
        cache: Holds every earlier token of the sequence.
        embeds: ``(1, L, hidden)`` input embeddings of the chunk (``(1, L, levels, hidden)`` with
            DeepStack levels, see `split_levels`).
        positions: ``(3, L)`` M-RoPE positions of the chunk, computed by the caller.
        rows: What the chunk's tokens are, for the cache's token table.
        hook: Sees each layer's q, k, v after the chunk attended; what it returns is the part of
            the chunk's KV the layer keeps (None: all). The chunk's own queries always see all of
            it at that layer; if the hook's ``skip_pruned`` is set, the tokens it drops also skip
            the layers after it.
        policy: Chooses, per layer, the cached tokens the chunk attends to (None: all of them),
            and maybe summary entries beside them; the chunk always attends to itself, causally.
        step: What kind of step this is, for the policy; counts what was attended.

    Returns:
        ``(1, n, hidden)`` hidden states after the last layer (before the final norm) of the ``n``
        tokens that reached it: all of the chunk's unless the hook skipped some; text always does.
    """
    rotary = adapter.rotary(positions)
    if step is not None:
        step.positions = positions
        step.unrotate = unrotation(adapter)
    hidden, added = split_levels(embeds)
    alive = None  # chunk offsets of the tokens still computed; None: all of them
    for layer in range(adapter.num_layers):
        q, k, v = adapter.qkv(layer, hidden, rotary)
        hidden = adapter.finish_layer(layer, hidden, attend_cached(layer, cache, q, k, v, policy, step))
        hidden = add_level(hidden, added, layer)
        kept = hook.after_attention(layer, q, k, v, rows if alive is None else rows[alive]) if hook else None
        cache.keep(layer, k.shape[2], kept, alive)
        if kept is not None and hook.skip_pruned:
            alive = kept if alive is None else alive[kept]
            device_kept = kept.to(hidden.device)
            hidden = hidden[:, device_kept]
            added = added[:, device_kept] if added is not None else None
            rotary = tuple(part[:, device_kept] for part in rotary)
            if step is not None:
                step.positions = step.positions[:, kept.to(step.positions.device)]
    cache.commit(rows)
    return hidden

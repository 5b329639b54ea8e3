"""Several sequences through the model at once: their tokens packed into one stream.

Projections, norms and MLPs work token by token, so one call over the packed tokens of every
sequence gives each token what a call over its own sequence would (up to the floating-point
order of a larger matrix product). Attention is per sequence, over its own cache (and its own
policy's selection), causally within its chunk. A decode step packs one token per running
answer (`generate.DecodeBatch`); a prefill chunk packs as many as its sequence brings.
"""

from __future__ import annotations

import dataclasses

import torch

from vidsight.engine.forward import add_level, attend_cached, forward, split_levels, unrotation
from vidsight.kv import TokenTable
from vidsight.kv.policies import KVPolicy, Step
from vidsight.kv.store import KVStore
from vidsight.models.base import VLMAdapter


@dataclasses.dataclass
class Chunk:
    """One sequence's tokens in a packed step.

    Attributes:
        cache: The sequence's cache; the chunk's keys and values are appended to it.
        embeds: ``(1, L, hidden)`` input embeddings (``(1, L, levels, hidden)`` with DeepStack levels).
        positions: ``(3, L)`` M-RoPE positions.
        rows: What the chunk's tokens are, for the cache's token table.
        policy: Chooses the cached tokens the chunk attends to per layer (None: all).
        step: Counts what the chunk attended, for the policy.
    """

    cache: KVStore
    embeds: torch.Tensor
    positions: torch.Tensor
    rows: TokenTable
    policy: KVPolicy | None = None
    step: Step | None = None

    @property
    def length(self) -> int:
        return self.embeds.shape[1]

    @torch.inference_mode()
    def run(self, adapter: VLMAdapter) -> torch.Tensor:
        """``(1, L, hidden)`` hidden states of the chunk run through the model by itself."""
        return forward(adapter, self.cache, self.embeds, self.positions, self.rows, policy=self.policy, step=self.step)

    def split(self, tokens: int) -> tuple["Chunk", "Chunk"]:
        """The chunk's first ``tokens`` and the rest: run one after the other through the same cache,
        they give what the whole chunk gives (each attends to the cache, then causally within
        itself), so a long group can go through over several steps (vLLM's chunked prefill)."""
        if self.policy is not None:
            raise ValueError("a chunk whose attention a policy selects goes through whole")
        if not 0 < tokens < self.length:
            raise ValueError(f"cannot split a chunk of {self.length} tokens after {tokens}")
        return tuple(Chunk(self.cache, self.embeds[:, part], self.positions[:, part], self.rows[part])
                     for part in (slice(0, tokens), slice(tokens, None)))


@torch.inference_mode()
def forward_packed(adapter: VLMAdapter, chunks: list[Chunk]) -> list[torch.Tensor]:
    """Run every chunk through every layer in one pass, each appending to its own cache.

    Returns:
        Per chunk, ``(1, L, hidden)`` hidden states after the last layer (before the final norm).
    """
    lengths = [chunk.length for chunk in chunks]
    positions = torch.cat([chunk.positions for chunk in chunks], dim=1)
    rotary = adapter.rotary(positions)
    for chunk in chunks:
        if chunk.step is not None:
            chunk.step.positions, chunk.step.unrotate = chunk.positions, unrotation(adapter)
    hidden, added = split_levels(torch.cat([chunk.embeds for chunk in chunks], dim=1))
    for layer in range(adapter.num_layers):
        q, k, v = adapter.qkv(layer, hidden, rotary)   # (1, heads or kv_heads, sum of lengths, head_dim)
        parts = zip(chunks, q.split(lengths, dim=2), k.split(lengths, dim=2), v.split(lengths, dim=2))
        attn = torch.cat([attend_cached(layer, chunk.cache, q_, k_, v_, chunk.policy, chunk.step)
                          for chunk, q_, k_, v_ in parts], dim=2)
        hidden = add_level(adapter.finish_layer(layer, hidden, attn), added, layer)
        for chunk in chunks:
            chunk.cache.keep(layer, chunk.length)
    for chunk in chunks:
        chunk.cache.commit(chunk.rows)
    return list(hidden.split(lengths, dim=1))

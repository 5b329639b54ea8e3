"""QuickPrefill's group-wise KV pruning: after each group, every layer keeps a fraction of its video KV.

The scores follow QuickVideo section 3.2: small key norms (its default, query-agnostic), large
value norms, or attention against the question's queries. Text tokens are always kept, and kept
tokens keep the keys they were rotated with, i.e. their true M-RoPE positions.
"""

from __future__ import annotations

from typing import Protocol

import torch

from vidsight.errors import ConfigError
from vidsight.kv.cache import VIDEO, TokenTable
from vidsight.kv.config import ATTENTION, ATTENTION_RECEIVED, KEY_NORM_SMALL, VALUE_NORM, PruneConfig


class LayerHook(Protocol):
    """Sees each layer's projections of a chunk; may return which of the chunk's KV to keep.

    With ``skip_pruned`` set, the tokens a layer does not keep also skip the layers after it.
    """

    skip_pruned: bool

    def after_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        rows: TokenTable) -> torch.Tensor | None: ...


class GroupPruner:
    """Keeps the top ``rho`` share of each group's video KV per layer, by the configured score.

    Args:
        config: Ratio, score and first pruned layer.
        question_queries: Per layer, the question's rotated queries ``(1, heads, n_q, head_dim)``;
            needed by the ``attention`` score only.
    """

    def __init__(self, config: PruneConfig, question_queries: list[torch.Tensor] | None = None):
        if config.scorer == ATTENTION and question_queries is None:
            raise ConfigError("the attention KV score needs the question's queries")
        self.config = config
        self.question_queries = question_queries
        self.skip_pruned = config.skip_pruned

    def after_attention(self, layer, q, k, v, rows):
        video = torch.nonzero(rows.kind == VIDEO).flatten()
        chosen_below = self.skip_pruned and layer > self.config.start_layer
        if not self.config.active or layer < self.config.start_layer or chosen_below or len(video) == 0:
            return None
        own = q[0, :, video] if q is not None else None
        scores = self._score(layer, own, k[0, :, video], v[0, :, video])
        top = torch.topk(scores.float(), self.config.kept(len(video))).indices.cpu()
        text = torch.nonzero(rows.kind != VIDEO).flatten()
        return torch.sort(torch.cat([text, video[top]])).values

    def _score(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        question = self.question_queries[layer] if self.question_queries is not None else None
        return SCORES[self.config.scorer](q, k, v, question)


def small_key_norm(q, k, v, question) -> torch.Tensor:
    """Key Norms (small), QuickVideo's default: keys with small norms draw attention."""
    return -k.float().norm(dim=-1).mean(0)


def value_norm(q, k, v, question) -> torch.Tensor:
    """Value Norms: large values move the output most."""
    return v.float().norm(dim=-1).mean(0)


def question_attention(q, k, v, question: torch.Tensor) -> torch.Tensor:
    """Attention Scores: the question's queries ``(1, heads, n_q, head_dim)`` against the keys."""
    question = question[0].float()
    keys = k.float().repeat_interleave(question.shape[0] // k.shape[0], dim=0)  # (heads, n, head_dim)
    return (question @ keys.transpose(1, 2)).mean(dim=(0, 1))


def attention_received(q, k, v, question, rows_per_block: int = 512) -> torch.Tensor:
    """The attention each video key receives from the group's video queries in the real pass,
    averaged over the heads and the queries that see it (causal; normalised within the group)."""
    heads, n, dim = q.shape
    keys = k.float().repeat_interleave(heads // k.shape[0], dim=0)  # (heads, n, head_dim)
    received = torch.zeros(n, device=q.device)
    for lo in range(0, n, rows_per_block):
        hi = min(n, lo + rows_per_block)
        logits = q[:, lo:hi].float() @ keys.transpose(1, 2) * dim**-0.5  # (heads, rows, n)
        later = torch.arange(n, device=q.device)[None, :] > torch.arange(lo, hi, device=q.device)[:, None]
        received += logits.masked_fill(later, float("-inf")).softmax(dim=-1).sum(dim=(0, 1))
    seen_by = heads * torch.arange(n, 0, -1, device=q.device)
    return received / seen_by


# Each score maps a group's video tokens' ``(heads, n, head_dim)`` queries and ``(kv_heads, n,
# head_dim)`` keys and values (and, for ``attention``, the question's queries) to ``(n,)``
# importances; a new score is one function and one entry here (its name in `config.SCORERS`,
# which the command line reads without torch).
SCORES = {KEY_NORM_SMALL: small_key_norm, VALUE_NORM: value_norm, ATTENTION: question_attention,
          ATTENTION_RECEIVED: attention_received}


class QueryRecorder:
    """Records each layer's queries of a chunk's last ``count`` tokens (the question, for ``attention``)."""

    skip_pruned = False

    def __init__(self, count: int):
        self.count = count
        self.queries: list[torch.Tensor] = []

    def after_attention(self, layer, q, k, v, rows):
        self.queries.append(q[:, :, -self.count :].clone())
        return None

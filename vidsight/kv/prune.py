"""QuickPrefill's group-wise KV pruning: after each group, every layer keeps a fraction of its video KV.

The scores follow QuickVideo section 3.2: small key norms (its default, query-agnostic), large
value norms, or attention against the question's queries. Text tokens are always kept, and kept
tokens keep the keys they were rotated with, i.e. their true M-RoPE positions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import torch

from vidsight.errors import ConfigError
from vidsight.kv.cache import VIDEO, TokenTable

KEY_NORM_SMALL, VALUE_NORM, ATTENTION = "key-norm-small", "value-norm", "attention"
SCORERS = (KEY_NORM_SMALL, VALUE_NORM, ATTENTION)


@dataclasses.dataclass(frozen=True)
class PruneConfig:
    """Which video KV each layer keeps after a prefill group.

    Attributes:
        rho: Retention ratio in (0, 1]; 1 keeps everything (exact).
        scorer: ``key-norm-small`` (QuickVideo's default), ``value-norm`` or ``attention``.
        start_layer: Layers below this keep all their KV.
        skip_pruned: Choose the kept tokens once, at ``start_layer``, and let the others skip the
            layers above it, so pruning saves their compute as well as their KV (the layers above
            then hold the same tokens). The group carrying the question is exempt: all of it
            reaches the question, then each layer prunes it as below. Off: QuickVideo's rule,
            every layer scores and keeps its own share and every token passes every layer.
    """

    rho: float = 1.0
    scorer: str = KEY_NORM_SMALL
    start_layer: int = 0
    skip_pruned: bool = False

    def __post_init__(self):
        if not 0 < self.rho <= 1:
            raise ConfigError(f"rho must be in (0, 1], got {self.rho}")
        if self.scorer not in SCORERS:
            raise ConfigError(f"unknown KV scorer {self.scorer!r}; choose one of {', '.join(SCORERS)}")
        if self.start_layer < 0:
            raise ConfigError(f"start_layer must be non-negative, got {self.start_layer}")

    @property
    def active(self) -> bool:
        return self.rho < 1

    def kept(self, video_tokens: int) -> int:
        """How many of a group's ``video_tokens`` a pruned layer keeps (at least one)."""
        if not self.active or video_tokens == 0:
            return video_tokens
        return max(1, math.ceil(self.rho * video_tokens))


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
        scores = self._score(layer, k[0, :, video], v[0, :, video])
        top = torch.topk(scores.float(), self.config.kept(len(video))).indices.cpu()
        text = torch.nonzero(rows.kind != VIDEO).flatten()
        return torch.sort(torch.cat([text, video[top]])).values

    def _score(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``(n,)`` importance of each video token from its ``(kv_heads, n, head_dim)`` keys and values."""
        if self.config.scorer == KEY_NORM_SMALL:
            return -k.float().norm(dim=-1).mean(0)
        if self.config.scorer == VALUE_NORM:
            return v.float().norm(dim=-1).mean(0)
        queries = self.question_queries[layer][0].float()  # (heads, n_q, head_dim)
        keys = k.float().repeat_interleave(queries.shape[0] // k.shape[0], dim=0)  # (heads, n, head_dim)
        return (queries @ keys.transpose(1, 2)).mean(dim=(0, 1))


class QueryRecorder:
    """Records each layer's queries of a chunk's last ``count`` tokens (the question, for ``attention``)."""

    skip_pruned = False

    def __init__(self, count: int):
        self.count = count
        self.queries: list[torch.Tensor] = []

    def after_attention(self, layer, q, k, v, rows):
        self.queries.append(q[:, :, -self.count :].clone())
        return None

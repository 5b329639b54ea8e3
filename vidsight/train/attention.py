"""Attention supervision: at a chat question's key word, one head of the first layers should look
at the patches the question is about.

Narrowing a question's attention to the named objects' patches lifts the task model's chat
answers from 83 to 97 % (docs/benchmarks.md, "Where full loses the order questions"): the answer
is in the object tokens, but over a 512-frame stream the question's softmax spreads over
thousands of background tokens. This training-only loss asks that, at the question's key word
(where `loop.TrainingHeads` reads the answer after layer ``KEY_LAYER``), some head of the layers
before it put most of its attention over the video on the asked patches: the negative log of the
largest such share over those layers and heads. It changes no inference code.
"""

from __future__ import annotations

import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb

from vidsight.train.retrieval import ProjectionTap


class RotaryTap:
    """Keeps the rotary embedding's ``(cos, sin)`` that the decoder layers receive in one forward pass."""

    def __init__(self, layers):
        self.cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None    # each (B, L, head_dim)
        self._handle = layers[0].self_attn.register_forward_pre_hook(self._keep, with_kwargs=True)

    def _keep(self, module, args, kwargs):
        self.cos_sin = kwargs["position_embeddings"]

    def close(self) -> None:
        self._handle.remove()


def key_word_rows(key_targets: torch.Tensor, question_span: torch.Tensor, ignore: int) -> torch.Tensor:
    """``(B, L)`` bool: each sample's key word in its first question (where its key target is set)."""
    rows = torch.zeros_like(key_targets, dtype=torch.bool)
    for b, (start, end) in enumerate(question_span.tolist()):
        rows[b, start:end] = key_targets[b, start:end] != ignore
    return rows


def attention_loss(projections: ProjectionTap, rotary: RotaryTap, layers: int, video_span: torch.Tensor,
                   key_rows: torch.Tensor, targets: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor | None:
    """Mean over supervised samples of ``-log`` the best head's attention share on the asked patches.

    Args:
        projections: The layers' query and key projections (before the rotary embedding).
        rotary: The rotary embedding the layers applied.
        layers: The first ``layers`` decoder layers are searched for the best head.
        video_span: ``(B, 3)`` first video token, end, and temporal patches.
        key_rows: ``(B, L)`` bool: the question's key word (one row per sample, or none).
        targets: ``(B, patches)`` bool, padded with False: the patches each question is about.
        heads: Query heads; ``kv_heads``: key heads (query heads share them in groups).

    Returns:
        The loss, or None when no sample has both a key word and asked patches.
    """
    cos, sin = rotary.cos_sin
    losses = []
    for b in torch.nonzero(targets.any(dim=1) & key_rows.any(dim=1)).flatten().tolist():
        (v0, v1, patches), row = video_span[b].tolist(), int(torch.nonzero(key_rows[b])[0])
        asked = targets[b, :patches].repeat_interleave((v1 - v0) // patches)      # (video tokens,)
        shares = []
        for q_all, k_all in zip(projections.queries[:layers], projections.keys[:layers]):
            q = q_all[b, row].reshape(1, heads, 1, -1)                              # (1, heads, 1, D)
            k = k_all[b, : row + 1].reshape(row + 1, kv_heads, -1).transpose(0, 1)[None]   # (1, kv_heads, n, D)
            q = apply_rotary_pos_emb(q, q, cos[b : b + 1, row : row + 1], sin[b : b + 1, row : row + 1])[0]
            k = apply_rotary_pos_emb(k, k, cos[b : b + 1, : row + 1], sin[b : b + 1, : row + 1])[1]
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            p = torch.softmax((q @ k.transpose(-1, -2))[0, :, 0] / q.shape[-1] ** 0.5, dim=-1)   # (heads, n)
            video = p[:, v0:v1]
            shares.append((video * asked).sum(dim=-1) / video.sum(dim=-1).clamp(min=1e-12))
        losses.append(-torch.log(torch.cat(shares).max().clamp(min=1e-6)))
    return torch.stack(losses).mean() if losses else None

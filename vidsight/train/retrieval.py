"""Retrieval supervision: a question's mean query should point at the temporal patches it is about.

Frame-retrieval policies (ReKV, Mosaic) score a cached temporal patch by the inner product of
its mean key with the question's mean query, per layer, on keys and queries before the rotary
embedding. In a large VLM that score follows content without being taught (ReKV's premise); a
four-layer model trained only on answers has no reason to pool that way: its answers come from a
few tokens' attention, and the pooled score of the patch it reads can rank anywhere. This
training-only loss, at each layer, is the cross-entropy of a softmax over the clip's temporal
patches (scored as ReKV scores them) against the patches that show the objects the question
names. It changes no inference code and leaves full attention's answers to the answer loss.
"""

from __future__ import annotations

import numpy as np
import torch

from vidsight.tasks.families import Sample


def asked_patches(sample: Sample, temporal_patch: int) -> np.ndarray:
    """``(patches,)`` bool: the temporal patches of ``sample`` in which an object the question names
    (by its shape or its colour word) is visible."""
    words = set(sample.question.rstrip("?").replace(",", " ").split())
    patches = -(-sample.frames // temporal_patch)
    shown = np.zeros(patches, dtype=bool)
    for obj in sample.scene.objects:
        if obj.shape in words or obj.colour in words:
            frames = np.nonzero((sample.times_s >= obj.t_in) & (sample.times_s < obj.t_out))[0]
            shown[frames // temporal_patch] = True
    return shown


class ProjectionTap:
    """Keeps each decoder layer's query and key projections (before the rotary embedding) during
    one forward pass."""

    def __init__(self, layers):
        self.queries: list[torch.Tensor] = []   # per layer (B, L, heads * head_dim)
        self.keys: list[torch.Tensor] = []      # per layer (B, L, kv_heads * head_dim)
        self._handles = [h for layer in layers for h in (
            layer.self_attn.q_proj.register_forward_hook(lambda m, i, out: self.queries.append(out)),
            layer.self_attn.k_proj.register_forward_hook(lambda m, i, out: self.keys.append(out)))]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def retrieval_loss(tap: ProjectionTap, video_span: torch.Tensor, question_span: torch.Tensor,
                   targets: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor | None:
    """Mean over layers and supervised samples of the patch-retrieval cross-entropy.

    Args:
        tap: The layers' projections of the batch.
        video_span: ``(B, 3)`` first video token, end, and temporal patches; ``question_span``
            ``(B, 2)``: the tokens a chat session prefills as the question step (after the video,
            before the answer).
        targets: ``(B, patches)`` bool, padded with False: the patches each question is about
            (rows without any are not supervised).
        heads: Query heads; ``kv_heads``: key heads (query heads share them in groups, as scored).

    Returns:
        The loss, or None when no sample is supervised.
    """
    rows = torch.nonzero(targets.any(dim=1)).flatten().tolist()
    if not rows:
        return None
    losses = []
    for q_all, k_all in zip(tap.queries, tap.keys):
        for b in rows:
            (v0, v1, patches), (q0, q1) = video_span[b].tolist(), question_span[b].tolist()
            keys = k_all[b, v0:v1].reshape(patches, (v1 - v0) // patches, -1).mean(dim=1)   # (patches, kv_heads * D)
            query = q_all[b, q0:q1].mean(dim=0).reshape(kv_heads, heads // kv_heads, -1).sum(dim=1).reshape(-1)
            scores = keys @ query
            losses.append(torch.logsumexp(scores, 0) - torch.logsumexp(scores[targets[b, :patches]], 0))
    return torch.stack(losses).mean()

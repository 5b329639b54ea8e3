"""The Qwen vision towers' attention over many short sequences, one call per sequence length.

Qwen2.5-VL's tower attends within each window of each temporal patch (and, in a few layers,
within each temporal patch), Qwen3-VL's within each temporal patch. Unless flash-attention is
installed, transformers runs one ``scaled_dot_product_attention`` call per such sequence: a
30-minute video at 1 fps makes about 14,000 calls in each windowed layer, each far too small to
fill a GPU (the device check's H200 run measured the 7B tower at about 50 TFLOP/s, a sixteenth of
the card). The sequences come in few lengths (whole windows, edge windows, kept parts of
motion-pruned windows in whole merge groups), so here every sequence of one length goes through
one batched call: the same attention per sequence, in a handful of calls per layer.

`grouped_vision_attention` puts this in place for the calls vidsight makes (`run_tower`) and
takes it out after, so transformers' own forward, the reference the exactness tests compare
against, stays as it is.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types

import torch
import torch.nn.functional as F
from transformers.utils.generic import is_flash_attention_requested

# Sequences per batched call: CUDA's attention kernels put the batch on a grid axis of at most
# 65,535 blocks; a longer video's windows go over a few calls.
MAX_SEQUENCES = 32768
_ATTENTION_CLASSES = ("Qwen2_5_VLVisionAttention", "Qwen3VLVisionAttention")


def length_plan(cu_seqlens: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """The packed batch's non-empty sequences gathered by length, one entry per batched call.

    Args:
        cu_seqlens: ``(sequences + 1,)`` boundaries (transformers' ``cu_seqlens``; empty
            sequences allowed).

    Returns:
        ``(length, index)`` per call: ``index`` ``(sequences * length,)`` holds the token rows of
        at most `MAX_SEQUENCES` sequences of that length, each sequence's rows in order.
    """
    starts = cu_seqlens[:-1].long()
    lengths = cu_seqlens[1:].long() - starts
    plan = []
    for length in lengths.unique().tolist():   # host syncs: one here, one per length below (its count)
        if length == 0:
            continue
        for chosen in starts[lengths == length].split(MAX_SEQUENCES):
            plan.append((length, (chosen[:, None] + torch.arange(length, device=starts.device)).reshape(-1)))
    return plan


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                      scaling: float, plan: list[tuple[int, torch.Tensor]] | None = None) -> torch.Tensor:
    """Attention within each sequence of a packed batch, one call per distinct length.

    Args:
        query, key, value: ``(tokens, heads, head_dim)``, the sequences one after another.
        cu_seqlens: ``(sequences + 1,)`` boundaries (transformers' ``cu_seqlens``; empty
            sequences allowed).
        scaling: The softmax scale.
        plan: `length_plan` of ``cu_seqlens``, when the caller has it already.

    Returns:
        ``(tokens, heads, head_dim)``: each token's output over its own sequence.
    """
    out = torch.empty_like(query)
    for length, index in length_plan(cu_seqlens) if plan is None else plan:
        sequences = len(index) // length
        # (sequences, heads, length, head_dim)
        q, k, v = (t[index].view(sequences, length, *t.shape[1:]).transpose(1, 2) for t in (query, key, value))
        attended = F.scaled_dot_product_attention(q, k, v, scale=scaling)
        out[index] = attended.transpose(1, 2).reshape(len(index), *query.shape[1:])
    return out


class _Plans:
    """`length_plan` per boundaries tensor, made once for the layers that share it (a tower passes
    one tensor to all its windowed layers and one to its full ones): one set of host syncs per
    tower call instead of per layer, which a GPU waits on. The tensors are held, so none is freed
    and another made at its address while its plan is here."""

    def __init__(self):
        self._made: list[tuple[torch.Tensor, list]] = []

    def of(self, cu_seqlens: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        for tensor, plan in self._made:
            if tensor is cu_seqlens:
                return plan
        self._made.append((cu_seqlens, length_plan(cu_seqlens)))
        return self._made[-1][1]


def _forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
             position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, max_seqlen=None, *,
             plans: _Plans, **kwargs):
    """transformers' vision attention forward (projections and rotary from its own module), with
    `grouped_attention` in place of its loop over sequences."""
    tokens = hidden_states.shape[0]
    query, key, value = self.qkv(hidden_states).reshape(tokens, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    rotary = sys.modules[type(self).__module__].apply_rotary_pos_emb_vision
    query, key = rotary(query, key, *position_embeddings)
    attended = grouped_attention(query, key, value, cu_seqlens, self.scaling, plans.of(cu_seqlens))
    return self.proj(attended.reshape(tokens, -1))


@contextlib.contextmanager
def grouped_vision_attention(tower: torch.nn.Module):
    """Within the block, ``tower``'s Qwen vision attention layers batch their sequences by length
    (`grouped_attention`); towers of other families, and flash-attention (already one call per
    layer), are left as they are."""
    layers = [m for m in tower.modules() if type(m).__name__ in _ATTENTION_CLASSES
              and "forward" not in vars(m)   # not already in place (a block within a block)
              and not is_flash_attention_requested(m.config)]
    plans = _Plans()
    for layer in layers:
        layer.forward = types.MethodType(functools.partial(_forward, plans=plans), layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward   # back to the class's own


def run_tower(tower: torch.nn.Module, pixels: torch.Tensor, **inputs):
    """``tower(pixels, **inputs)`` with `grouped_vision_attention`."""
    with grouped_vision_attention(tower):
        return tower(pixels, **inputs)

"""Linear layers whose weights live in oneDNN's blocked layout, for decode steps of many answers on a CPU.

A decode step of several answers multiplies a few rows by every weight. On a CPU, MKL (torch's
default for float32 products) packs a row-major weight into its own blocks on every product of 4
or more rows, so a step of 8 answers of the `small` shape cost 2.7x one answer's
(docs/benchmarks.md, "Many clients"). oneDNN reorders each weight into its blocked layout once,
at load; a product of 8 rows then reads the weight about as a single row does. Only weights of
`MIN_PACKED_ELEMENTS` or more are reordered (the MLPs and the output head of a 0.5 B model and
up). Measured on that step (2 cores): 8 answers 0.232 -> 0.141 s, 16 answers 0.269 -> 0.184 s,
one answer 0.085 -> 0.096 s (a single row is read a little slower from blocks), prefill about
the same. The reordered weight replaces the original, so the weights' memory stays the same,
except where the output head shares the input embedding's matrix (tied weights): the lookup
keeps the dense matrix and the head gets its own blocked copy.

The products are the same up to float32 rounding (another summation order, as another BLAS
would give): first-token logits within 1e-4 of the plain model's (tested).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

# The rows oneDNN chooses its layout for: a decode step of several answers. Other row counts use
# the same layout (one row 20 % slower than MKL's, thousands of prefill rows as fast).
PACKED_FOR_ROWS = 8
# Smaller weights stay row-major: MKL's packing of them costs little, and oneDNN's call costs more
# (896x896 at 8 rows 0.10 -> 0.07 ms but at one row 0.034 -> 0.045; 128x896 slower at both; the
# 2.3 M-parameter task model, every layer small, served 20 % fewer completions with all packed;
# docs/benchmarks.md, "Weights in oneDNN's blocked layout").
MIN_PACKED_ELEMENTS = 1 << 20


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on ``device`` in ``dtype`` can have its linear weights packed: float32 on a
    CPU whose torch build has oneDNN."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """``nn.Linear``'s product with the weight reordered once into oneDNN's blocked layout.

    Attributes:
        weight: The reordered ``(out_features, in_features)`` weight (an opaque oneDNN tensor).
        bias: ``(out_features,)`` or None.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKED_FOR_ROWS)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linear_weights(model: nn.Module, min_elements: int | None = None) -> int:
    """Replace every float32 ``nn.Linear`` of ``model`` on the CPU whose weight has at least
    ``min_elements`` (default `MIN_PACKED_ELEMENTS`) by a `PackedLinear`, for inference only (the
    reordered weights take no gradient).

    Returns:
        How many layers were packed (0 where `can_pack` says no).
    """
    least = MIN_PACKED_ELEMENTS if min_elements is None else min_elements
    packed = 0
    # Holding no list of the linear layers themselves, so each original weight is freed once its
    # reordered copy is in place (a list of every module kept them all to the end: twice the memory).
    parents = [module for module in model.modules() if not isinstance(module, nn.Linear)]
    for parent in parents:
        names = [name for name, child in parent.named_children() if isinstance(child, nn.Linear)
                 and child.weight.numel() >= least and can_pack(child.weight.device, child.weight.dtype)]
        for name in names:
            setattr(parent, name, PackedLinear(getattr(parent, name)))
        packed += len(names)
    if packed:
        log.info("%d linear layers' weights reordered into oneDNN's blocked layout", packed)
    return packed

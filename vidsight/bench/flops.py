"""FLOPs measured on the operations a run executes, not estimated from token counts.

`FlopCount` counts every matrix multiplication, convolution and attention kernel dispatched
while it is active, with torch's own per-operator formulas (`torch.utils.flop_counter`), so
what pruning, reuse and refresh skip is not counted. (torch's `FlopCounterMode` also tracks
modules through autograd hooks, which fail under `torch.inference_mode`; this counts without.)
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from vidsight.engine.steps import EncodeRequest, Stepped
from vidsight.models.base import VLMAdapter

T = TypeVar("T")
aten = torch.ops.aten
# The CPU's attention kernel computes what the flash kernel does; torch has a formula for the latter only.
FORMULAS = {**flop_registry,
            aten._scaled_dot_product_flash_attention_for_cpu: flop_registry[aten._scaled_dot_product_flash_attention]}


class FlopCount(TorchDispatchMode):
    """``with FlopCount() as count: ...`` then ``count.flops``."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formula = FORMULAS.get(func._overloadpacket)
        if formula is None:
            # A composite (matmul under inference mode arrives whole): count the kernels it is made of.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        self.flops += int(formula(*args, **kwargs, out_val=out))
        return out


def drive_counting(steps: Stepped[T], adapter: VLMAdapter) -> tuple[T, int, int]:
    """`steps.drive`, measuring FLOPs: ``(result, vision FLOPs, all FLOPs)``."""
    vision = 0
    with FlopCount() as total:
        try:
            request = next(steps)
            while True:
                with FlopCount() as counted:
                    answer = request.run(adapter)   # embeddings, or a chunk's hidden states
                if isinstance(request, EncodeRequest):
                    vision += counted.flops
                request = steps.send(answer)
        except StopIteration as stop:
            result = stop.value
    return result, vision, total.flops

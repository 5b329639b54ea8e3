"""Measured FLOPs equal the textbook count of the operations run, composites and CPU attention included."""

import torch
import torch.nn.functional as F

from vidsight.bench.flops import FlopCount


@torch.inference_mode()
def test_matmul_linear_conv_and_attention_are_counted_as_their_definition():
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    image, kernel = torch.randn(1, 3, 2, 10, 10), torch.randn(6, 3, 2, 5, 5)
    with FlopCount() as count:
        x @ w.T
    assert count.flops == 2 * 8 * 16 * 4
    with FlopCount() as count:
        F.linear(x, w)
    assert count.flops == 2 * 8 * 16 * 4
    with FlopCount() as count:
        F.scaled_dot_product_attention(q, k, v)
    assert count.flops == 2 * (2 * 2 * 5 * 7 * 8)  # scores and weighted sum, per head
    with FlopCount() as outer:
        with FlopCount() as inner:
            F.conv3d(image, kernel, stride=(2, 5, 5))
        x @ w.T
    assert inner.flops == 2 * (6 * 2 * 2) * (3 * 2 * 5 * 5)  # outputs x multiply-adds per output
    assert outer.flops == inner.flops + 2 * 8 * 16 * 4

"""Qwen2-VL / Qwen2.5-VL multimodal rotary (M-RoPE) positions, computed by vidsight for every chunk.

Each token has three position indices (temporal, height, width). Text tokens use one index on all
three axes. A video token at merged grid cell (t, h, w) gets
``(start + int(t * second_per_grid_t * tokens_per_second), start + h, start + w)``, where ``start``
is the position after the preceding text. Text after the video continues from the largest index
the video used, plus one (Qwen's published rule, which the checkpoints were trained with and
which vLLM follows; transformers 5.x instead continues from ``start + max(H, W)`` while its
decoding steps use the maximum, so the two only agree for short videos).
"""

from __future__ import annotations

import torch


def video_grid_positions(
    grid_thw: tuple[int, int, int],
    merge_size: int,
    second_per_grid_t: float,
    tokens_per_second: float,
    start: int,
) -> torch.Tensor:
    """Positions of a video span's tokens, in the merger's row-major (t, h, w) order.

    Args:
        grid_thw: Temporal patches and patch rows/columns before merging.
        merge_size: Patches per side merged into one token.
        second_per_grid_t: Seconds covered by one temporal patch.
        tokens_per_second: The model's temporal position ticks per second.
        start: Position index of the span's first token.

    Returns:
        ``(3, T * H/m * W/m)`` long tensor.
    """
    t, h, w = grid_thw[0], grid_thw[1] // merge_size, grid_thw[2] // merge_size
    t_index = (torch.arange(t, dtype=torch.float64) * second_per_grid_t * tokens_per_second).long()
    grid = torch.meshgrid(t_index, torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([g.reshape(-1) for g in grid]) + start


def prompt_positions(
    length: int,
    video_start: int,
    video_positions: torch.Tensor,
) -> tuple[torch.Tensor, int]:
    """Positions of a whole prompt holding one video span.

    Args:
        length: Prompt length in tokens.
        video_start: Index of the first video token (also the span's start position).
        video_positions: ``(3, n)`` positions of the video tokens from `video_grid_positions`.

    Returns:
        ``(3, length)`` long positions and the position of the first generated token.
    """
    n = video_positions.shape[1]
    before = torch.arange(video_start).expand(3, -1)
    after_start = int(video_positions.max()) + 1 if n else video_start
    after = torch.arange(length - video_start - n).expand(3, -1) + after_start
    positions = torch.cat([before, video_positions, after], dim=1)
    return positions, int(positions.max()) + 1

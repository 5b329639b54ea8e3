"""Redundant patches: merge groups whose pixels did not change since they were last encoded.

Motion pruning keeps a GOP's first sampled frame whole (the codec says nothing about how it
differs from the frame before), so on a static camera with short GOPs most of the encoder's work
goes to frames that repeat what it saw a second earlier. Here every merge group motion pruning
kept is compared with the pixels it had when it was last encoded (not the frame before, so a
slow change adds up until it counts) and dropped when the mean absolute difference stays within
the frame's noise floor: `NOISE_FACTOR` times the median over the frame's groups (most of a
static view is unchanged, so the median is the noise), at least `MIN_LEVELS`. Frames are compared
at the model's input size, where resizing has averaged sensor noise down to well under a level
(a sigma-3 camera at 1280x720: a median change of 0.3 levels between frames a second apart), so
a median over `GLOBAL_LEVELS` means most of the picture changed (the camera moved, the lights
changed, a cut: a slow pan of a smooth texture moves it about 11) and the frame is kept as motion
pruning left it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NOISE_FACTOR = 3.0
MIN_LEVELS = 2.0
GLOBAL_LEVELS = 3.0


class RedundantPatches:
    """Drops kept merge groups that repeat their last encoded pixels; fed one stream's frames in order."""

    def __init__(self, merge_grid: tuple[int, int]):
        self.merge_grid = merge_grid
        self._reference: torch.Tensor | None = None  # (3, H, W) float: each group's pixels when last encoded

    def filter(self, frames: torch.Tensor, keep: torch.Tensor, temporal_patch: int) -> torch.Tensor:
        """``keep`` less its redundant groups.

        Args:
            frames: ``(T, H, W, 3)`` uint8, the group's frames (any size: groups are pooled).
            keep: ``(T / temporal_patch, gh, gw)`` bool, the merge groups motion pruning kept.
            temporal_patch: Frames per temporal patch (a patch's groups are judged on its first frame
                and remembered from its last, the frames around what the encoder sees).
        """
        keep = keep.clone()
        pixels = frames.permute(0, 3, 1, 2).float()
        for patch in range(keep.shape[0]):
            first = pixels[min(patch * temporal_patch, len(pixels) - 1)]
            last = pixels[min((patch + 1) * temporal_patch, len(pixels)) - 1]
            if self._reference is not None:
                change = F.adaptive_avg_pool2d((first - self._reference).abs().mean(0, keepdim=True),
                                               self.merge_grid)[0]
                floor = float(change.median())
                if floor <= GLOBAL_LEVELS:
                    keep[patch] &= change > max(MIN_LEVELS, NOISE_FACTOR * floor)
            self._remember(last, keep[patch])
        return keep

    def _remember(self, frame: torch.Tensor, kept: torch.Tensor) -> None:
        if self._reference is None:
            self._reference = frame.clone()
            return
        height, width = frame.shape[1:]
        mask = F.interpolate(kept[None, None].float(), size=(height, width), mode="nearest")[0] > 0
        self._reference = torch.where(mask, frame, self._reference)

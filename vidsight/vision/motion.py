"""CodecSight's motion-vector patch pruning (section 3.3): which merge groups the encoder sees.

A patch is dynamic when the largest motion-vector magnitude on it exceeds ``tau`` pixels, or when
part of it was intra-coded in an inter frame (no vector predicts it: new content, where CodecSight
would see a large residual). The
dynamic set grows through a GOP and resets at its first sampled frame, which (like an I-frame)
is kept whole so every GOP carries a full view of the scene. A temporal patch keeps the union of
its frames' masks, widened to whole merge groups so the merger still sees 2x2 patches.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from vidsight.errors import ConfigError
from vidsight.ingest.types import CodecInfo
from vidsight.models.base import VisionSpec


@dataclasses.dataclass(frozen=True)
class MotionPruneConfig:
    """Motion-guided pruning settings (CodecSight's defaults).

    Attributes:
        tau: Motion magnitude in pixels above which a patch is dynamic (0.25 px).
        dilate_blocks: Also mark this many 4x4 blocks around each dynamic block: an object's edge
            that only clips a block is coded in that block's residual, which FFmpeg does not
            export, next to a block whose vector does move.
        alpha: Weight of the residual term. FFmpeg's software decoders export motion vectors but
            not residuals, so only 0 (CodecSight's hardware-decoder setting) is accepted.
    """

    tau: float = 0.25
    dilate_blocks: int = 1
    alpha: float = 0.0

    def __post_init__(self):
        if self.tau < 0:
            raise ConfigError(f"tau must be non-negative, got {self.tau}")
        if self.dilate_blocks < 0:
            raise ConfigError(f"dilate_blocks must be non-negative, got {self.dilate_blocks}")
        if self.alpha != 0:
            raise ConfigError("alpha must be 0: FFmpeg does not export codec residuals, only motion vectors")


def dynamic_patches(codec: CodecInfo, grid_hw: tuple[int, int], config: MotionPruneConfig) -> torch.Tensor:
    """``(grid_h, grid_w)`` bool: patches of the resized frame holding a dynamic 4x4 block.

    A block is dynamic when a vector landing on it is longer than ``tau`` (either direction) or
    no vector predicts it; the block map is dilated, then resampled onto the patch grid by max
    pooling over the blocks each patch covers.
    """
    if codec.motion is None:
        return torch.zeros(grid_hw, dtype=torch.bool)
    blocks = torch.as_tensor(codec.motion, dtype=torch.float32).amax(dim=0) > config.tau
    if codec.intra is not None:
        blocks |= torch.from_numpy(codec.intra)
    blocks = blocks.float()[None, None]
    if config.dilate_blocks:
        size = 2 * config.dilate_blocks + 1
        blocks = F.max_pool2d(blocks, size, stride=1, padding=config.dilate_blocks)
    return F.adaptive_max_pool2d(blocks, grid_hw)[0, 0] > 0


class MotionMasker:
    """Per sampled frame of one stream, the patches to encode; fed frames in stream order."""

    def __init__(self, config: MotionPruneConfig, spec: VisionSpec):
        self.config, self.spec = config, spec
        self._gop: int | None = None
        self._accumulated: torch.Tensor | None = None

    def frame_mask(self, codec: CodecInfo, grid_hw: tuple[int, int]) -> torch.Tensor:
        """``(grid_h, grid_w)`` bool: the frame's kept patches."""
        if (codec.gop_index != self._gop or codec.frame_type == "I" or self._accumulated is None
                or self._accumulated.shape != grid_hw):
            self._gop = codec.gop_index
            self._accumulated = torch.zeros(grid_hw, dtype=torch.bool)
            return torch.ones(grid_hw, dtype=torch.bool)
        self._accumulated |= dynamic_patches(codec, grid_hw, self.config)
        return self._accumulated.clone()


def group_mask(frame_masks: list[torch.Tensor], spec: VisionSpec) -> torch.Tensor:
    """Per-frame patch masks ``(grid_h, grid_w)`` to kept merge groups ``(T, grid_h / m, grid_w / m)``."""
    masks = torch.stack(frame_masks)
    pad = -len(masks) % spec.temporal_patch_size
    if pad:
        masks = torch.cat([masks, masks[-1:].expand(pad, -1, -1)])
    t, h, w = masks.shape
    m = spec.merge_size
    per_patch = masks.view(t // spec.temporal_patch_size, spec.temporal_patch_size, h, w).any(dim=1)
    return per_patch.view(-1, h // m, m, w // m, m).any(dim=4).any(dim=2)

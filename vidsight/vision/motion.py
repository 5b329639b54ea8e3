"""CodecSight's motion-vector patch pruning (section 3.3): which merge groups the encoder sees.

The source judges every decoded frame's 4x4 blocks (`MotionPruneConfig`'s rule); here a patch is
dynamic when it holds a dynamic block. The dynamic set grows through a GOP and resets at its
first sampled frame, which (like an I-frame) is kept whole so every GOP carries a full view of
the scene. A temporal patch keeps the union of its frames' masks, widened to whole merge groups
so the merger still sees 2x2 patches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vidsight.errors import ConfigError
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.types import CodecInfo
from vidsight.models.base import VisionSpec

__all__ = ["MotionMasker", "MotionPruneConfig", "check_prunable", "dynamic_patches", "group_mask"]


def check_prunable(spec: VisionSpec) -> None:
    """Refuse motion pruning for an encoder that cannot skip patches.

    Raises:
        ConfigError: the model's tokens do not each stand for one merge group of patches
            (LLaVA-OneVision pools each frame's patch grid bilinearly).
    """
    if not spec.prunable:
        raise ConfigError("motion pruning skips merge groups of patches in the vision encoder; this model pools "
                          "patches across groups into its tokens, so it cannot (use KV pruning instead)")


def dynamic_patches(codec: CodecInfo, grid_hw: tuple[int, int]) -> torch.Tensor:
    """``(grid_h, grid_w)`` bool: patches of the resized frame holding a dynamic 4x4 block (the
    block map max-pooled over the blocks each patch covers)."""
    if codec.dynamic is None:
        return torch.zeros(grid_hw, dtype=torch.bool)
    blocks = torch.from_numpy(codec.dynamic).float()[None, None]
    return F.adaptive_max_pool2d(blocks, grid_hw)[0, 0] > 0


class MotionMasker:
    """Per sampled frame of one stream, the patches to encode; fed frames in stream order."""

    def __init__(self):
        self._gop: int | None = None
        self._accumulated: torch.Tensor | None = None

    def frame_mask(self, codec: CodecInfo | None, grid_hw: tuple[int, int]) -> torch.Tensor:
        """``(grid_h, grid_w)`` bool: the frame's kept patches. A frame without codec signals (one
        the decoder lost and another stands in for) is kept whole and starts the set over."""
        if codec is None:
            self._gop = self._accumulated = None
            return torch.ones(grid_hw, dtype=torch.bool)
        if (codec.gop_index != self._gop or codec.frame_type == "I" or self._accumulated is None
                or self._accumulated.shape != grid_hw):
            self._gop = codec.gop_index
            self._accumulated = torch.zeros(grid_hw, dtype=torch.bool)
            return torch.ones(grid_hw, dtype=torch.bool)
        self._accumulated |= dynamic_patches(codec, grid_hw)
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

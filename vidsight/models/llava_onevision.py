"""LLaVA-OneVision over the transformers classes and weights.

Its video path (LLaVA-OneVision's published recipe, as transformers implements it): every frame is
resized to the SigLIP tower's square input (384x384 in the released checkpoints), encoded alone,
projected, and pooled bilinearly to half its patch grid rounded up (27x27 patches to 14x14 = 196
tokens); one learnt newline embedding follows the whole video. The language model is Qwen2's with
1-D rotary positions: every token, video or text, takes the next position.
"""

from __future__ import annotations

import torch

from vidsight.errors import ModelError
from vidsight.models.base import VisionSpec, VLMAdapter
from vidsight.models.decoder import WholeFrameAdapter

# The released checkpoints' normalisation (SigLIP's), used when a checkpoint's files are silent.
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)
# Each token pools this many patches per side.
POOL = 2


class LlavaOnevisionAdapter(WholeFrameAdapter, VLMAdapter):
    """Engine primitives for a loaded ``LlavaOnevisionForConditionalGeneration`` (arguments as
    `Qwen2DecoderAdapter`'s)."""

    family = "llava_onevision"

    @classmethod
    def vision_spec(cls, config, image_processor: dict, video_processor: dict) -> VisionSpec:
        """Frames resized to the tower's square input, one frame per temporal patch."""
        vision = config.vision_config
        side = int(vision.image_size)
        size = video_processor.get("size") or {}
        if size and (size.get("height"), size.get("width")) != (side, side):
            raise ModelError(f"video processor size {size} differs from the vision tower's {side}x{side} input")
        processor = {**image_processor, **video_processor}
        return VisionSpec.square(side, int(vision.patch_size), POOL, processor.get("image_mean", SIGLIP_MEAN),
                                 processor.get("image_std", SIGLIP_STD), suffix_tokens=1, prunable=False)

    # -- vision --------------------------------------------------------------------------------
    def _encode_frames(self, pixels: torch.Tensor) -> torch.Tensor:
        """SigLIP, projector and pooling; the newline the model appends is `video_suffix`."""
        features = self.model.model.get_video_features(pixels[None]).pooler_output
        return features[0, : -self.vision.suffix_tokens]

    def video_suffix(self) -> torch.Tensor:
        return self.model.model.image_newline[None].to(self.dtype)

"""InternVL3 over the transformers classes and weights (the ``-hf`` conversions).

Its video path (InternVL's published recipe, as transformers' processor writes it): every frame is
resized to the InternViT tower's square input (448x448), encoded alone, its patch grid folded 2x2
into channels (pixel shuffle: 32x32 patches to 16x16 = 256 tokens) and projected. The prompt
labels each frame: ``Frame{k}: <img>`` + its tokens + ``</img>``, frames joined by newlines. A
still picture is cut into tiles of that size (`vidsight.vision.tiles`), each encoded as a frame,
all in one ``<img>`` ... ``</img>`` where the template writes ``<IMG_CONTEXT>``. The language model
is Qwen2's with 1-D rotary positions.
"""

from __future__ import annotations

import dataclasses

import torch

from vidsight.errors import ModelError
from vidsight.models.base import VisionSpec, VLMAdapter
from vidsight.models.decoder import WholeFrameAdapter

# The released checkpoints' normalisation (ImageNet's), used when a checkpoint's files are silent.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
START_IMAGE, END_IMAGE, VIDEO = "<img>", "</img>", "<video>"


class InternVLAdapter(WholeFrameAdapter, VLMAdapter):
    """Engine primitives for a loaded ``InternVLForConditionalGeneration`` (arguments as
    `Qwen2DecoderAdapter`'s). The chat template's ``<video>`` marks where the frames go; each
    frame's tokens are the image placeholder (``<IMG_CONTEXT>``) the model fills."""

    family = "internvl"

    def __init__(self, name, model, tokenizer, chat_template: str, vision: VisionSpec, eos_token_ids):
        super().__init__(name, model, tokenizer, chat_template, vision, eos_token_ids)
        ids = tokenizer.convert_tokens_to_ids([START_IMAGE, END_IMAGE, VIDEO])
        if tokenizer.unk_token_id in ids or None in ids:
            raise ModelError(f"{name}: the tokenizer lacks InternVL's {START_IMAGE}, {END_IMAGE} or {VIDEO} token")
        self._start_image, self._end_image, self.template_video_id = ids

    @classmethod
    def vision_spec(cls, config, image_processor: dict, video_processor: dict) -> VisionSpec:
        """Frames resized to the tower's square input, one frame per temporal patch, folded 2x2."""
        vision = config.vision_config
        side, patch = tuple(vision.image_size), tuple(vision.patch_size)
        fold = round(1 / config.downsample_ratio)
        if side[0] != side[1] or patch[0] != patch[1] or fold * config.downsample_ratio != 1:
            raise ModelError(f"InternVL with image size {side}, patch {patch} and downsample ratio "
                             f"{config.downsample_ratio} is not supported (square frames, a whole fold)")
        processor = {**image_processor, **video_processor}
        return VisionSpec.square(side[0], patch[0], fold, processor.get("image_mean", IMAGENET_MEAN),
                                 processor.get("image_std", IMAGENET_STD))

    @classmethod
    def still_spec(cls, vision: VisionSpec, image_processor: dict) -> VisionSpec:
        """A still as InternVL's processor shows one: cut into tiles (it asks its image processor
        to crop, from ``min_patches`` to ``max_patches`` tiles, 1 and 12 where it names none)."""
        most = int(image_processor.get("max_patches", 12))
        fewest = int(image_processor.get("min_patches", 1))
        return dataclasses.replace(vision, tiles=(fewest, most) if most > 1 else None)

    def still_text(self) -> tuple[list[int], list[int]]:
        """``<img>`` before all the picture's tiles, ``</img>`` after them."""
        return [self._start_image], [self._end_image]

    def patch_text(self, index: int, time_s: float) -> tuple[list[int], list[int]]:
        """``Frame{index + 1}: <img>`` before the frame's tokens (after a newline from the second on), ``</img>`` after."""
        label = self.text_ids(f"{chr(10) if index else ''}Frame{index + 1}: ")
        return [*label, self._start_image], [self._end_image]

    # -- vision --------------------------------------------------------------------------------
    def _encode_frames(self, pixels: torch.Tensor) -> torch.Tensor:
        """InternViT, pixel shuffle and projector."""
        features = self.model.model.get_image_features(pixel_values=pixels).pooler_output
        return features.reshape(-1, features.shape[-1])

    def _encode_kept(self, pixels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Frame by frame: the embedded patches of the kept groups (and the class token) through the
        encoder, scattered back onto the patch grid for the pixel shuffle (2x2 patches per token, so a
        kept token's patches are all there), projected, and the kept tokens taken."""
        model, fold = self.model.model, self.vision.merge_size
        if model.config.vision_feature_layer != -1 or model.config.vision_feature_select_strategy != "default":
            raise ModelError(f"{self.name}: skipping patches needs the tower's last layer without its class token")
        tower, out = model.vision_tower, []
        for frame, groups in zip(pixels, keep):
            patches = groups.repeat_interleave(fold, 0).repeat_interleave(fold, 1)  # (grid h, grid w)
            embedded = tower.embeddings(frame[None])  # (1, 1 + patches, channels), class token first
            seen = torch.cat([torch.ones(1, dtype=torch.bool, device=patches.device), patches.reshape(-1)])
            hidden = tower.layernorm(tower.encoder(embedded[:, seen]).last_hidden_state)
            grid = hidden.new_zeros(1, patches.numel(), hidden.shape[-1])
            grid[0, patches.reshape(-1)] = hidden[0, 1:]
            folded = model.pixel_shuffle(grid.view(1, *patches.shape, -1), scale_factor=model.config.downsample_ratio)
            out.append(model.multi_modal_projector(folded.reshape(1, -1, folded.shape[-1]))[0, groups.reshape(-1)])
        return torch.cat(out)

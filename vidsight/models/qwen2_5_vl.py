"""Qwen2.5-VL over the transformers classes and weights."""

from __future__ import annotations

import torch

from vidsight.models.base import VisionSpec, VLMAdapter
from vidsight.models.decoder import Qwen2DecoderAdapter
from vidsight.models.positions import video_grid_positions
from vidsight.models.vision_attention import run_tower

# qwen-vl-utils' video defaults: per-frame pixel bounds and a budget for the whole video.
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
VIDEO_TOTAL_PIXELS = int(128000 * 28 * 28 * 0.9)
# OpenAI CLIP's normalisation, which Qwen's processors use.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class Qwen25VLAdapter(Qwen2DecoderAdapter, VLMAdapter):
    """Engine primitives for a loaded ``Qwen2_5_VLForConditionalGeneration`` (arguments as
    `Qwen2DecoderAdapter`'s)."""

    family = "qwen2_5_vl"

    def __init__(self, name, model, tokenizer, chat_template: str, vision: VisionSpec, eos_token_ids):
        super().__init__(name, model, tokenizer, chat_template, vision, eos_token_ids)
        self._visual = model.model.visual

    @classmethod
    def vision_spec(cls, config, image_processor: dict, video_processor: dict) -> VisionSpec:
        """The spec of a checkpoint's config and processor settings (qwen-vl-utils' defaults where
        its files are silent)."""
        size = video_processor.get("size") or {}
        return VisionSpec.of(
            config.vision_config,
            image_mean=image_processor.get("image_mean", CLIP_MEAN),
            image_std=image_processor.get("image_std", CLIP_STD),
            min_pixels=video_processor.get("min_pixels") or size.get("shortest_edge") or VIDEO_MIN_PIXELS,
            max_pixels=video_processor.get("max_pixels") or size.get("longest_edge") or VIDEO_MAX_PIXELS,
            total_pixels=video_processor.get("total_pixels") or VIDEO_TOTAL_PIXELS,
        )

    @classmethod
    def still_spec(cls, vision: VisionSpec, image_processor: dict) -> VisionSpec:
        """A still image as the checkpoint's image processor shows one (`VisionSpec.still`)."""
        return vision.still(image_processor)

    # -- vision --------------------------------------------------------------------------------
    def encode_video(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int],
                     keep: torch.Tensor | None = None) -> torch.Tensor:
        """Vision encoder + merger: ``(patches, dim)`` to ``(tokens, hidden)``.

        Args:
            pixel_values: The video's patches (`preprocess_video`).
            grid_thw: Temporal patches and patch rows/columns.
            keep: ``(T, H/m, W/m)`` bool: the merge groups to encode (all if None). The encoder then
                runs on those patches only, each window and frame attending within its kept part,
                and the result holds the kept groups' tokens in (t, h, w) order.
        """
        grid = torch.tensor([grid_thw], dtype=torch.long, device=self.device)
        pixels = pixel_values.to(device=self.device, dtype=self._visual.dtype)
        if keep is None or bool(keep.all()):
            return run_tower(self._visual, pixels, grid_thw=grid).pooler_output.to(self.dtype)
        if not bool(keep.any()):
            return self._no_tokens()
        subset = self._kept_patches(grid, keep.to(self.device).reshape(-1))
        unit = self.vision.merge_size ** 2
        pixels = pixels.view(-1, unit, pixels.shape[-1])[subset.pop("units")].reshape(-1, pixels.shape[-1])
        return run_tower(self._visual, pixels, grid_thw=grid, **subset).pooler_output.to(self.dtype)

    def encode_videos(self, videos: list[tuple[torch.Tensor, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """Several videos through the encoder in one call (each attends within itself, as alone).

        Args:
            videos: ``(pixel_values, grid_thw)`` of each, as `encode_video` takes them.

        Returns:
            Each video's ``(tokens, hidden)``, in order.
        """
        grid = torch.tensor([g for _, g in videos], dtype=torch.long, device=self.device)
        pixels = torch.cat([p for p, _ in videos]).to(device=self.device, dtype=self._visual.dtype)
        tokens = [t * h * w // self.vision.merge_size ** 2 for _, (t, h, w) in videos]
        return list(run_tower(self._visual, pixels, grid_thw=grid).pooler_output.to(self.dtype).split(tokens))

    def _kept_patches(self, grid: torch.Tensor, keep: torch.Tensor) -> dict:
        """Positions and attention boundaries of the encoder restricted to the kept merge groups."""
        from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

        visual, unit = self._visual, self.vision.merge_size ** 2
        units = torch.nonzero(keep).flatten()
        local = torch.full_like(keep, -1, dtype=torch.long)
        local[units] = torch.arange(len(units), device=keep.device)
        positions = get_vision_position_ids(grid, visual.spatial_merge_size)
        positions = positions.view(-1, unit, positions.shape[-1])[units].reshape(-1, positions.shape[-1])
        window_index, cu_windows = get_vision_window_index(grid, visual.spatial_merge_size, visual.window_size,
                                                           visual.patch_size)
        window_index, cu_windows = window_index.to(keep.device), cu_windows.to(keep.device)
        window_of = torch.searchsorted(cu_windows[1:], torch.arange(len(window_index), device=keep.device) * unit,
                                       right=True)
        kept_in_order = keep[window_index]
        per_window = torch.bincount(window_of[kept_in_order], minlength=len(cu_windows) - 1) * unit
        per_frame = keep.view(int(grid[0, 0]), -1).sum(dim=1) * unit

        def boundaries(lengths: torch.Tensor) -> torch.Tensor:
            cumulative = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
            return torch.unique_consecutive(cumulative)

        return {"units": units, "position_ids": positions, "cu_seqlens": boundaries(per_frame),
                "window_index": local[window_index[kept_in_order]], "cu_window_seqlens": boundaries(per_window)}

    def video_positions(self, grid_thw: tuple[int, int, int], second_per_grid_t: float, start: int) -> torch.Tensor:
        return video_grid_positions(
            grid_thw, self.vision.merge_size, second_per_grid_t, self.vision.tokens_per_second, start
        )

    # -- language model ------------------------------------------------------------------------
    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, L)`` M-RoPE positions to ``cos, sin`` of shape ``(1, L, head_dim)``."""
        probe = self._lm.embed_tokens.weight[:1]
        return self._lm.rotary_emb(probe, positions.to(self.device)[:, None, :])

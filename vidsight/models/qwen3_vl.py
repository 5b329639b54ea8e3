"""Qwen3-VL over the transformers classes and weights.

Its video path (Qwen's published recipe): frames resized by qwen-vl-utils' rule with 16-pixel
patches (sides multiples of 32), two frames per temporal patch, a ViT with learnt absolute
position embeddings (interpolated to the grid) and 2-D rotary positions, full attention within
each temporal patch, 2x2 merge. The prompt writes every temporal patch as
``<{t:.1f} seconds><|vision_start|>`` + its tokens + ``<|vision_end|>`` (t the mean time of its
two frames), each timestamp tokenised alone, in place of the chat template's one video slot; each
patch is a one-patch M-RoPE grid (temporal index the position it starts at), the rotary axes
interleaved. DeepStack: three intermediate layers of the tower, merged, are added to the video
tokens' hidden states after the first three decoder layers, so a video token's inputs are four
levels (`VisionSpec.deepstack_layers`).
"""

from __future__ import annotations

import torch

from vidsight.models.base import VisionSpec, VLMAdapter
from vidsight.models.decoder import Qwen2DecoderAdapter, apply_rotary
from vidsight.models.positions import video_grid_positions
from vidsight.models.vision_attention import run_tower

# qwen-vl-utils' video defaults for 16-pixel patches (a 32-pixel merge factor): per-frame bounds
# of 128 to 768 tokens and a budget for the whole video (its MODEL_SEQ_LEN of 128000 tokens, 90 %).
FACTOR = 32
VIDEO_MIN_PIXELS = 128 * FACTOR * FACTOR
VIDEO_MAX_PIXELS = 768 * FACTOR * FACTOR
VIDEO_TOTAL_PIXELS = int(128000 * FACTOR * FACTOR * 0.9)
# SigLIP 2's normalisation, which the released checkpoints use.
QWEN3_MEAN = (0.5, 0.5, 0.5)
QWEN3_STD = (0.5, 0.5, 0.5)


class Qwen3VLAdapter(Qwen2DecoderAdapter, VLMAdapter):
    """Engine primitives for a loaded ``Qwen3VLForConditionalGeneration`` (arguments as
    `Qwen2DecoderAdapter`'s)."""

    family = "qwen3_vl"

    def __init__(self, name, model, tokenizer, chat_template: str, vision: VisionSpec, eos_token_ids):
        super().__init__(name, model, tokenizer, chat_template, vision, eos_token_ids)
        self._visual = model.model.visual
        self._vision_start, self._vision_end = model.config.vision_start_token_id, model.config.vision_end_token_id

    @classmethod
    def vision_spec(cls, config, image_processor: dict, video_processor: dict) -> VisionSpec:
        """qwen-vl-utils' pixel bounds unless the checkpoint names its own ``min_pixels``,
        ``max_pixels`` or ``total_pixels`` (transformers' ``size`` for Qwen3-VL is a budget for the
        whole video under another rule, so it is not read)."""
        vision, processor = config.vision_config, {**image_processor, **video_processor}
        return VisionSpec(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                          merge_size=vision.spatial_merge_size,
                          image_mean=tuple(processor.get("image_mean", QWEN3_MEAN)),
                          image_std=tuple(processor.get("image_std", QWEN3_STD)),
                          min_pixels=int(video_processor.get("min_pixels") or VIDEO_MIN_PIXELS),
                          max_pixels=int(video_processor.get("max_pixels") or VIDEO_MAX_PIXELS),
                          total_pixels=int(video_processor.get("total_pixels") or VIDEO_TOTAL_PIXELS),
                          tokens_per_second=0.0, deepstack_layers=len(vision.deepstack_visual_indexes))

    @classmethod
    def still_spec(cls, vision: VisionSpec, image_processor: dict) -> VisionSpec:
        """A still image as the checkpoint's image processor shows one (`VisionSpec.still`)."""
        return vision.still(image_processor)

    # -- text ----------------------------------------------------------------------------------
    def _template_video(self, ids: torch.Tensor, slot: int) -> tuple[int, int]:
        """The template's ``<|vision_start|><|video_pad|><|vision_end|>``: every patch brings its own."""
        wrapped = (0 < slot < len(ids) - 1 and int(ids[slot - 1]) == self._vision_start
                   and int(ids[slot + 1]) == self._vision_end)
        return (slot - 1, slot + 2) if wrapped else (slot, slot + 1)

    def patch_text(self, index: int, time_s: float) -> tuple[list[int], list[int]]:
        """``<{time_s:.1f} seconds><|vision_start|>`` before the patch's tokens, ``<|vision_end|>`` after."""
        return [*self.text_ids(f"<{time_s:.1f} seconds>"), self._vision_start], [self._vision_end]

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """``(..., 1 + deepstack_layers, hidden)``: the embeddings, then zero DeepStack levels (text adds none)."""
        embeds = super().embed_tokens(ids)[..., None, :]
        levels = embeds.new_zeros(*embeds.shape[:-2], self.vision.deepstack_layers, embeds.shape[-1])
        return torch.cat([embeds, levels], dim=-2)

    # -- vision --------------------------------------------------------------------------------
    def encode_video(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int],
                     keep: torch.Tensor | None = None) -> torch.Tensor:
        """Vision encoder, merger and DeepStack mergers: ``(patches, dim)`` to ``(tokens, levels, hidden)``.

        Args:
            pixel_values: The video's patches (`preprocess_video`).
            grid_thw: Temporal patches and patch rows/columns.
            keep: ``(T, H/m, W/m)`` bool: the merge groups to encode (all if None). The tower then
                sees only their patches, each with the position embedding and rotary position it
                has in the whole grid; attention within a temporal patch is full, so every kept
                token's output changes with what was dropped: an approximation, measured in
                `docs/benchmarks.md`, not an equality.
        """
        grid = torch.tensor([grid_thw], dtype=torch.long, device=self.device)
        pixels = pixel_values.to(device=self.device, dtype=self._visual.dtype)
        if keep is None or bool(keep.all()):
            return self._levels(run_tower(self._visual, pixels, grid_thw=grid))
        if not bool(keep.any()):
            return self._no_tokens()
        units = torch.nonzero(keep.to(self.device).reshape(-1)).flatten()
        subset = self._kept_patches(grid, keep.to(self.device))
        unit = self.vision.merge_size ** 2
        pixels = pixels.view(-1, unit, pixels.shape[-1])[units].reshape(-1, pixels.shape[-1])
        return self._levels(run_tower(self._visual, pixels, grid_thw=grid, **subset))

    def encode_videos(self, videos: list[tuple[torch.Tensor, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """Several videos through the encoder in one call (each temporal patch attends within itself)."""
        grid = torch.tensor([g for _, g in videos], dtype=torch.long, device=self.device)
        pixels = torch.cat([p for p, _ in videos]).to(device=self.device, dtype=self._visual.dtype)
        tokens = [t * h * w // self.vision.merge_size ** 2 for _, (t, h, w) in videos]
        return list(self._levels(run_tower(self._visual, pixels, grid_thw=grid)).split(tokens))

    def _levels(self, output) -> torch.Tensor:
        """The merger's tokens and the DeepStack features, stacked: ``(tokens, levels, hidden)``."""
        return torch.stack([output.pooler_output, *output.deepstack_features], dim=1).to(self.dtype)

    def _kept_patches(self, grid: torch.Tensor, keep: torch.Tensor) -> dict:
        """The tower's per-patch inputs (position-embedding taps, rotary positions) for the whole
        grid, restricted to the kept merge groups, and attention boundaries per temporal patch."""
        from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

        visual, unit = self._visual, self.vision.merge_size ** 2
        patches = keep.reshape(-1).repeat_interleave(unit)
        indices, weights = get_vision_interpolation_indices_and_weights(
            grid, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners, spatial_merge_size=visual.spatial_merge_size)
        positions = get_vision_position_ids(grid, visual.spatial_merge_size)
        per_patch = keep.reshape(int(grid[0, 0]), -1).sum(dim=1) * unit
        cu_seqlens = torch.unique_consecutive(torch.nn.functional.pad(per_patch.cumsum(0), (1, 0)).to(torch.int32))
        return {"interp_indices": indices[patches], "interp_weights": weights[patches],
                "position_ids": positions[patches], "cu_seqlens": cu_seqlens}

    def video_positions(self, grid_thw: tuple[int, int, int], second_per_grid_t: float, start: int) -> torch.Tensor:
        """Each temporal patch a one-patch grid (temporal index its start) placed after the one before."""
        out, at = [], start
        for _ in range(grid_thw[0]):
            out.append(video_grid_positions((1, *grid_thw[1:]), self.vision.merge_size, 0.0, 0.0, at))
            at = int(out[-1].max()) + 1
        return torch.cat(out, dim=1)

    # -- language model ------------------------------------------------------------------------
    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, L)`` positions to ``cos, sin`` of shape ``(1, L, head_dim)``, axes interleaved."""
        probe = self._lm.embed_tokens.weight[:1]
        return self._lm.rotary_emb(probe, positions.to(self.device)[:, None, :])

    def qkv(self, layer: int, hidden: torch.Tensor, rotary):
        """Rotated queries and keys (each head RMS-normed first), and values."""
        block = self._lm.layers[layer]
        attn = block.self_attn
        x = block.input_layernorm(hidden)
        length = x.shape[1]
        q = attn.q_norm(attn.q_proj(x).view(1, length, self.num_heads, self.head_dim)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(1, length, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = attn.v_proj(x).view(1, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(q, rotary), apply_rotary(k, rotary), v

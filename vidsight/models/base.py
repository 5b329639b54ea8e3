"""What the engine needs from a VLM family, and nothing more."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch


@dataclasses.dataclass(frozen=True)
class VisionSpec:
    """How a model wants its frames.

    Attributes:
        patch_size: ViT patch side in pixels.
        temporal_patch_size: Frames per temporal patch.
        merge_size: Patches per side merged into one LLM token.
        image_mean: Per-channel mean for normalisation.
        image_std: Per-channel standard deviation.
        min_pixels: Smallest per-frame pixel count after resizing.
        max_pixels: Largest per-frame pixel count after resizing.
        total_pixels: Pixel budget for a whole video; frames shrink to fit it (Qwen's rule).
        tokens_per_second: Temporal M-RoPE ticks per second of video.
    """

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    min_pixels: int
    max_pixels: int
    total_pixels: int
    tokens_per_second: float

    @classmethod
    def of(cls, vision_config, image_mean: tuple[float, float, float], image_std: tuple[float, float, float],
           min_pixels: int, max_pixels: int, total_pixels: int) -> "VisionSpec":
        """The spec of a Qwen-style vision config (a Hugging Face config object or its dict) with
        the given normalisation and pixel bounds."""
        field = vision_config.get if isinstance(vision_config, dict) else lambda name: getattr(vision_config, name)
        return cls(patch_size=field("patch_size"), temporal_patch_size=field("temporal_patch_size"),
                   merge_size=field("spatial_merge_size"), image_mean=tuple(image_mean), image_std=tuple(image_std),
                   min_pixels=int(min_pixels), max_pixels=int(max_pixels), total_pixels=int(total_pixels),
                   tokens_per_second=float(field("tokens_per_second")))

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this."""
        return self.patch_size * self.merge_size


@dataclasses.dataclass(frozen=True)
class PromptLayout:
    """A tokenised prompt with one video span.

    Attributes:
        input_ids: ``(L,)`` token ids, the video span filled with the video placeholder id.
        video_start: Index of the first video token.
        video_tokens: Number of video tokens.
    """

    input_ids: torch.Tensor
    video_start: int
    video_tokens: int


class VLMAdapter(Protocol):
    """The primitives the engine runs a model through.

    Attention itself, the KV cache and positions-per-chunk belong to the engine; the adapter
    exposes the model's own projections, norms and rotary tables so every chunk can be fed with
    positions vidsight computed.
    """

    name: str
    vision: VisionSpec
    num_layers: int
    num_kv_heads: int
    num_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: frozenset[int]

    def build_prompt(self, question: str, video_tokens: int) -> PromptLayout: ...

    def decode_text(self, ids: list[int]) -> str: ...

    def encode_video(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int],
                     keep: torch.Tensor | None = None) -> torch.Tensor: ...

    def encode_videos(self, videos: list[tuple[torch.Tensor, tuple[int, int, int]]]) -> list[torch.Tensor]: ...

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor: ...

    def video_positions(self, grid_thw: tuple[int, int, int], second_per_grid_t: float, start: int) -> torch.Tensor: ...

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rerotate_keys(self, keys: torch.Tensor, old_positions: torch.Tensor, new_positions: torch.Tensor
                      ) -> torch.Tensor: ...

    def qkv(self, layer: int, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def finish_layer(self, layer: int, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

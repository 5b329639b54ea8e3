"""What the engine needs from a VLM family, and nothing more."""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import torch

from vidsight.models.conversation import Conversation

# transformers' `Qwen2VLImageProcessor` pixel bounds for a still image, where a checkpoint names none.
IMAGE_MIN_PIXELS = 56 * 56
IMAGE_MAX_PIXELS = 28 * 28 * 1280


@dataclasses.dataclass(frozen=True)
class VisionSpec:
    """How a model wants its frames, and how many language-model tokens they become.

    Attributes:
        patch_size: ViT patch side in pixels.
        temporal_patch_size: Frames per temporal patch.
        merge_size: Patches per side merged (Qwen) or pooled (LLaVA-OneVision, rounding up) into
            one LLM token.
        image_mean: Per-channel mean for normalisation.
        image_std: Per-channel standard deviation.
        min_pixels: Smallest per-frame pixel count after resizing.
        max_pixels: Largest per-frame pixel count after resizing.
        total_pixels: Pixel budget for a whole video; frames shrink to fit it (Qwen's rule).
        tokens_per_second: Temporal M-RoPE ticks per second of video.
        fixed_size: Every frame is resized to this ``(height, width)``, aspect ratio not kept,
            and the encoder takes whole frames ``(T, 3, h, w)`` (towers with absolute position
            embeddings of one size); None: Qwen's resize rule and flattened patches.
        suffix_tokens: Video tokens after the last temporal patch (LLaVA-OneVision's newline).
        prunable: Each token stands for one merge group of patches, so the encoder can skip
            groups (motion pruning); not so where tokens are pooled across groups (LLaVA-OneVision).
        tiles: ``(fewest, most)`` tiles of ``fixed_size`` a still picture is cut into, plus a
            thumbnail of it whole when there are several (InternVL's dynamic tiling,
            `vidsight.vision.tiles`); None: a still is one frame.
        deepstack_layers: Decoder layers after which the tower's intermediate features are added
            to the video tokens' hidden states (Qwen3-VL's DeepStack). A token's inputs are then
            ``1 + deepstack_layers`` levels, ``(..., levels, hidden)``: its embedding, then what is
            added after each of those layers (zeros for text).
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
    fixed_size: tuple[int, int] | None = None
    suffix_tokens: int = 0
    prunable: bool = True
    deepstack_layers: int = 0
    tiles: tuple[int, int] | None = None

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

    @classmethod
    def square(cls, side: int, patch_size: int, merge_size: int, image_mean, image_std, **fields) -> "VisionSpec":
        """The spec of a tower that encodes each frame alone at ``side`` x ``side`` (one frame per
        temporal patch; the pixel bounds are that square, and no time enters the positions)."""
        return cls(patch_size=patch_size, temporal_patch_size=1, merge_size=merge_size,
                   image_mean=tuple(image_mean), image_std=tuple(image_std), min_pixels=side * side,
                   max_pixels=side * side, total_pixels=side * side, tokens_per_second=0.0,
                   fixed_size=(side, side), **fields)

    def still(self, image_processor: dict) -> "VisionSpec":
        """This (video) spec as a Qwen image processor's settings ``image_processor`` show a still
        image: one frame within its pixel bounds (transformers' `Qwen2VLImageProcessor` defaults,
        3,136 to 1,003,520 pixels, where it names none)."""
        size = image_processor.get("size") or {}
        most = int(image_processor.get("max_pixels") or size.get("longest_edge") or IMAGE_MAX_PIXELS)
        return dataclasses.replace(self, min_pixels=int(image_processor.get("min_pixels") or size.get("shortest_edge")
                                                        or IMAGE_MIN_PIXELS),
                                   max_pixels=most, total_pixels=most)

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this."""
        return self.patch_size * self.merge_size

    @property
    def max_tokens_per_patch(self) -> int:
        """The most language-model tokens one temporal patch can become (at the largest frame size)."""
        if self.fixed_size is not None:
            rows, columns = self.token_hw((self.fixed_size[0] // self.patch_size, self.fixed_size[1] // self.patch_size))
            return rows * columns
        return self.max_pixels // self.factor ** 2

    def token_hw(self, grid_hw: tuple[int, int]) -> tuple[int, int]:
        """Token rows and columns of one temporal patch whose patch grid is ``grid_hw``."""
        return -(-grid_hw[0] // self.merge_size), -(-grid_hw[1] // self.merge_size)


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


@runtime_checkable
class VLMAdapter(Protocol):
    """The primitives the engine runs a model through: every engine, KV and server module takes
    its model as a ``VLMAdapter`` and touches nothing else of it (`tests/models/test_protocol.py`
    checks both the adapters and the callers).

    Attention itself, the KV cache and positions-per-chunk belong to the engine; the adapter
    exposes the model's own projections, norms and rotary tables so every chunk can be fed with
    positions vidsight computed. Positions are ``(3, L)`` (temporal, height, width); a family with
    1-D rotary positions reads the first row.
    """

    name: str
    family: str
    vision: VisionSpec
    # How the model wants a still image, as its image processor shows one: Qwen's within its image
    # pixel bounds, as one temporal patch of itself repeated; InternVL's cut into tiles
    # (`VisionSpec.tiles`); without the video's per-patch text. None where vidsight does not show
    # the family a picture (LLaVA-OneVision, whose processor tiles it its own way).
    still_vision: VisionSpec | None
    num_layers: int
    num_kv_heads: int
    num_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: frozenset[int]
    repetition_penalty: float   # the checkpoint's default (its generation_config.json; 1.0: none)
    # The temperature, top_p, top_k, min_p and max_new_tokens its generation_config.json sets (those
    # it sets only), which a server's requests take unless they give their own (vLLM's way).
    sampling_defaults: dict
    # Tokens of prompt and answer the language model attends over: its max_position_embeddings,
    # or less (`load_model`'s ``max_model_len``); an answer without a length limit ends there.
    context_window: int
    # The checkpoint's fast tokenizer (transformers'), whose vocabulary an answer format
    # (`engine.constrain`) is compiled against; text goes through `text_ids` and `decode_text`.
    tokenizer: object

    def build_prompt(self, question: str | Conversation, video_tokens: int) -> PromptLayout:
        """The chat-templated prompt of a question or a conversation (`Conversation`), its video
        or still image a span of ``video_tokens`` tokens (a conversation without either: none, at
        the end)."""

    def still_text(self) -> tuple[list[int], list[int]]:
        """Token ids the family puts before a still picture's tokens and after them, in the place of
        the template's image mark (InternVL's ``<img>`` and ``</img>``; none for Qwen's, whose
        template writes its marks around the image's)."""

    def patch_text(self, index: int, time_s: float) -> tuple[list[int], list[int]]:
        """Token ids the family puts around temporal patch ``index`` of a video (``time_s`` the
        mean presentation time of its first and last frames): before its tokens and after them
        (InternVL's frame labels, Qwen3-VL's timestamps; none for Qwen2.5-VL)."""

    def text_ids(self, text: str) -> list[int]:
        """``text`` as token ids, read as characters: a special token's string in it is not that
        token, and no beginning-of-text token is added."""

    def decode_text(self, ids: list[int]) -> str:
        """Token ids as text, special tokens left out."""

    def encode_video(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int],
                     keep: torch.Tensor | None = None) -> torch.Tensor:
        """``(tokens, hidden)`` language-model inputs of one video's temporal patches (only its
        ``keep`` merge groups), without the suffix; ``(tokens, levels, hidden)`` for a family with
        DeepStack levels (`VisionSpec.deepstack_layers`)."""

    def video_suffix(self) -> torch.Tensor:
        """``(vision.suffix_tokens, hidden)`` language-model inputs that follow a video's last patch."""

    def encode_videos(self, videos: list[tuple[torch.Tensor, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """Several videos in one vision call, each attending only within itself."""

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """``(L, hidden)`` embeddings of token ids (``(L, levels, hidden)``, as `encode_video`'s)."""

    def video_positions(self, grid_thw: tuple[int, int, int], second_per_grid_t: float, start: int) -> torch.Tensor:
        """``(3, tokens)`` rotary positions of a video's patch tokens, beginning at position ``start``
        (a suffix takes the positions text after the video would)."""

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` for ``(3, L)`` positions."""

    def rerotate_keys(self, keys: torch.Tensor, old_positions: torch.Tensor, new_positions: torch.Tensor
                      ) -> torch.Tensor:
        """Keys rotated at ``old_positions`` as if rotated at ``new_positions``."""

    def qkv(self, layer: int, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s rotated queries, keys and values of ``hidden``."""

    def finish_layer(self, layer: int, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The layer's output projection, residual and MLP after attention."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits of the last layer's hidden states."""

"""Random-weight Qwen2.5-VL models of real sizes, for speed and memory benchmarks without downloads.

The 3B and 7B shapes are the published ``config.json`` values of Qwen2.5-VL-3B/7B-Instruct,
vocabulary size included; text goes through vidsight's byte-level tokenizer, whose chat tokens
have their own (small) ids. ``small`` pairs the Qwen2.5-0.5B language model with a
shallower vision tower and frames of 56x56 to 224x224 pixels, so a 5-minute video runs on a 2-core CPU in minutes.
Weights are random: answers are noise, timings and memory are those of the real architecture.
"""

from __future__ import annotations

import dataclasses

import torch

from vidsight.errors import ConfigError
from vidsight.models.base import VisionSpec
from vidsight.models.loading import CLIP_MEAN, CLIP_STD, VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS, VIDEO_TOTAL_PIXELS
from vidsight.models.qwen2_5_vl import Qwen25VLAdapter
from vidsight.models.tiny import CHAT_TEMPLATE, build_tiny_tokenizer, qwen_config

_VISION_3B_7B = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                     fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2)


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model size: language-model and vision-tower settings plus the frame pixel bounds."""

    text: dict
    vision: dict
    min_pixels: int = VIDEO_MIN_PIXELS
    max_pixels: int = VIDEO_MAX_PIXELS
    total_pixels: int = VIDEO_TOTAL_PIXELS


MODEL_SHAPES = {
    "qwen2.5-vl-7b": Shape(
        text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                  num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
        vision=dict(_VISION_3B_7B, out_hidden_size=3584)),
    "qwen2.5-vl-3b": Shape(
        text=dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
        vision=dict(_VISION_3B_7B, out_hidden_size=2048)),
    "small": Shape(
        text=dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]}),
        vision=dict(_VISION_3B_7B, depth=8, hidden_size=640, intermediate_size=1712, num_heads=10,
                    fullatt_block_indexes=[3, 7], out_hidden_size=896),
        min_pixels=56 * 56, max_pixels=224 * 224, total_pixels=224 * 224 * 1024),
}
_TEXT_COMMON = dict(max_position_embeddings=128000, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]})


def shape_config(name: str, tokenizer):
    """The ``Qwen2_5_VLConfig`` of shape ``name``, with ``tokenizer``'s special token ids."""
    if name not in MODEL_SHAPES:
        raise ConfigError(f"unknown model shape {name!r}; choose one of {', '.join(MODEL_SHAPES)}")
    shape = MODEL_SHAPES[name]
    return qwen_config(tokenizer, {**_TEXT_COMMON, **shape.text}, shape.vision)


def build_shape(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                seed: int = 0) -> Qwen25VLAdapter:
    """A random-weight model of shape ``name``, wrapped like a loaded checkpoint."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer = build_tiny_tokenizer()
    config = shape_config(name, tokenizer)
    shape = MODEL_SHAPES[name]
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype, attn_implementation="sdpa")
    vision = VisionSpec.of(config.vision_config, CLIP_MEAN, CLIP_STD, shape.min_pixels, shape.max_pixels,
                           shape.total_pixels)
    return Qwen25VLAdapter(f"shape:{name}", model.eval(), tokenizer, CHAT_TEMPLATE, vision,
                           {tokenizer.convert_tokens_to_ids("<|im_end|>")})

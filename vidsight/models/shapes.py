"""Random-weight models of real sizes, for speed and memory benchmarks without downloads.

The 3B and 7B shapes are the published ``config.json`` values of Qwen2.5-VL-3B/7B-Instruct, and
``llava-onevision-7b``/``-0.5b`` those of LLaVA-OneVision-Qwen2-7B/0.5B (llava-hf's ``-ov-hf``
conversions), ``internvl3-8b``/``-1b`` those of InternVL3-8B/1B (OpenGVLab's ``-hf`` conversions) and
``qwen3-vl-8b``/``-2b`` those of Qwen3-VL-8B/2B-Instruct,
vocabulary sizes included; text goes through vidsight's byte-level tokenizer, whose chat tokens
have their own (small) ids. ``small`` pairs the Qwen2.5-0.5B language model with a
shallower vision tower and frames of 56x56 to 224x224 pixels, so a 5-minute video runs on a 2-core CPU in minutes.
Weights are random: answers are noise, timings and memory are those of the real architecture.
"""

from __future__ import annotations

import dataclasses

import torch

from vidsight.errors import ConfigError
from vidsight.models.base import VLMAdapter
from vidsight.models.loading import ADAPTERS, VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS, VIDEO_TOTAL_PIXELS, resolve_device
from vidsight.models.qwen3_vl import VIDEO_MAX_PIXELS as QWEN3_MAX_PIXELS
from vidsight.models.qwen3_vl import VIDEO_MIN_PIXELS as QWEN3_MIN_PIXELS
from vidsight.models.qwen3_vl import VIDEO_TOTAL_PIXELS as QWEN3_TOTAL_PIXELS
from vidsight.models.tiny import (CHAT_TEMPLATE, INTERNVL_CHAT_TEMPLATE, LLAVA_CHAT_TEMPLATE, build_internvl_tokenizer,
                                  build_llava_tokenizer, build_tiny_tokenizer, internvl_config, llava_config,
                                  qwen3_config, qwen_config)

_VISION_3B_7B = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                     fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2)


# The language models every family here builds on: Qwen2(.5)-7B and -0.5B (the layer sizes; each
# checkpoint sets its vocabulary and whether its output head is tied).
_QWEN2_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4)
_QWEN2_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                   num_key_value_heads=2)
# LLaVA-OneVision's tower: SigLIP-so400m at 384x384 without its last layer and head.
_SIGLIP_SO400M = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=26, num_attention_heads=16,
                      image_size=384, patch_size=14, vision_use_head=False)
# InternVL3's tower: InternViT-300M-448px-V2.5.
_INTERNVIT_300M = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                       image_size=[448, 448], patch_size=[14, 14], attention_bias=True, layer_scale_init_value=0.1)
# Qwen3-VL's decoder settings (interleaved M-RoPE) and towers: SigLIP 2 so400m (8B) and large (2B)
# with 16-pixel patches, a 48x48 learnt position grid, and DeepStack from three of their blocks.
_QWEN3_TEXT = dict(head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-6,
                   rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                                    "mrope_interleaved": True})
_QWEN3_VISION = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                     hidden_act="gelu_pytorch_tanh")
_QWEN3_PIXELS = dict(min_pixels=QWEN3_MIN_PIXELS, max_pixels=QWEN3_MAX_PIXELS, total_pixels=QWEN3_TOTAL_PIXELS)
# The Qwen2 decoders of LLaVA-OneVision and InternVL3 (1-D rope).
_QWEN2_TEXT = dict(max_position_embeddings=32768, rms_norm_eps=1e-6,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model size: its family, language-model and vision-tower settings, and (for Qwen's resize
    rule) the frame pixel bounds."""

    text: dict
    vision: dict
    family: str = "qwen2_5_vl"
    min_pixels: int = VIDEO_MIN_PIXELS
    max_pixels: int = VIDEO_MAX_PIXELS
    total_pixels: int = VIDEO_TOTAL_PIXELS


MODEL_SHAPES = {
    "qwen2.5-vl-7b": Shape(
        text=dict(_QWEN2_7B, vocab_size=152064, tie_word_embeddings=False),
        vision=dict(_VISION_3B_7B, out_hidden_size=3584)),
    "qwen2.5-vl-3b": Shape(
        text=dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
        vision=dict(_VISION_3B_7B, out_hidden_size=2048)),
    "small": Shape(
        text=dict(_QWEN2_0_5B, vocab_size=151936, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]}),
        vision=dict(_VISION_3B_7B, depth=8, hidden_size=640, intermediate_size=1712, num_heads=10,
                    fullatt_block_indexes=[3, 7], out_hidden_size=896),
        min_pixels=56 * 56, max_pixels=224 * 224, total_pixels=224 * 224 * 1024),
    # The device check's dry run: every stage's code path in seconds, not a model size anyone runs.
    "tiny": Shape(
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=151936, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]}),
        vision=dict(_VISION_3B_7B, depth=2, hidden_size=64, intermediate_size=128, num_heads=4,
                    fullatt_block_indexes=[1], out_hidden_size=64),
        min_pixels=56 * 56, max_pixels=224 * 224, total_pixels=224 * 224 * 1024),
    "qwen3-vl-8b": Shape(
        family="qwen3_vl",
        text=dict(_QWEN3_TEXT, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=151936, tie_word_embeddings=False),
        vision=dict(_QWEN3_VISION, depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                    deepstack_visual_indexes=[8, 16, 24]),
        **_QWEN3_PIXELS),
    "qwen3-vl-2b": Shape(
        family="qwen3_vl",
        text=dict(_QWEN3_TEXT, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, vocab_size=151936, tie_word_embeddings=True),
        vision=dict(_QWEN3_VISION, depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                    deepstack_visual_indexes=[5, 11, 17]),
        **_QWEN3_PIXELS),
    "llava-onevision-7b": Shape(
        family="llava_onevision",
        text=dict(_QWEN2_TEXT, **_QWEN2_7B, vocab_size=152128, tie_word_embeddings=False),
        vision=_SIGLIP_SO400M),
    "llava-onevision-0.5b": Shape(
        family="llava_onevision",
        text=dict(_QWEN2_TEXT, **_QWEN2_0_5B, vocab_size=151936, tie_word_embeddings=True),
        vision=_SIGLIP_SO400M),
    "internvl3-8b": Shape(
        family="internvl",
        text=dict(_QWEN2_TEXT, **_QWEN2_7B, vocab_size=151674, tie_word_embeddings=False),
        vision=_INTERNVIT_300M),
    "internvl3-1b": Shape(
        family="internvl",
        text=dict(_QWEN2_TEXT, **_QWEN2_0_5B, vocab_size=151674, tie_word_embeddings=False),
        vision=_INTERNVIT_300M),
}
_TEXT_COMMON = dict(max_position_embeddings=128000, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]})


# Per family: its tokenizer, its config builder and its chat template.
_FAMILIES = {
    "qwen2_5_vl": (build_tiny_tokenizer, lambda tokenizer, text, vision: qwen_config(
        tokenizer, {**_TEXT_COMMON, **text}, vision), CHAT_TEMPLATE),
    "qwen3_vl": (build_tiny_tokenizer, qwen3_config, CHAT_TEMPLATE),
    "llava_onevision": (build_llava_tokenizer, llava_config, LLAVA_CHAT_TEMPLATE),
    "internvl": (build_internvl_tokenizer, internvl_config, INTERNVL_CHAT_TEMPLATE),
}


def shape_config(name: str):
    """The transformers config of shape ``name`` and the tokenizer its special token ids come from."""
    if name not in MODEL_SHAPES:
        raise ConfigError(f"unknown model shape {name!r}; choose one of {', '.join(MODEL_SHAPES)}")
    shape = MODEL_SHAPES[name]
    build_tokenizer, build_config, _ = _FAMILIES[shape.family]
    tokenizer = build_tokenizer()
    return build_config(tokenizer, shape.text, shape.vision), tokenizer


def build_shape(name: str, device: str | torch.device | None = None, dtype: torch.dtype = torch.float32,
                seed: int = 0) -> VLMAdapter:
    """A random-weight model of shape ``name``, wrapped like a loaded checkpoint, on ``device``
    (default: CUDA when available, as `load_model`)."""
    from transformers import AutoModelForImageTextToText

    config, tokenizer = shape_config(name)
    device = resolve_device(device)
    shape = MODEL_SHAPES[name]
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation="sdpa")
    adapter_cls = ADAPTERS[shape.family]
    pixels = dict(min_pixels=shape.min_pixels, max_pixels=shape.max_pixels, total_pixels=shape.total_pixels)
    vision = adapter_cls.vision_spec(config, {}, pixels)
    adapter = adapter_cls(f"shape:{name}", model.eval(), tokenizer, _FAMILIES[shape.family][2], vision,
                          {tokenizer.convert_tokens_to_ids("<|im_end|>")})
    adapter.still_vision = adapter_cls.still_spec(vision, {})
    return adapter

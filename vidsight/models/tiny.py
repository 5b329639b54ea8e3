"""Random-weight checkpoints of the real architectures (Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision, InternVL3),
written without any download.

The directory has the layout of a Hugging Face checkpoint (config, safetensors weights,
tokenizer, chat template, preprocessor configs) and loads through `load_model` exactly like a
real one. Its answers are noise; it exists to exercise the machinery.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vidsight.errors import ConfigError
from vidsight.models.loading import CLIP_MEAN, CLIP_STD

# Qwen2-VL's special tokens, in their published order.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]

# The Qwen2-VL chat format: a default system turn, vision placeholders inside user turns.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TINY_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]})
TINY_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                   fullatt_block_indexes=[1], tokens_per_second=2)
# Small frames keep the tiny model fast: at most 224x224 per frame, at least 56x56.
TINY_VIDEO_PIXELS = dict(min_pixels=56 * 56, max_pixels=224 * 224, total_pixels=224 * 224 * 256)

# Qwen3-VL: a three-layer Qwen3 decoder (per-head q/k norms, rotary axes interleaved over 8
# frequencies as the released [24, 20, 20] split is over 64) and a two-block tower of 16-pixel
# patches whose blocks both feed DeepStack (added after decoder layers 0 and 1, not after 2).
TINY_QWEN3_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, max_position_embeddings=32768, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2],
                                        "mrope_interleaved": True})
TINY_QWEN3_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                         spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                         deepstack_visual_indexes=[0, 1])
TINY_QWEN3_PIXELS = dict(min_pixels=64 * 64, max_pixels=192 * 192, total_pixels=192 * 192 * 256)

# LLaVA-OneVision's chat format (Qwen2's turns; the video before the text of a user turn).
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>\n{% elif content['type'] == 'video' %}<video>\n"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# InternVL3's chat format: Qwen2's turns with ``<video>`` (a picture: ``<IMG_CONTEXT>``) before the
# text, where its -hf template puts them (the tiny model keeps Qwen's default system turn).
INTERNVL_CHAT_TEMPLATE = LLAVA_CHAT_TEMPLATE.replace("'image' %}<image>", "'image' %}<IMG_CONTEXT>")
INTERNVL_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
# A 6x6 patch grid folds to 3x3 tokens.
TINY_INTERNVIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=[84, 84], patch_size=[14, 14])
# The tiny Qwen2 decoder of the LLaVA-OneVision and InternVL tiny models (1-D rope).
TINY_QWEN2_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
# A 5x5 patch grid pools to 3x3 tokens: odd, as the released 27x27 grid is.
TINY_SIGLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   image_size=70, patch_size=14, vision_use_head=False)


def _byte_vocab() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table: every byte is one token, so any text encodes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {chars[b]: b for b in range(256)}


def build_tiny_tokenizer():
    from transformers import Qwen2Tokenizer

    tokenizer = Qwen2Tokenizer(vocab=_byte_vocab(), merges=[], eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               unk_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_tiny_model(directory: str | Path, seed: int = 0, text: dict | None = None,
                     family: str = "qwen2_5_vl") -> Path:
    """Write a random-weight checkpoint of ``family`` to ``directory``.

    Args:
        directory: Created if missing.
        seed: Seeds the weight initialisation; the same seed gives the same weights.
        text: Language-model settings to change from the family's tiny ones (e.g. real head
            dimensions); the vision projection's output follows its hidden size.
        family: One of `TINY_FAMILIES`.

    Returns:
        The directory.
    """
    if family not in TINY_FAMILIES:
        raise ConfigError(f"no tiny builder for family {family!r}; choose one of {', '.join(TINY_FAMILIES)}")
    return TINY_FAMILIES[family](directory, seed, text or {})


def _tiny_qwen2_5_vl(directory: str | Path, seed: int, text: dict) -> Path:
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer = build_tiny_tokenizer()
    text = {**TINY_TEXT, **text}
    config = qwen_config(tokenizer, text, dict(TINY_VISION, out_hidden_size=text["hidden_size"]))
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    return save_checkpoint(directory, model, tokenizer, **TINY_VIDEO_PIXELS)


def qwen3_config(tokenizer, text: dict, vision: dict):
    """A ``Qwen3VLConfig`` wired to ``tokenizer``'s special tokens (Qwen's, as Qwen2.5-VL's).

    Args:
        tokenizer: Carries Qwen's special tokens (``SPECIAL_TOKENS``).
        text: The language model's fields; ``vocab_size`` defaults to the tokenizer's, and
            ``tie_word_embeddings`` is the model's.
        vision: The vision tower's fields; its output size follows the language model's.
    """
    from transformers import Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(text)
    tied = text.pop("tie_word_embeddings", False)
    text_config = {"vocab_size": len(tokenizer), **text, "bos_token_id": ids["<|endoftext|>"],
                   "eos_token_id": ids["<|im_end|>"]}
    return Qwen3VLConfig(text_config=text_config, vision_config={**vision, "out_hidden_size": text["hidden_size"]},
                         image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                         vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                         tie_word_embeddings=tied)


def _tiny_qwen3_vl(directory: str | Path, seed: int, text: dict) -> Path:
    from transformers import Qwen3VLForConditionalGeneration

    tokenizer = build_tiny_tokenizer()
    config = qwen3_config(tokenizer, {**TINY_QWEN3_TEXT, **text}, TINY_QWEN3_VISION)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    pixels = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
              "image_std": [0.5, 0.5, 0.5]}
    return _save(directory, model, tokenizer, {"image_processor_type": "Qwen2VLImageProcessor", **pixels},
                 {"video_processor_type": "Qwen3VLVideoProcessor", **pixels, **TINY_QWEN3_PIXELS})


def _tokenizer_with(tokens: list[str], chat_template: str):
    """The byte-level tokenizer with a family's extra special tokens and its chat template."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS, *tokens]})
    tokenizer.chat_template = chat_template
    return tokenizer


def _qwen2_text(tokenizer, text: dict) -> dict:
    """A Qwen2 decoder's config fields wired to ``tokenizer``'s vocabulary and chat tokens."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")}
    return {"model_type": "qwen2", "vocab_size": len(tokenizer), **text, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"]}


def build_llava_tokenizer():
    """The byte-level tokenizer with LLaVA-OneVision's placeholders and chat template."""
    return _tokenizer_with(["<image>", "<video>"], LLAVA_CHAT_TEMPLATE)


def llava_config(tokenizer, text: dict, vision: dict):
    """A ``LlavaOnevisionConfig`` (a Qwen2 decoder and a SigLIP tower) wired to ``tokenizer``'s tokens.

    Args:
        tokenizer: From `build_llava_tokenizer`.
        text: The language model's fields; ``vocab_size`` defaults to the tokenizer's.
        vision: The SigLIP tower's fields.
    """
    from transformers import LlavaOnevisionConfig

    return LlavaOnevisionConfig(text_config=_qwen2_text(tokenizer, text),
                                vision_config={"model_type": "siglip_vision_model", **vision},
                                image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                                video_token_index=tokenizer.convert_tokens_to_ids("<video>"))


def _tiny_llava_onevision(directory: str | Path, seed: int, text: dict) -> Path:
    from transformers import LlavaOnevisionForConditionalGeneration

    tokenizer = build_llava_tokenizer()
    config = llava_config(tokenizer, {**TINY_QWEN2_TEXT, **text}, TINY_SIGLIP)
    torch.manual_seed(seed)
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    side = {"height": TINY_SIGLIP["image_size"], "width": TINY_SIGLIP["image_size"]}
    normalise = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "size": side}
    return _save(directory, model, tokenizer, {"image_processor_type": "LlavaOnevisionImageProcessor", **normalise},
                 {"video_processor_type": "LlavaOnevisionVideoProcessor", **normalise})


def build_internvl_tokenizer():
    """The byte-level tokenizer with InternVL's image and video tokens and chat template."""
    return _tokenizer_with(INTERNVL_TOKENS, INTERNVL_CHAT_TEMPLATE)


def internvl_config(tokenizer, text: dict, vision: dict):
    """An ``InternVLConfig`` (a Qwen2 decoder and an InternViT tower) wired to ``tokenizer``'s tokens.

    Args:
        tokenizer: From `build_internvl_tokenizer`.
        text: The language model's fields; ``vocab_size`` defaults to the tokenizer's.
        vision: The InternViT tower's fields.
    """
    from transformers import InternVLConfig

    return InternVLConfig(text_config=_qwen2_text(tokenizer, text), vision_config=vision,
                          image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"), downsample_ratio=0.5,
                          tie_word_embeddings=text.get("tie_word_embeddings", False))


def _tiny_internvl(directory: str | Path, seed: int, text: dict) -> Path:
    from transformers import InternVLForConditionalGeneration

    tokenizer = build_internvl_tokenizer()
    config = internvl_config(tokenizer, {**TINY_QWEN2_TEXT, **text}, TINY_INTERNVIT)
    torch.manual_seed(seed)
    model = InternVLForConditionalGeneration(config).eval()
    side = {"height": TINY_INTERNVIT["image_size"][0], "width": TINY_INTERNVIT["image_size"][1]}
    normalise = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "size": side}
    return _save(directory, model, tokenizer, {"image_processor_type": "GotOcr2ImageProcessor", **normalise},
                 {"video_processor_type": "InternVLVideoProcessor", **normalise})


# The families `write_tiny_model` builds, by model type.
TINY_FAMILIES = {"qwen2_5_vl": _tiny_qwen2_5_vl, "qwen3_vl": _tiny_qwen3_vl, "llava_onevision": _tiny_llava_onevision,
                 "internvl": _tiny_internvl}


def qwen_config(tokenizer, text: dict, vision: dict, pad_token: str | None = None):
    """A ``Qwen2_5_VLConfig`` wired to ``tokenizer``'s special tokens: the one builder of the tiny,
    benchmark-shape and task models.

    Args:
        tokenizer: Carries Qwen's special tokens (``SPECIAL_TOKENS``).
        text: The language model's fields; ``vocab_size`` defaults to the tokenizer's.
        vision: The vision tower's fields.
        pad_token: The special token that pads batches, if the model is trained.
    """
    from transformers import Qwen2_5_VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text_config = {"vocab_size": len(tokenizer), **text, "bos_token_id": ids["<|endoftext|>"],
                   "eos_token_id": ids["<|im_end|>"]}
    if pad_token is not None:
        text_config["pad_token_id"] = ids[pad_token]
    return Qwen2_5_VLConfig(text_config=text_config, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                            video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                            vision_end_token_id=ids["<|vision_end|>"])


def save_checkpoint(directory: str | Path, model, tokenizer, min_pixels: int, max_pixels: int,
                    total_pixels: int) -> Path:
    """Write a Qwen2.5-VL model in the Hugging Face layout, with the processor files vidsight reads.

    Args:
        directory: Created if missing.
        model: A ``Qwen2_5_VLForConditionalGeneration``.
        tokenizer: Its tokenizer, carrying Qwen's chat special tokens and a chat template.
        min_pixels: Smallest per-frame pixel count after resizing.
        max_pixels: Largest per-frame pixel count after resizing.
        total_pixels: Pixel budget for a whole video.
    """
    pixels = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "image_mean": list(CLIP_MEAN),
              "image_std": list(CLIP_STD), "min_pixels": min_pixels, "max_pixels": max_pixels}
    return _save(directory, model, tokenizer, {"image_processor_type": "Qwen2VLImageProcessor", **pixels},
                 {"video_processor_type": "Qwen2VLVideoProcessor", **pixels, "total_pixels": total_pixels})


def _save(directory: str | Path, model, tokenizer, image_processor: dict, video_processor: dict) -> Path:
    """A model, its tokenizer and generation settings, and the processor files vidsight reads."""
    from transformers import GenerationConfig

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{directory}: exists and is not a directory; name a new or existing directory") from None
    except OSError as exc:
        raise ConfigError(f"{directory}: cannot create the checkpoint directory ({exc.strerror or exc})") from None
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)  # also writes chat_template.jinja
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=eos[1]).save_pretrained(directory)
    (directory / "preprocessor_config.json").write_text(json.dumps(image_processor, indent=2))
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video_processor, indent=2))
    return directory

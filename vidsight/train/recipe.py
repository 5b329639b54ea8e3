"""The small task model: its architecture (Qwen2.5-VL, a few million parameters) and training settings."""

from __future__ import annotations

import json
from pathlib import Path

from vidsight.tasks.families import FRAME
from vidsight.models.tiny import qwen_config, save_checkpoint

# The language model's width; its depth is `TrainConfig.layers`.
TEXT = dict(hidden_size=128, intermediate_size=384, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6)
VISION = dict(depth=4, hidden_size=96, intermediate_size=192, num_heads=4, out_hidden_size=128, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=FRAME, fullatt_block_indexes=[3],
              tokens_per_second=2)
# Per-frame and per-video pixel bounds of the task model's preprocessing.
PIXELS = dict(min_pixels=56 * 56, max_pixels=FRAME * FRAME, total_pixels=FRAME * FRAME * 1024)


def model_config(tokenizer, mrope_section: tuple[int, int, int], rope_theta: float, layers: int):
    """The task model's configuration, with its rotary embedding's frequency pairs per temporal,
    height and width axis, their base and its language model's layers (`TrainConfig` holds them)."""
    rope = {"rope_type": "default", "rope_theta": float(rope_theta), "mrope_section": list(mrope_section)}
    return qwen_config(tokenizer, {**TEXT, "num_hidden_layers": layers, "rope_parameters": rope}, VISION,
                       pad_token="<|endoftext|>")


TRAINING_RECORD = "vidsight_training.json"


def write_checkpoint(directory: str | Path, model, tokenizer, record: dict | None = None) -> Path:
    """Save ``model`` and ``tokenizer`` as a Hugging Face checkpoint that `load_model` reads.

    ``record`` (steps trained, held-out accuracy) is written beside it as ``vidsight_training.json``.
    """
    directory = save_checkpoint(directory, model, tokenizer, **PIXELS)
    if record is not None:
        (directory / TRAINING_RECORD).write_text(json.dumps(record, indent=1))
    return directory

"""The small task model: its architecture (Qwen2.5-VL, a few million parameters) and training settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vidsight.bench.tasks import FRAME
from vidsight.errors import ConfigError
from vidsight.models.tiny import save_checkpoint

TEXT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]})
VISION = dict(depth=4, hidden_size=96, intermediate_size=192, num_heads=4, out_hidden_size=128, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=FRAME, fullatt_block_indexes=[3],
              tokens_per_second=2)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Training settings; the defaults are the committed model's recipe.

    Attributes:
        steps: Optimiser steps.
        seed: Seeds weights and the order of generated samples.
        batch: Clips per step (halved for clips longer than 32 frames).
        lr: Peak learning rate (linear warm-up, cosine decay to a tenth).
        warmup: Warm-up steps.
        weight_decay: AdamW weight decay.
        eval_every: Steps between held-out evaluations and checkpoints.
        eval_per_family: Held-out clips per family at each evaluation.
        probes: Further questions about each clip asked as later turns (`probe_questions`).
        cell_weight: Weight of the training-only per-video-token loss (`loop.TrainingHeads`).
        key_weight: Weight of the training-only loss at questions' key words (`loop.TrainingHeads`).
    """

    steps: int = 7000
    seed: int = 0
    batch: int = 8
    lr: float = 2e-3
    warmup: int = 300
    weight_decay: float = 0.01
    eval_every: int = 500
    eval_per_family: int = 40
    probes: int = 4
    cell_weight: float = 1.0
    key_weight: float = 1.0

    def __post_init__(self):
        if self.steps < 1 or self.eval_every < 1 or self.eval_per_family < 1 or self.batch < 2:
            raise ConfigError("steps, eval_every and eval_per_family must be positive and batch at least 2")
        if self.probes < 0 or self.cell_weight < 0 or self.key_weight < 0:
            raise ConfigError("probes, cell_weight and key_weight must be non-negative")
        if not 0 < self.lr < 1:
            raise ConfigError(f"lr must be in (0, 1), got {self.lr}")


def model_config(tokenizer):
    from transformers import Qwen2_5_VLConfig

    def token(name):
        return tokenizer.convert_tokens_to_ids(name)

    return Qwen2_5_VLConfig(
        text_config=dict(TEXT, vocab_size=len(tokenizer), bos_token_id=token("<|endoftext|>"),
                         eos_token_id=token("<|im_end|>"), pad_token_id=token("<|endoftext|>")),
        vision_config=VISION,
        image_token_id=token("<|image_pad|>"),
        video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"),
        vision_end_token_id=token("<|vision_end|>"),
    )


TRAINING_RECORD = "vidsight_training.json"


def write_checkpoint(directory: str | Path, model, tokenizer, record: dict | None = None) -> Path:
    """Save ``model`` and ``tokenizer`` as a Hugging Face checkpoint that `load_model` reads.

    ``record`` (steps trained, held-out accuracy) is written beside it as ``vidsight_training.json``.
    """
    directory = save_checkpoint(directory, model, tokenizer, min_pixels=56 * 56, max_pixels=FRAME * FRAME,
                                total_pixels=FRAME * FRAME * 1024)
    if record is not None:
        (directory / TRAINING_RECORD).write_text(json.dumps(record, indent=1))
    return directory

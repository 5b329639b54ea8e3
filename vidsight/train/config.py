"""Training settings, apart from the training code, so the command line reads them without loading torch."""

from __future__ import annotations

import dataclasses

from vidsight.errors import ConfigError
from vidsight.tasks.chat import TRAINING_FAMILIES as CHAT_TRAINING_FAMILIES

# The language model's depth when training from scratch (a fine-tune keeps its checkpoint's).
SCRATCH_LAYERS = 4


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
        order_weight: Weight of the training-only loss on objects' order of appearance
            (`loop.TrainingHeads`); 0 (the committed base recipe) leaves it out.
        retrieval_weight: Weight of the training-only loss that points a chat question's mean
            query at the patches it is about (`train.retrieval`); 0 leaves it out.
        attention_weight: Weight of the training-only loss that asks one head of the first layers to
            attend, at a chat question's key word, to the patches it is about (`train.attention`);
            0 leaves it out.
        mrope_section: Rotary frequency pairs of the temporal, height and width axes (16 in all; the
            temporal axis takes the fastest ones, as Qwen2.5-VL's does).
        rope_theta: The rotary embedding's base: with it the section sets the temporal axis's longest
            period, and so how far apart two moments can be told in order by position alone.
        init: A checkpoint directory to start from (fine-tuning) instead of random weights.
        layers: The language model's layers; None: ``init``'s, or `SCRATCH_LAYERS` from scratch. Above
            ``init``'s, the checkpoint's layers come first and each added one starts as the identity
            (its output projections zero), so the grown model answers as the checkpoint did until
            training moves them.
        offset_patches: Clips start up to this many temporal patches into a stream (positions
            shifted, frames the same; drawn per clip, half of them at 0), so the model reads
            late stream positions without long sequences. 0 keeps every clip at the start.
        chat_frames: Lengths in sampled frames of the chat-suite streams (`tasks.chat`) trained
            on, one drawn per chat step; empty for none. With any, every other step is a chat step.
        chat_questions: The question families chat steps draw from, uniformly (repeat one to weight
            it; `tasks.chat.TRAINING_FAMILIES`: the suite's, and ``order-adjacent``, order questions
            about two events with no other seen event between them); empty: the streams' own questions.
        eval_chat_frames: Length of the held-out chat streams evaluated (every question of each).
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
    order_weight: float = 0.0
    retrieval_weight: float = 0.0
    attention_weight: float = 0.0
    mrope_section: tuple[int, int, int] = (4, 6, 6)
    rope_theta: float = 10000.0
    init: str | None = None
    layers: int | None = None
    offset_patches: int = 0
    chat_frames: tuple[int, ...] = ()
    chat_questions: tuple[str, ...] = ()
    eval_chat_frames: int = 512

    def __post_init__(self):
        object.__setattr__(self, "chat_frames", tuple(self.chat_frames))
        object.__setattr__(self, "chat_questions", tuple(self.chat_questions))
        object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != 16 or min(self.mrope_section) < 1 \
                or self.rope_theta <= 1:
            raise ConfigError(f"mrope_section must be three positive counts summing to 16 (the task model's "
                              f"head_dim / 2) and rope_theta above 1; got {self.mrope_section}, {self.rope_theta}")
        if not set(self.chat_questions) <= set(CHAT_TRAINING_FAMILIES):
            raise ConfigError(f"chat_questions must be among {', '.join(CHAT_TRAINING_FAMILIES)}; "
                              f"got {self.chat_questions}")
        if self.offset_patches < 0 or any(f < 64 or f % 2 for f in (*self.chat_frames, self.eval_chat_frames)):
            raise ConfigError("offset_patches must be non-negative and chat stream lengths even, at least 64")
        if self.layers is not None and self.layers < 1:
            raise ConfigError(f"layers must be at least 1, got {self.layers}")
        if self.steps < 1 or self.eval_every < 1 or self.eval_per_family < 1 or self.batch < 2:
            raise ConfigError("steps, eval_every and eval_per_family must be positive and batch at least 2")
        if min(self.probes, self.cell_weight, self.key_weight, self.order_weight, self.retrieval_weight,
               self.attention_weight) < 0:
            raise ConfigError("probes and the loss weights must be non-negative")
        if not 0 < self.lr < 1:
            raise ConfigError(f"lr must be in (0, 1), got {self.lr}")

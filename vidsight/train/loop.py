"""Training the small task model from scratch on generated clips, with held-out evaluation and resume."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from vidsight.errors import ConfigError
from vidsight.models.base import VisionSpec
from vidsight.models.loading import CLIP_MEAN, CLIP_STD, resolve_device
from vidsight.tasks.chat import make_chat_stream
from vidsight.tasks.families import DEFAULT_FRAMES, FAMILIES, make_sample
from vidsight.models.qwen2_5_vl import Qwen25VLAdapter
from vidsight.models.tiny import CHAT_TEMPLATE
from vidsight.tasks.scenes import COLOURS, OBJECT_SHAPES
from vidsight.train.batches import IGNORE, Batch, make_batch
from vidsight.train.config import SCRATCH_LAYERS, TrainConfig
from vidsight.train import recipe
from vidsight.train.recipe import TRAINING_RECORD, model_config, write_checkpoint
from vidsight.train.attention import RotaryTap, attention_loss, key_word_rows
from vidsight.train.retrieval import ProjectionTap, retrieval_loss
from vidsight.train.tokenizer import build_task_tokenizer

log = logging.getLogger(__name__)

# Held-out clips use seeds from here up; training seeds stay below.
HELD_OUT_SEED = 1_000_000_000
# One family per step; those the model learns slowest (count, attribute, needle) twice as often.
SCHEDULE = ("count", "attribute", "needle", "order", "count", "attribute", "needle", "anomaly")
NEEDLE_TRAIN_FRAMES = (16, 32, 48, 64)
# Chat steps train on clips of about this many frames' worth of tokens (so batches stay one size).
CHAT_BATCH_FRAMES = 256
CELL_CLASSES = 1 + len(COLOURS) * len(OBJECT_SHAPES)
# Key-word answers are read after this many of the language model's layers, leaving the rest to
# carry them to the answer position.
KEY_LAYER = 2
# The order probe's classes: every set of shapes that can have appeared before an object.
ORDER_CLASSES = 2 ** len(OBJECT_SHAPES)
VISION = VisionSpec.of(recipe.VISION, CLIP_MEAN, CLIP_STD, **recipe.PIXELS)


def build_adapter(seed: int, init: str | None = None, config: TrainConfig = TrainConfig()) -> Qwen25VLAdapter:
    """The task model to train: random weights from ``seed``, or a checkpoint's with ``init``; its
    rotary embedding and depth as ``config`` sets them (a checkpoint's weights carry over to a new
    rotary embedding, and to a deeper model as its first layers; its depth unless ``config`` sets one)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer = build_task_tokenizer()
    source = None
    if init is not None:
        from vidsight.models.loading import load_model

        source = load_model(init, device="cpu", dtype=torch.float32)
        if source.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ConfigError(f"{init}: its vocabulary is not the task tokenizer's; cannot fine-tune it")
    layers = config.layers or (len(source.model.model.language_model.layers) if source else SCRATCH_LAYERS)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(
        model_config(tokenizer, config.mrope_section, config.rope_theta, layers))
    if source is not None:
        _load_grown(model, source.model, init)
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return Qwen25VLAdapter("training", model, tokenizer, CHAT_TEMPLATE, VISION, eos)


def _load_grown(model, source, init: str) -> None:
    """``source``'s weights into ``model``, whose language model may have more layers: those come
    after ``source``'s and start as the identity (attention and MLP outputs zero), so ``model``
    computes what ``source`` does until training moves them."""
    have, want = len(source.model.language_model.layers), len(model.model.language_model.layers)
    if have > want:
        raise ConfigError(f"{init}: its language model has {have} layers, more than the {want} asked for")
    loaded = model.load_state_dict(source.state_dict(), strict=False)
    added = tuple(f"model.language_model.layers.{k}." for k in range(have, want))
    odd = loaded.unexpected_keys + [name for name in loaded.missing_keys if not name.startswith(added)]
    if odd:
        raise ConfigError(f"{init}: its weights are not the task model's ({odd[0]}); cannot fine-tune it")
    with torch.no_grad():
        for layer in model.model.language_model.layers[have:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


def step_schedule(config: TrainConfig) -> tuple[str, ...]:
    """The families of consecutive steps, repeated: with chat streams, every other step is a chat step."""
    if not config.chat_frames:
        return SCHEDULE
    return tuple(f for family in SCHEDULE for f in (family, "chat"))


def step_samples(config: TrainConfig, step: int) -> list:
    """The clips of one step: a function of the seed and the step only, so resuming replays exactly."""
    schedule = step_schedule(config)
    family = schedule[step % len(schedule)]
    rng = np.random.default_rng([config.seed, step])
    base = (config.seed * 1_000_003 + step * config.batch) % (HELD_OUT_SEED - config.batch)
    if family == "chat":
        frames = int(rng.choice(config.chat_frames))
        streams = [make_chat_stream(base + i, frames) for i in range(max(1, CHAT_BATCH_FRAMES // frames))]
        if config.chat_questions:
            samples = [s.sample(s.ask(str(rng.choice(config.chat_questions)), rng)) for s in streams]
        else:
            samples = [s.sample(s.questions[int(rng.integers(len(s.questions)))]) for s in streams]
    else:
        frames = int(rng.choice(NEEDLE_TRAIN_FRAMES)) if family == "needle" else DEFAULT_FRAMES[family]
        count = config.batch if frames <= 32 else config.batch // 2
        samples = [make_sample(family, base + i, frames) for i in range(count)]
    if config.offset_patches:
        for sample in samples:
            sample.offset_patches = int(rng.integers(config.offset_patches + 1)) if rng.random() < 0.5 else 0
    return samples


class TrainingHeads(torch.nn.Module):
    """Training-only probes on hidden states, dropped when the model is exported.

    ``cells``: from each video token's last hidden state, what covers its cell. Dense per-token
    targets teach the vision tower and the lower layers to mark objects far sooner than answer
    tokens alone. ``keys``: from the hidden state after layer ``KEY_LAYER`` at a question's key
    word (`tasks.key_word`), the answer. A colour or shape question needs two hops, the question
    word to the answer position and the matching object's attribute to either; supervised only
    at the answer, neither hop gets a gradient until the other works, and the model settles on
    naming any object present. Supervising the first hop at the key word breaks the deadlock.
    ``order``: from the hidden state after layer ``KEY_LAYER`` at each video token of an object,
    the shapes of the objects that appeared before it (clips whose objects appear one after
    another). Rotary positions cannot tell apart times far beyond the temporal axis's longest
    period (17.5 s with the default rotary settings), but causal attention can: a token can see
    what came before it. A first version asked for the object's rank of appearance; it learnt
    ranks 0 and 1 but not 2 (counting), so the target is now the set of earlier shapes, which
    needs no counting.
    """

    def __init__(self, model):
        super().__init__()
        text = model.config.text_config
        self.cells = torch.nn.Linear(text.hidden_size, CELL_CLASSES, device=model.device)
        self.keys = torch.nn.Linear(text.hidden_size, text.vocab_size, device=model.device)
        self.order = torch.nn.Linear(text.hidden_size, ORDER_CLASSES, device=model.device)


def model_loss(model, batch: Batch, heads: TrainingHeads | None = None, config: TrainConfig = TrainConfig()):
    batch = batch.to(model.device)
    layers = model.model.language_model.layers
    supervised = heads is not None and (config.retrieval_weight or config.attention_weight)
    tap = ProjectionTap(layers) if supervised else None
    rotary = RotaryTap(layers) if heads is not None and config.attention_weight else None
    try:
        out = model(input_ids=batch.input_ids, labels=batch.labels, position_ids=batch.position_ids,
                    pixel_values_videos=batch.pixel_values, video_grid_thw=batch.grid_thw,
                    output_hidden_states=heads is not None)
    finally:
        for hook in (tap, rotary):
            if hook is not None:
                hook.close()
    loss = out.loss
    if heads is None:
        return loss
    text = model.config.text_config
    if config.retrieval_weight:
        retrieval = retrieval_loss(tap, batch.video_span, batch.question_span, batch.asked_patches,
                                   text.num_attention_heads, text.num_key_value_heads)
        if retrieval is not None:
            loss = loss + config.retrieval_weight * retrieval
    if config.attention_weight:
        rows = key_word_rows(batch.key_targets, batch.question_span, IGNORE)
        attention = attention_loss(tap, rotary, KEY_LAYER, batch.video_span, rows, batch.asked_patches,
                                   text.num_attention_heads, text.num_key_value_heads)
        if attention is not None:
            loss = loss + config.attention_weight * attention
    for head, states, targets, weight in ((heads.cells, out.hidden_states[-1], batch.token_labels, config.cell_weight),
                                          (heads.keys, out.hidden_states[KEY_LAYER], batch.key_targets,
                                           config.key_weight),
                                          (heads.order, out.hidden_states[KEY_LAYER], batch.order_targets,
                                           config.order_weight)):
        chosen = targets != IGNORE
        if weight and chosen.any():
            loss = loss + weight * torch.nn.functional.cross_entropy(head(states[chosen]), targets[chosen])
    return loss


@torch.no_grad()
def held_out_accuracy(adapter, config: TrainConfig) -> dict[str, float]:
    """First-answer-token accuracy per family on clips never seen in training (rendered, not encoded).

    With chat training, ``chat`` scores every question of ``eval_per_family // 4`` held-out
    streams of ``eval_chat_frames`` frames, each asked after the stream so far.
    """
    adapter.model.eval()
    suites = {family: [make_sample(family, HELD_OUT_SEED + i) for i in range(config.eval_per_family)]
              for family in FAMILIES}
    if config.chat_frames:
        streams = [make_chat_stream(HELD_OUT_SEED + i, config.eval_chat_frames)
                   for i in range(max(1, config.eval_per_family // 4))]
        suites["chat"] = [s.sample(q) for s in streams for q in s.questions]
    scores = {}
    for family, samples in suites.items():
        size = 1 if family == "chat" else 4  # a chat stream's questions see different lengths
        correct = sum(_first_token_correct(adapter, samples[lo : lo + size]) for lo in range(0, len(samples), size))
        scores[family] = correct / len(samples)
    adapter.model.train()
    return scores


def _first_token_correct(adapter, samples: list) -> int:
    """How many of ``samples`` (same length) get their answer's first token right at full compute."""
    batch = make_batch(samples, adapter, augment=False).to(adapter.model.device)
    logits = adapter.model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                           pixel_values_videos=batch.pixel_values, video_grid_thw=batch.grid_thw).logits
    rows = torch.arange(len(batch.answer_start))
    predicted = logits[rows, batch.answer_start - 1].argmax(-1)
    return int((predicted == batch.input_ids[rows, batch.answer_start]).sum())


def _schedule(config: TrainConfig):
    def factor(step: int) -> float:
        if step < config.warmup:
            return (step + 1) / config.warmup
        progress = (step - config.warmup) / max(1, config.steps - config.warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


def train(out: str | Path, config: TrainConfig = TrainConfig(), resume: bool = False, progress: bool = True,
          device: str | None = None) -> Path:
    """Train, evaluate every ``eval_every`` steps, checkpoint, and export the final model.

    Writes ``out/checkpoint.pt`` (for resuming), ``out/log.jsonl``, ``out/curves.png`` and the
    Hugging Face checkpoint ``out/model``. ``device`` defaults to CUDA when available; clips are
    generated on the CPU either way.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    adapter = build_adapter(config.seed, config.init, config)
    # The depth built is recorded, so the checkpoint exports without ``init`` at hand.
    config = dataclasses.replace(config, layers=len(adapter.model.model.language_model.layers))
    model = adapter.model.to(resolve_device(device)).train()
    heads = TrainingHeads(model)
    optimizer = torch.optim.AdamW([*model.parameters(), *heads.parameters()], lr=config.lr,
                                  weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
    start, history, elapsed = 0, [], 0.0
    checkpoint = out / "checkpoint.pt"
    if resume and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False, map_location=model.device)
        model.load_state_dict(state["model"])
        heads.load_state_dict(state["heads"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start, history, elapsed = state["step"], state["history"], state["elapsed_s"]
        log.info("resuming at step %d", start)
    losses: list[float] = []
    began = time.perf_counter() - elapsed
    for step in tqdm(range(start, config.steps), initial=start, total=config.steps, desc="train", disable=not progress):
        batch = make_batch(step_samples(config, step), adapter, augment=True, probes=config.probes)
        loss = model_loss(model, batch, heads, config)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        done = step + 1
        if done % config.eval_every == 0 or done == config.steps:
            entry = {"step": done, "loss": float(np.mean(losses)), "lr": scheduler.get_last_lr()[0],
                     "held_out_accuracy": held_out_accuracy(adapter, config),
                     "elapsed_s": round(time.perf_counter() - began, 1)}
            history.append(entry)
            losses = []
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps(entry) + "\n")
            torch.save({"model": model.state_dict(), "heads": heads.state_dict(),
                        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": done,
                        "history": history, "elapsed_s": entry["elapsed_s"], "config": config.__dict__}, checkpoint)
            plot_history(history, out / "curves.png")
            log.info("step %d loss %.4f accuracy %s", done, entry["loss"], entry["held_out_accuracy"])
    model.eval().to("cpu")
    return write_checkpoint(out / "model", model, adapter.tokenizer, _record(config, history))


def export_checkpoint(out: str | Path, seed: int = 0) -> Path:
    """Write ``out/model`` from the latest ``out/checkpoint.pt`` without training further."""
    out = Path(out)
    checkpoint = out / "checkpoint.pt"
    if not checkpoint.exists():
        raise ConfigError(f"{checkpoint}: no checkpoint to export")
    state = torch.load(checkpoint, weights_only=False, map_location="cpu")
    config = TrainConfig(**state["config"])
    adapter = build_adapter(seed, config=config)
    adapter.model.load_state_dict(state["model"])
    record = _record(config, state["history"])
    return write_checkpoint(out / "model", adapter.model.eval(), adapter.tokenizer, record)


def _record(config: TrainConfig, history: list[dict]) -> dict:
    """What a checkpoint was trained with and how it scored on held-out clips (with the record of
    the checkpoint it was fine-tuned from, if any, so the whole recipe stays on file)."""
    last = history[-1] if history else {}
    record = {"config": config.__dict__, "steps_trained": last.get("step", 0),
              "held_out_accuracy": last.get("held_out_accuracy"), "elapsed_s": last.get("elapsed_s")}
    base = Path(config.init) / TRAINING_RECORD if config.init else None
    if base is not None and base.is_file():
        record["base"] = json.loads(base.read_text())
    return record


def plot_history(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(steps, [h["loss"] for h in history], marker="o")
    left.set(xlabel="step", ylabel="training loss", yscale="log", title="loss")
    for family in history[-1]["held_out_accuracy"] if history else ():
        right.plot(steps, [h["held_out_accuracy"][family] for h in history], marker="o", label=family)
    right.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="held-out first-token accuracy")
    right.axhline(0.9, color="grey", linestyle="--", linewidth=0.8)
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

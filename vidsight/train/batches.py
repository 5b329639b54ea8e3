"""Generated samples to model inputs, through the same prompt, preprocessing and positions as inference."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from vidsight.tasks.families import SAMPLE_FPS, Sample, key_word, probe_questions
from vidsight.models.positions import prompt_positions
from vidsight.train.retrieval import asked_patches
from vidsight.vision import preprocess_video

IGNORE = -100
# BT.601 full-range RGB <-> YCbCr.
_TO_YCC = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]])
_FROM_YCC = np.linalg.inv(_TO_YCC)


def yuv420_roundtrip(frames: np.ndarray) -> np.ndarray:
    """Halve chroma resolution as H.264's yuv420p does, so training frames look like decoded ones."""
    ycc = frames.astype(np.float32) @ _TO_YCC.T.astype(np.float32)
    t, h, w, _ = ycc.shape
    chroma = ycc[..., 1:].reshape(t, h // 2, 2, w // 2, 2, 2).mean(axis=(2, 4))
    ycc[..., 1:] = np.repeat(np.repeat(chroma, 2, axis=1), 2, axis=2)
    return np.clip(np.rint(ycc @ _FROM_YCC.T.astype(np.float32)), 0, 255).astype(np.uint8)


@dataclasses.dataclass
class Batch:
    """Right-padded model inputs; padding sits after every real token, so causal attention ignores it."""

    input_ids: torch.Tensor        # (B, L)
    labels: torch.Tensor           # (B, L), IGNORE outside answers
    position_ids: torch.Tensor     # (3, B, L), Qwen's M-RoPE rule
    pixel_values: torch.Tensor     # (B * patches, patch_dim)
    grid_thw: torch.Tensor         # (B, 3)
    answer_start: torch.Tensor     # (B,) index of each first answer token
    token_labels: torch.Tensor     # (B, L) what covers each video token's cell (`Sample.cell_labels`), IGNORE elsewhere
    key_targets: torch.Tensor      # (B, L) at each question's key word (`key_word`), its answer's first token
    order_targets: torch.Tensor    # (B, L) shapes seen before each video token's object (`Sample.cell_earlier`)
    video_span: torch.Tensor       # (B, 3) first video token, end, temporal patches
    question_span: torch.Tensor    # (B, 2) the first turn's tokens after the video, before the answer
    asked_patches: torch.Tensor    # (B, patches) bool: patches showing what a chat question names (`train.retrieval`)

    def to(self, device: torch.device) -> "Batch":
        return Batch(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))


def _key_targets(asked: list[int], question: str, answer_id: int, tokenizer) -> list[int]:
    """IGNORE for every token of ``asked`` but the question's key word, which gets ``answer_id``."""
    targets = [IGNORE] * len(asked)
    word = key_word(question)
    if word is not None:
        key = tokenizer.convert_tokens_to_ids(word)
        targets[len(asked) - 1 - asked[::-1].index(key)] = answer_id
    return targets


def _later_turns(sample: Sample, tokenizer, probes: int) -> tuple[list[int], list[int], list[int]]:
    """Up to ``probes`` further user/assistant turns about the same clip: ``(ids, labels, key targets)``."""
    pairs = probe_questions(sample)
    np.random.default_rng(sample.seed).shuffle(pairs)
    ids, labels, keys = [], [], []
    for question, answer in pairs[:probes]:
        asked = tokenizer(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
                          add_special_tokens=False)["input_ids"]
        answered = tokenizer(f"{answer}<|im_end|>", add_special_tokens=False)["input_ids"]
        ids += asked + answered
        labels += [IGNORE] * len(asked) + answered
        keys += _key_targets(asked, question, answered[0], tokenizer) + [IGNORE] * len(answered)
    return ids, labels, keys


def make_batch(samples: list[Sample], adapter, augment: bool, probes: int = 0) -> Batch:
    """Render, preprocess and tokenise ``samples`` (all with the same frame count).

    The first turn is exactly what inference sees; ``probes`` > 0 appends that many further
    questions about the clip (`probe_questions`) as later turns, all supervised.
    """
    rows, labels, positions, pixels, grids, starts, cells, keys, orders = [], [], [], [], [], [], [], [], []
    video_spans, asked = [], []
    tokenizer = adapter.tokenizer
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for sample in samples:
        frames = sample.render()
        video = preprocess_video(torch.from_numpy(yuv420_roundtrip(frames) if augment else frames), adapter.vision)
        layout = adapter.build_prompt(sample.question, video.pixel_values.shape[0] // adapter.vision.merge_size ** 2)
        answer = tokenizer(sample.answer, add_special_tokens=False)["input_ids"] + [im_end]
        later_ids, later_labels, later_keys = _later_turns(sample, tokenizer, probes)
        ids = torch.cat([layout.input_ids, torch.tensor(answer + later_ids, dtype=torch.long)])
        second_per_grid_t = adapter.vision.temporal_patch_size / SAMPLE_FPS
        vpos = adapter.video_positions(video.grid_thw, second_per_grid_t, layout.video_start)
        vpos[0] += int(sample.offset_patches * second_per_grid_t * adapter.vision.tokens_per_second)
        pos, _ = prompt_positions(len(ids), layout.video_start, vpos)
        label = torch.full_like(ids, IGNORE)
        label[len(layout.input_ids):] = torch.tensor(answer + later_labels, dtype=torch.long)
        cell = torch.full_like(ids, IGNORE)
        spec = adapter.vision
        grid_labels = sample.cell_labels(spec.patch_size * spec.merge_size, spec.temporal_patch_size)
        cell[layout.video_start : layout.video_start + layout.video_tokens] = torch.from_numpy(grid_labels.reshape(-1))
        cells.append(cell)
        order = torch.full_like(ids, IGNORE)
        if sample.appearances_distinct:
            earlier = torch.from_numpy(sample.cell_earlier(spec.patch_size * spec.merge_size,
                                                           spec.temporal_patch_size)).reshape(-1)
            order[layout.video_start : layout.video_start + layout.video_tokens] = torch.where(
                earlier >= 0, earlier, IGNORE)
        orders.append(order)
        first_keys = _key_targets(layout.input_ids.tolist(), sample.question, answer[0], tokenizer)
        keys.append(torch.tensor(first_keys + [IGNORE] * len(answer) + later_keys, dtype=torch.long))
        video_end = layout.video_start + layout.video_tokens
        video_spans.append((layout.video_start, video_end, int(video.grid_thw[0])))
        shown = asked_patches(sample, spec.temporal_patch_size) if sample.family.startswith("chat") else []
        asked.append(torch.as_tensor(shown, dtype=torch.bool))
        rows.append(ids), labels.append(label), positions.append(pos), pixels.append(video.pixel_values)
        grids.append(video.grid_thw), starts.append(len(layout.input_ids))
    length = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id

    def padded(t: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, length - t.shape[-1]), value=value)

    return Batch(
        input_ids=torch.stack([padded(r, pad) for r in rows]),
        labels=torch.stack([padded(lab, IGNORE) for lab in labels]),
        position_ids=torch.stack([padded(p, 0) for p in positions], dim=1),
        pixel_values=torch.cat(pixels),
        grid_thw=torch.tensor(grids),
        answer_start=torch.tensor(starts),
        token_labels=torch.stack([padded(c, IGNORE) for c in cells]),
        key_targets=torch.stack([padded(k, IGNORE) for k in keys]),
        order_targets=torch.stack([padded(o, IGNORE) for o in orders]),
        video_span=torch.tensor(video_spans),
        question_span=torch.tensor([(end, start) for (_, end, _), start in zip(video_spans, starts)]),
        asked_patches=torch.nn.utils.rnn.pad_sequence(asked, batch_first=True, padding_value=False),
    )

"""`vidsight bench accuracy`: a held-out suite at full compute, scored against its ground truth."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vidsight.bench.intervals import wilson
from vidsight.bench.suite import STRIDE_FRAMES, WINDOW_FRAMES, build_suite, window_starts
from vidsight.engine import Asker, GenerationConfig, PrefillConfig
from vidsight.ingest import DecodeConfig, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.types import FrameBatch

ANSWER_TOKENS = 4
CONSECUTIVE_POSITIVES = 2  # CodecSight's rule: a video is positive when two consecutive windows say Yes


def normalise(answer: str) -> str:
    """First word, lower-cased, punctuation dropped."""
    words = re.findall(r"[a-z0-9]+", answer.lower())
    return words[0] if words else ""


def video_positive(verdicts: list[bool], run: int = CONSECUTIVE_POSITIVES) -> bool:
    """Whether ``run`` consecutive windows answered Yes."""
    streak = 0
    for yes in verdicts:
        streak = streak + 1 if yes else 0
        if streak >= run:
            return True
    return False


def precision_recall_f1(predicted: list[bool], actual: list[bool]) -> dict[str, float]:
    p, a = np.asarray(predicted, dtype=bool), np.asarray(actual, dtype=bool)
    tp, fp, fn = int((p & a).sum()), int((p & ~a).sum()), int((~p & a).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "tp": tp, "fp": fp, "fn": fn}


def _window(frames: FrameBatch, start: int) -> FrameBatch:
    span = slice(start, start + WINDOW_FRAMES)
    return FrameBatch(frames.data[span], frames.pts_s[span], frames.indices[span], frames.codec[span],
                      motion=frames.motion)


def run_accuracy(model, suite: str, root: str | Path, prefill: PrefillConfig = PrefillConfig(),
                 progress: bool = False, split: str = "validation") -> dict:
    """Score ``model`` on ``split`` of ``suite`` (built under ``root`` if missing), prefilling as
    ``prefill`` says.

    Returns:
        ``{"suite", "model", "families": {family: {"accuracy", "correct", "total"}},
        "anomaly_videos": {"precision", "recall", "f1", "window_accuracy", ...}, "answers": [...]}``.
    """
    manifest_path = build_suite(suite, root, progress=progress, split=split)
    manifest = json.loads(manifest_path.read_text())
    directory = manifest_path.parent
    asker = model if isinstance(model, Asker) else Asker(model)
    sampling = SamplingConfig(fps=manifest["sample_fps"])
    generation = GenerationConfig(max_new_tokens=ANSWER_TOKENS)
    families: dict[str, dict] = {}
    answers = []
    for clip in tqdm(manifest["clips"], desc="clips", disable=not progress):
        result = asker.ask(directory / clip["video"], clip["question"], sampling=sampling, generation=generation,
                           prefill=prefill)
        got = result.answer
        ok = normalise(got) == normalise(clip["answer"])
        score = families.setdefault(clip["family"], {"correct": 0, "total": 0, "visual_tokens": 0,
                                                     "encoded_visual_tokens": 0})
        score["correct"] += ok
        score["total"] += 1
        score["visual_tokens"] += result.stats.visual_tokens
        score["encoded_visual_tokens"] += result.stats.encoded_visual_tokens
        answers.append({"video": clip["video"], "question": clip["question"], "expected": clip["answer"],
                        "answer": got, "correct": ok})
    for score in families.values():
        score["accuracy"] = score["correct"] / score["total"]
        score["interval"] = wilson(score["correct"], score["total"])
        score["encoded_share"] = score["encoded_visual_tokens"] / max(score["visual_tokens"], 1)

    predicted, actual, window_hits, window_total = [], [], 0, 0
    for video in tqdm(manifest["anomaly_videos"], desc="anomaly videos", disable=not progress):
        path = directory / video["video"]
        info = probe(path)
        frames = decode_frames(path, sample_frames(info, sampling), DecodeConfig(motion=prefill.motion), info)
        verdicts = []
        for start, label in zip(window_starts(len(frames)), video["window_labels"]):
            answer = asker.ask_frames(_window(frames, start), video["query"], manifest["sample_fps"],
                                      generation=generation, prefill=prefill)
            verdicts.append(normalise(answer.answer) == "yes")
            window_hits += verdicts[-1] == label
            window_total += 1
        predicted.append(video_positive(verdicts))
        actual.append(video["label"])
    anomaly = precision_recall_f1(predicted, actual)
    anomaly.update(videos=len(actual), window_accuracy=window_hits / max(window_total, 1), windows=window_total,
                   window_accuracy_interval=wilson(window_hits, window_total),
                   window_frames=WINDOW_FRAMES, stride_frames=STRIDE_FRAMES)
    return {"suite": suite, "split": split, "model": asker.adapter.name, "prefill": dataclasses.asdict(prefill), "families": families,
            "anomaly_videos": anomaly, "answers": answers}


def format_report(report: dict) -> str:
    prune = report["prefill"]["prune"]
    motion = report["prefill"]["motion"]
    settings = [] if prune["rho"] == 1 else [
        f"KV pruning rho {prune['rho']} ({prune['scorer']}, from layer {prune['start_layer']}"
        f"{', pruned tokens skip the layers above' if prune['skip_pruned'] else ''})"]
    if motion is not None:
        settings.append(f"motion pruning tau {motion['tau']:g} ({motion['rule']}, alpha {motion['alpha']:g})")
    compute = ", ".join(settings) or "full compute"
    lines = [f"suite {report['suite']} ({report['split']} split), model {report['model']}, {compute}, "
             f"groups of {report['prefill']['group_frames']} frames", "",
             f"{'family':<10} {'accuracy':>9} {'95 % Wilson':>15} {'n':>5} {'encoded':>8}"]
    for family, score in report["families"].items():
        low, high = score["interval"]
        lines.append(f"{family:<10} {score['accuracy']:>9.1%} {f'{low:.1%}-{high:.1%}':>15} {score['total']:>5} "
                     f"{score['encoded_share']:>8.0%}")
    a = report["anomaly_videos"]
    lines += ["", f"anomaly videos ({a['videos']}, windows of {a['window_frames']} frames every {a['stride_frames']};"
              f" positive after {CONSECUTIVE_POSITIVES} consecutive Yes windows)",
              f"precision {a['precision']:.3f}  recall {a['recall']:.3f}  F1 {a['f1']:.3f}  "
              f"window accuracy {a['window_accuracy']:.1%} of {a['windows']} "
              f"(95 % Wilson {a['window_accuracy_interval'][0]:.1%}-{a['window_accuracy_interval'][1]:.1%})"]
    return "\n".join(lines)

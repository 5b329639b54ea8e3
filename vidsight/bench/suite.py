"""Held-out evaluation suites: generated clips written to H.264, with questions, answers and labels."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vidsight.errors import ConfigError
from vidsight.ingest.writer import weave, write_video
from vidsight.tasks.families import ANOMALY_QUERY, FAMILIES, FRAME, SAMPLE_FPS, anomaly_label, anomaly_scene, make_sample
from vidsight.tasks.splits import split_seed, split_seeds

# Videos are written at twice the sampling rate so sampling picks real, codec-compressed frames.
VIDEO_FPS = 2 * SAMPLE_FPS
# Watch-style anomaly videos: CodecSight's window protocol scaled to the toy model's clips.
ANOMALY_VIDEO_S = 40.0
WINDOW_FRAMES = 20   # 10 s at 2 fps
STRIDE_FRAMES = 4    # 2 s: 20 % of the window, the paper's default ratio


@dataclasses.dataclass(frozen=True)
class SuiteSpec:
    """How many held-out clips per family and how many anomaly videos a suite holds."""

    per_family: int
    anomaly_videos: int


SUITES = {"default": SuiteSpec(per_family=50, anomaly_videos=20), "smoke": SuiteSpec(per_family=4, anomaly_videos=2)}


def window_starts(frames: int) -> list[int]:
    """First sampled frame of each window ``[k * stride, k * stride + window)`` that fits."""
    return list(range(0, frames - WINDOW_FRAMES + 1, STRIDE_FRAMES))


def write_scene(path: Path, scene, duration_s: float, seed: int, gop: int = 8, codec: str = "h264",
                interlaced: bool = False) -> None:
    """Render ``scene`` at ``VIDEO_FPS`` with ``codec`` (H.264 by default; B-frames for odd seeds);
    ``interlaced``: each frame two fields, rendered half a frame apart, coded as fields."""
    times = np.arange(int(round(duration_s * VIDEO_FPS))) / VIDEO_FPS
    if interlaced:
        frames = (weave(scene.render(t), scene.render(t + 0.5 / VIDEO_FPS)) for t in times)
    else:
        frames = (scene.render(t) for t in times)
    write_video(path, frames, times, VIDEO_FPS, gop=gop, bframes=seed % 2 == 1, codec=codec, interlaced=interlaced)


def anomaly_video_scene(number: int, split: str = "validation"):
    """The ``number``-th anomaly video of ``split`` (`tasks.splits`): ``(scene, seed, per-window
    labels)``; even ones hold a Yes."""
    sampled = np.arange(int(ANOMALY_VIDEO_S * SAMPLE_FPS)) / SAMPLE_FPS
    seed = split_seed("anomaly", split, number)
    scene = anomaly_scene(np.random.default_rng(seed), seed, ANOMALY_VIDEO_S, want=number % 2 == 0, times_s=sampled)
    labels = [anomaly_label(scene, sampled[k : k + WINDOW_FRAMES]) for k in window_starts(len(sampled))]
    return scene, seed, labels


def build_suite(name: str, root: str | Path, progress: bool = False, split: str = "validation",
                interlaced: bool = False) -> Path:
    """Write suite ``name`` of ``split`` (`tasks.splits`: validation for choosing, test for
    reporting) under ``root/name`` (``root/name-test`` for the test split), reusing what is there,
    and return its manifest path.

    The manifest lists every clip with its question and answer, and every anomaly video with its
    per-window labels and its video label. Everything follows from the seeds: building twice gives
    the same suite. ``interlaced`` writes each video as a broadcast would (`write_scene`), for
    the check that reading it undoes the interlacing.
    """
    if name not in SUITES:
        raise ConfigError(f"unknown suite {name!r} (known: {', '.join(SUITES)})")
    spec = SUITES[name]
    split_seeds("families", split)   # an unknown split fails before anything is written
    directory = Path(root) / (name if split == "validation" else f"{name}-{split}")
    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / "manifest.json"
    if manifest.exists():
        return manifest
    clips, videos = [], []
    jobs = [(family, i) for family in FAMILIES for i in range(spec.per_family)]
    for family, i in tqdm(jobs, desc=f"suite {name}", disable=not progress):
        sample = make_sample(family, split_seed("families", split, i))
        path = directory / f"{family}_{i:03d}.mp4"
        write_scene(path, sample.scene, sample.frames / SAMPLE_FPS, sample.seed, interlaced=interlaced)
        clips.append({"family": family, "video": path.name, "question": sample.question, "answer": sample.answer,
                      "frames": sample.frames, "scene": sample.scene.to_dict()})
    for i in range(spec.anomaly_videos):
        scene, seed, labels = anomaly_video_scene(i, split)
        path = directory / f"anomaly_video_{i:03d}.mp4"
        write_scene(path, scene, ANOMALY_VIDEO_S, seed, interlaced=interlaced)
        videos.append({"video": path.name, "query": ANOMALY_QUERY, "label": any(labels), "window_labels": labels,
                       "scene": scene.to_dict()})
    manifest.write_text(json.dumps({"suite": name, "split": split, "frame": FRAME, "sample_fps": SAMPLE_FPS, "clips": clips,
                                    "anomaly_videos": videos}, indent=1))
    return manifest

"""`vidsight bench ask --set`: every ask setting over a set of videos in one run, with needle accuracy.

Videos (generated once under ``--out``, each with its ground truth in the scene): a static camera
over a real photograph (matplotlib's sample picture) with sensor noise and objects crossing now and
then, 5 minutes at 1280x720 and 15 fps, with x264's default GOP (250 frames) and with 48-frame GOPs;
and a panning camera, 2 minutes at 1280x720, 24 fps, 2-s GOPs (where motion pruning should save
nothing and must cost nothing). Per video and setting, one random-weight model shape: stage times,
visual tokens in the prompt, encoded by the vision tower and kept in the last layer's cache, speed-up
against full compute, peak prefill memory. Needle accuracy per setting comes from the trained task
model on the held-out suite's needle clips (64 frames, two prefill groups), prefilled the same way.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import platform
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vidsight.bench.accuracy import normalise
from vidsight.bench.motion import sample_photograph
from vidsight.bench.suite import build_suite
from vidsight.engine import Asker, GenerationConfig, PrefillConfig, PruneConfig
from vidsight.ingest import FeedConfig, SamplingConfig
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.writer import write_video
from vidsight.tasks.scenes import Scene, SceneObject

QUESTION = "What happens in this video?"
# The KV pruning that kept the needle on the task model (docs/benchmarks.md: attention scores
# against the question, from layer 1).
KV_PRUNE = PruneConfig(rho=0.5, scorer="attention", start_layer=1)
PLAIN_FEED = FeedConfig(workers=0, overlap=False, trim_gops=False, resize_in_decoder=False)  # like other loaders
SETTINGS = {
    "full compute": (PrefillConfig(group_frames=0), PLAIN_FEED),
    "pipeline, rho 1": (PrefillConfig(), FeedConfig()),
    "KV rho 0.5": (PrefillConfig(prune=KV_PRUNE), FeedConfig()),
    "motion": (PrefillConfig(motion=MotionPruneConfig()), FeedConfig()),
    "motion + KV rho 0.5": (PrefillConfig(prune=KV_PRUNE, motion=MotionPruneConfig()), FeedConfig()),
    "motion + dedup": (PrefillConfig(motion=MotionPruneConfig(), dedup_patches=True), FeedConfig()),
    "motion + dedup + KV 0.5": (PrefillConfig(prune=KV_PRUNE, motion=MotionPruneConfig(), dedup_patches=True),
                                FeedConfig()),
}


@dataclasses.dataclass(frozen=True)
class SetVideo:
    """One generated video of the set."""

    duration_s: float
    fps: int
    gop: int
    noise: float = 0.0
    pan: float = 0.0
    photo: bool = False

    def scene(self) -> Scene:
        # An object crosses the frame for 12 s of every minute, at a different height each time.
        objects = [SceneObject("square", colour, 96, t_in=start, t_out=start + 12.0, start=(-96.0, 120.0 + 90 * k % 420),
                               velocity=(115.0, 4.0))
                   for k, (start, colour) in enumerate(zip(np.arange(20.0, self.duration_s - 12, 60.0),
                                                           ("red", "blue", "green", "yellow", "white")))]
        return Scene(1280, 720, self.duration_s, seed=3, noise=self.noise, pan=self.pan,
                     photo=sample_photograph() if self.photo else None, objects=objects)


VIDEOS = {
    "static camera, noise 3, GOP 250": SetVideo(300.0, 15, 250, noise=3.0, photo=True),
    "static camera, noise 3, GOP 48": SetVideo(300.0, 15, 48, noise=3.0, photo=True),
    "panning camera, GOP 48": SetVideo(120.0, 24, 48, pan=30.0),
}


def set_video(directory: str | Path, name: str, progress: bool = False, codec: str = "h264") -> Path:
    """The set's video ``name``, written under ``directory`` once by ``codec`` at CRF 23 (x264's
    default, as a camera would; the other encoders at the same quality setting)."""
    spec = VIDEOS[name]
    path = Path(directory) / (name.replace(", ", "_").replace(" ", "-") + ("" if codec == "h264" else f"_{codec}")
                              + ".mp4")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        scene, times = spec.scene(), np.arange(int(spec.duration_s * spec.fps)) / spec.fps
        frames = (scene.render(t) for t in tqdm(times, desc=name, disable=not progress, leave=False))
        partial = path.with_suffix(".partial.mp4")
        write_video(partial, frames, times, spec.fps, gop=spec.gop, bframes=True, crf=23, codec=codec)
        partial.rename(path)
    return path


def run_ask_set(out: str | Path, shape: str = "small", fps: float = 1.0, needle_clips: int = 50,
                dtype: str = "bfloat16", progress: bool = False, codecs: tuple[str, ...] = ("h264",)) -> dict:
    """Time every setting on every video encoded by each of ``codecs`` (motion from H.264's
    vectors, from the others' pixels), then score the needle clips per setting."""
    import torch

    from vidsight.models import TASK_MODEL
    from vidsight.models.shapes import build_shape

    asker = Asker(build_shape(shape, dtype=getattr(torch, dtype)), meter_memory=True)
    sampling = SamplingConfig(fps=fps, max_frames=100_000)
    generation = GenerationConfig(max_new_tokens=8)
    report = {"shape": shape, "dtype": dtype, "sample_fps": fps, "cpu_count": os.cpu_count(),
              "machine": platform.processor() or platform.machine(), "device": str(asker.adapter.device),
              "settings": {name: {"prefill": dataclasses.asdict(p), "feed": dataclasses.asdict(f)}
                           for name, (p, f) in SETTINGS.items()}, "videos": {}}
    for video, codec in itertools.product(VIDEOS, codecs):
        path = set_video(Path(out) / "ask_set", video, progress, codec)
        runs = report["videos"][video if codec == "h264" else f"{video}, {codec}"] = {"file": str(path), "codec": codec,
                                                                                      "runs": {}}
        answers = {}
        for name, (prefill, feed) in SETTINGS.items():
            result = asker.ask(path, QUESTION, sampling=sampling, generation=generation, prefill=prefill, feed=feed,
                               progress=progress)
            runs["runs"][name] = result.stats.to_dict()
            answers[name] = result.token_ids
        base = runs["runs"]["full compute"]
        for stats in runs["runs"].values():
            stats["speedup"] = base["wall_s"] / stats["wall_s"]
        runs["lossless_pipeline_answer_identical"] = answers["pipeline, rho 1"] == answers["full compute"]
    if needle_clips:
        report["needle"] = _needle_accuracy(Asker(TASK_MODEL), Path(out) / "suites", needle_clips, progress)
    return report


def _needle_accuracy(asker: Asker, root: Path, clips: int, progress: bool) -> dict:
    manifest_path = build_suite("default", root, progress=progress)
    manifest = json.loads(manifest_path.read_text())
    needles = [c for c in manifest["clips"] if c["family"] == "needle"][:clips]
    sampling = SamplingConfig(fps=manifest["sample_fps"])
    scores = {}
    for name, (prefill, feed) in SETTINGS.items():
        correct = visual = encoded = 0
        for clip in tqdm(needles, desc=f"needle, {name}", disable=not progress, leave=False):
            result = asker.ask(manifest_path.parent / clip["video"], clip["question"], sampling=sampling,
                               generation=GenerationConfig(max_new_tokens=4), prefill=prefill, feed=feed)
            correct += normalise(result.answer) == normalise(clip["answer"])
            visual, encoded = visual + result.stats.visual_tokens, encoded + result.stats.encoded_visual_tokens
        scores[name] = {"accuracy": correct / len(needles), "clips": len(needles), "encoded_share": encoded / visual}
    return scores


def format_ask_set(report: dict) -> str:
    lines = [f"shape {report['shape']} ({report['dtype']}) on {report['device']} ({report['cpu_count']} CPUs, "
             f"{report['machine']}), sampled at {report['sample_fps']:g} fps"]
    for video, entry in report["videos"].items():
        lines += ["", video, f"{'setting':<22} {'wall s':>7} {'speed-up':>9} {'encoded':>8} {'kept':>6} {'visual':>7} "
                             f"{'peak MiB':>9}  stages (s)"]
        for name, s in entry["runs"].items():
            stages = " ".join(f"{k[:4]} {v:.1f}" for k, v in s["stages_s"].items())
            peak = s["prefill_peak_bytes"] / 2**20 if s["prefill_peak_bytes"] is not None else float("nan")
            lines.append(f"{name:<22} {s['wall_s']:7.1f} {s['speedup']:8.2f}x {s['encoded_visual_tokens']:8} "
                         f"{s['kept_visual_tokens']:6} {s['visual_tokens']:7} {peak:9.0f}  {stages}")
        lines.append(f"lossless pipeline answers as full compute: {entry['lossless_pipeline_answer_identical']}")
    if "needle" in report:
        lines += ["", "needle accuracy (task model, held-out needle clips)"]
        for name, score in report["needle"].items():
            lines.append(f"{name:<22} {score['accuracy']:6.0%} of {score['clips']}, "
                         f"{score['encoded_share']:.0%} of visual tokens encoded")
    return "\n".join(lines)


def plot_ask_set(report: dict, path: str | Path) -> Path:
    """Speed-up per setting and video, and the needle accuracy per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vidsight.bench.report import save_figure

    settings, videos = list(report["settings"]), list(report["videos"])
    fig, (speed, needle) = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / len(videos)
    x = np.arange(len(settings))
    for k, video in enumerate(videos):
        runs = report["videos"][video]["runs"]
        speed.bar(x + k * width, [runs[s]["speedup"] for s in settings], width, label=video)
    speed.axhline(1.0, color="black", linewidth=0.8)
    speed.set_xticks(x + width * (len(videos) - 1) / 2, settings, rotation=15, fontsize=8)
    speed.set(ylabel="speed-up over full compute", title=f"ask, shape {report['shape']} ({report['dtype']}), "
                                                          f"{report['sample_fps']:g} fps")
    speed.legend(fontsize=8)
    if "needle" in report:
        needle.bar(x, [report["needle"][s]["accuracy"] for s in settings], color="tab:green")
        needle.set_xticks(x, settings, rotation=15, fontsize=8)
        needle.set(ylim=(0, 1), ylabel="needle accuracy", title="task model, held-out needle clips")
    return save_figure(fig, path)


def write_ask_set(report: dict, out: str | Path) -> tuple[Path, Path]:
    from vidsight.bench.report import write_report

    return write_report(report, out, "ask_set", plot_ask_set)

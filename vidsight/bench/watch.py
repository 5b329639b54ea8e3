"""`vidsight bench watch`: Full-Comp against motion-vector pruning and selective KV refresh, in one run.

Every configuration watches the same labelled videos through `Watcher`: the generated anomaly
videos (rendered from their scenes at a chosen GOP length, so GOP sweeps are possible) or a
UCF-Crime-style folder with a labels CSV (``video,label`` with label 0/1). Per configuration it
reports the mean per-window stage latency, tokens (visual, kept after pruning, reused, refreshed),
FLOPs of the vision encoder and of everything (`bench.flops`: measured on the operations run, in
a second pass over `FLOP_VIDEOS` videos spread over the set, so the count's overhead stays out of the
timings and the run's length), video-level precision/recall/F1 with CodecSight's rule (positive
after two consecutive Yes windows) and, where a video's scene is known, window-level
precision/recall/F1 against each window's own label (a red object in the zone at any of its
sampled frames). Accuracies carry 95 % Wilson intervals, and every configuration is compared with
Full-Comp on the same videos and windows by McNemar's exact test (`bench.intervals`).

The windows default to the suite's (10 s); CodecSight's own are 40 s, which the harder suite's
longer videos (``duration_s``) allow.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vidsight.bench.accuracy import precision_recall_f1, video_positive
from vidsight.bench.flops import drive_counting
from vidsight.bench.intervals import mcnemar, wilson
from vidsight.bench.motion import CAMERA_FPS, format_motion_report, run_motion_bench
from vidsight.bench.report import save_figure, write_report
from vidsight.bench.suite import (ANOMALY_VIDEO_S, STRIDE_FRAMES, WINDOW_FRAMES, anomaly_video_scene,
                                  write_scene)
from vidsight.tasks.families import ANOMALY_QUERY, SAMPLE_FPS, anomaly_label
from vidsight.tasks.splits import split_seed
from vidsight.tasks.watch_scenes import FAMILIES as WATCH_FAMILIES, watch_scene
from vidsight.engine.stats import WINDOW_STAGES
from vidsight.engine.watch import WatchConfig, Watcher, WindowVerdict
from vidsight.errors import ConfigError
from vidsight.ingest.windows import WindowConfig
from vidsight.models.base import VLMAdapter
from vidsight.ingest.dynamic import RULES, SOFTWARE_ALPHA, MotionPruneConfig

# The anomaly suite's windows: 10 s at 2 fps, stride 20 %.
SUITE_WINDOWS = WindowConfig(window_s=WINDOW_FRAMES / SAMPLE_FPS, stride_fraction=STRIDE_FRAMES / WINDOW_FRAMES,
                             fps=SAMPLE_FPS)
DEFAULT_GOP = 32  # 8 s at the suite's 4 fps: a surveillance-style long GOP
# FLOPs are counted on this many videos' windows per configuration: counting dispatches every
# operation through Python, several times slower than running it.
FLOP_VIDEOS = 3
# A verdict reads the first answer token's logits: nothing is generated.


def configurations(prune: MotionPruneConfig = MotionPruneConfig(), windows: WindowConfig = SUITE_WINDOWS
                   ) -> dict[str, WatchConfig]:
    return {"full-comp": WatchConfig(windows),
            "pruning": WatchConfig(windows, prune=prune),
            "refresh": WatchConfig(windows, refresh="anchors"),
            "pruning+refresh": WatchConfig(windows, refresh="anchors", prune=prune)}


def supported(adapter: VLMAdapter, configs: dict[str, WatchConfig]) -> tuple[dict[str, WatchConfig], dict[str, str]]:
    """The configurations a watch with ``adapter`` accepts, and why it refuses the others."""
    accepted, refused = {}, {}
    for name, config in configs.items():
        try:
            Watcher(adapter, "?", config)
        except ConfigError as exc:
            refused[name] = str(exc)
        else:
            accepted[name] = config
    return accepted, refused


def anomaly_videos(root: str | Path, count: int, gop: int = DEFAULT_GOP, codec: str = "h264",
                   split: str = "validation") -> list[dict]:
    """The first ``count`` anomaly videos of ``split`` written with GOPs of ``gop`` frames by ``codec`` (cached)."""
    directory = Path(root) / (f"watch_gop{gop}" + ("" if codec == "h264" else f"_{codec}")
                              + ("" if split == "validation" else f"_{split}"))
    directory.mkdir(parents=True, exist_ok=True)
    videos = []
    for number in range(count):
        scene, seed, labels = anomaly_video_scene(number, split)
        path = directory / f"anomaly_video_{number:03d}.mp4"
        if not path.exists():
            write_scene(path, scene, ANOMALY_VIDEO_S, seed, gop=gop, codec=codec)
        videos.append({"video": str(path), "label": any(labels), "query": ANOMALY_QUERY, "scene": scene})
    return videos


def hard_videos(root: str | Path, per_family: int, gop: int = 64, duration_s: float = ANOMALY_VIDEO_S,
                codec: str = "h264", split: str = "validation") -> list[dict]:
    """``per_family`` videos of each harder family (`tasks.watch_scenes`), ``duration_s`` long and
    written with GOPs of ``gop`` frames (cached); even-numbered ones hold a red object in the zone.
    Each carries its scene, so windows of any length can be labelled (`window_label`)."""
    suffix = (("" if duration_s == ANOMALY_VIDEO_S else f"_{duration_s:g}s") + ("" if codec == "h264" else f"_{codec}")
              + ("" if split == "validation" else f"_{split}"))
    directory = Path(root) / f"watch_hard_gop{gop}{suffix}"
    directory.mkdir(parents=True, exist_ok=True)
    sampled = np.arange(int(duration_s * SAMPLE_FPS)) / SAMPLE_FPS
    videos = []
    for f, family in enumerate(WATCH_FAMILIES):
        for number in range(per_family):
            seed = split_seed("watch-hard", split, 1000 * f + number)
            path = directory / f"{family}_{number:03d}.mp4"
            want = number % 2 == 0
            scene = watch_scene(family, np.random.default_rng(seed), seed, duration_s, want, sampled)
            if not path.exists():
                write_scene(path, scene, duration_s, seed, gop=gop, codec=codec)
            videos.append({"video": str(path), "label": want, "query": ANOMALY_QUERY, "family": family,
                           "scene": scene})
    return videos


def labelled_folder(folder: str | Path, labels_csv: str | Path, query: str) -> list[dict]:
    """A UCF-Crime-style set: videos in ``folder`` and ``video,label`` rows (label 1 = anomalous)."""
    folder, videos = Path(folder), []
    with open(labels_csv, newline="") as f:
        for row in csv.DictReader(f):
            if "video" not in row or "label" not in row:
                raise ConfigError(f"{labels_csv}: expected a header with 'video' and 'label' columns")
            videos.append({"video": str(folder / row["video"]), "label": row["label"].strip() in ("1", "true", "yes"),
                           "query": query})
    if not videos:
        raise ConfigError(f"{labels_csv}: no videos listed")
    return videos


def _measured_flops(adapter: VLMAdapter, video: dict, config: WatchConfig) -> list[tuple[int, int]]:
    """``(vision, all)`` FLOPs of each window of ``video``, counted on a watch of its own."""
    flops = []

    def counted(steps):
        verdict, vision, total = drive_counting(steps, adapter)
        flops.append((vision, total))
        return verdict

    for _ in Watcher(adapter, video["query"], config).watch(config.open(video["video"]), run=counted):
        pass
    return flops


def window_label(scene, verdict: WindowVerdict, fps: float) -> bool:
    """Whether ``scene`` has a red object in the zone at any sampled frame of ``verdict``'s window."""
    return anomaly_label(scene, np.arange(verdict.start_s, verdict.end_s - 0.5 / fps, 1 / fps))


def run_watch(adapter: VLMAdapter, videos: list[dict], configs: dict[str, WatchConfig], progress: bool = False,
              base: dict | None = None, flop_videos: int = FLOP_VIDEOS) -> dict:
    """Watch every video under every configuration; the report described in the module docstring.
    Ratios are against ``base`` (a Full-Comp result) or the ``full-comp`` configuration. FLOPs are
    counted on ``flop_videos`` of the videos (0: not counted, reported as NaN)."""
    results = {}
    labelled = all("scene" in video for video in videos)
    for name, config in configs.items():
        windows, flops, predicted, actual, right = [], [], [], [], {}
        window_predicted, window_actual, motion_sources = [], [], set()
        counted = set(np.linspace(0, len(videos) - 1, min(flop_videos, len(videos))).round().astype(int).tolist())
        for number, video in enumerate(tqdm(videos, desc=name, disable=not progress, leave=False)):
            source = config.open(video["video"])
            verdicts = list(Watcher(adapter, video["query"], config).watch(source))
            motion_sources.add(source.motion_source)
            if number in counted:
                flops += _measured_flops(adapter, video, config)[1:]
            predicted.append(video_positive([v.yes for v in verdicts], config.alert_after))
            actual.append(video["label"])
            right.setdefault(video.get("family", "all"), []).append(predicted[-1] == actual[-1])
            if labelled:
                window_predicted += [v.yes for v in verdicts]
                window_actual += [window_label(video["scene"], v, config.windows.fps) for v in verdicts]
            windows += [{**{s: v.stages_s.get(s, 0.0) for s in WINDOW_STAGES}, "carry": v.carry_s,
                         "visual": v.visual_tokens, "kept": v.kept_tokens, "reused": v.reused_tokens,
                         "refreshed": v.refreshed_tokens}
                        for v in verdicts[1:]]  # the first window has nothing to reuse
        mean = {key: float(np.mean([w[key] for w in windows])) for key in windows[0]}
        counts = [float(np.mean(column)) for column in zip(*flops)] or [float("nan")] * 2
        mean["vision_flops"], mean["flops"] = counts
        video_correct = [p == a for p, a in zip(predicted, actual)]
        results[name] = {"windows": len(windows), "mean_per_window": mean,
                         "vision_prefill_s": mean["vision"] + mean["prefill"] + mean["preprocess"],
                         **precision_recall_f1(predicted, actual), **_accuracy(video_correct),
                         "accuracy_per_family": {family: float(np.mean(r)) for family, r in right.items()},
                         "video_correct": video_correct,
                         "motion_sources": sorted(filter(None, motion_sources))}   # None: not judged
        if labelled:
            window_correct = [p == a for p, a in zip(window_predicted, window_actual)]
            results[name]["per_window"] = {**precision_recall_f1(window_predicted, window_actual),
                                           **_accuracy(window_correct), "correct": window_correct}
        # One line per configuration as it ends, so a run stopped part way (the device check) keeps them.
        print(f"{name}: {len(windows)} windows, vision + prefill {1000 * results[name]['vision_prefill_s']:.0f} ms "
              "per window", file=sys.stderr, flush=True)
    base = base or results.get("full-comp")
    for result in results.values():
        if base:
            result["speedup_vision_prefill"] = base["vision_prefill_s"] / max(result["vision_prefill_s"], 1e-9)
            result["flops_reduction"] = base["mean_per_window"]["flops"] / max(result["mean_per_window"]["flops"], 1)
            result["f1_change"] = result["f1"] - base["f1"]
            result["against_full_comp"] = _paired(base, result)
    return results


def _accuracy(correct: list[bool]) -> dict:
    return {"accuracy": float(np.mean(correct)) if correct else float("nan"),
            "accuracy_interval": list(wilson(sum(correct), len(correct)))}


def _paired(base: dict, result: dict) -> dict:
    """McNemar's test of ``result`` against ``base`` on the same videos and, where both judged the
    same windows (same window settings), the same windows."""
    paired = {"videos": mcnemar(base["video_correct"], result["video_correct"])}
    windows = base.get("per_window", {}).get("correct"), result.get("per_window", {}).get("correct")
    if windows[0] is not None and windows[1] is not None and len(windows[0]) == len(windows[1]):
        paired["windows"] = mcnemar(*windows)
    return paired


def sweeps(prune: MotionPruneConfig, windows: WindowConfig = SUITE_WINDOWS) -> dict[str, dict]:
    """Pruning+refresh with one setting changed at a time, on ``windows``: axis -> value -> config."""
    both = configurations(prune, windows)["pruning+refresh"]
    return {
        "tau": {value: dataclasses.replace(both, prune=dataclasses.replace(prune, tau=value))
                for value in (0.25, 1.0, 4.0, 16.0)},
        "alpha": {value: dataclasses.replace(both, prune=dataclasses.replace(prune, alpha=value))
                  for value in (0.0, SOFTWARE_ALPHA)},
        "rule": {rule: dataclasses.replace(both, prune=dataclasses.replace(prune, rule=rule)) for rule in RULES},
        "refresh": {mode: dataclasses.replace(both, refresh=mode) for mode in ("anchors", "deviation", "reuse")},
        "align": {align: dataclasses.replace(both, windows=dataclasses.replace(windows, align_keyframes=align))
                  for align in (False, True)},
        "reuse_in_place": {in_place: dataclasses.replace(both, reuse_in_place=in_place) for in_place in (True, False)},
    }


SWEEP_AXES = ("tau", "alpha", "rule", "refresh", "align", "reuse_in_place", "stride", "gop")


def run_watch_bench(adapter: VLMAdapter, videos: list[dict], prune: MotionPruneConfig = MotionPruneConfig(),
                    axes: tuple[str, ...] = (), root: str | Path = "", static_scenes: tuple[str, ...] = (),
                    progress: bool = False, videos_at: Callable[[int], list[dict]] | None = None,
                    cost_video: str | Path | None = None,
                    windows: WindowConfig = SUITE_WINDOWS, flop_videos: int = FLOP_VIDEOS,
                    camera_fps: float = CAMERA_FPS) -> dict:
    """The four configurations on ``windows`` (pruning as ``prune`` says); sweeps of one setting at a
    time for pruning+refresh along ``axes`` (`SWEEP_AXES`: stride and GOP length against their own
    Full-Comp, the rest against the four's; GOP length only when ``videos_at`` rewrites the videos
    with another GOP), and optionally the motion rules on noisy static-camera scenes (`bench.motion`)
    encoded with each codec of ``static_scenes`` (recorded at ``camera_fps``), with judging's cost
    per codec at 1280x720. Configurations the model's family refuses (motion pruning where tokens
    pool across patch groups, KV reuse where frames are labelled by their place in the window) are
    left out, with the reason under ``refused``.

    Raises:
        ConfigError: sweeps or static scenes asked of a model that refuses pruning+refresh.
    """
    configs, refused = supported(adapter, configurations(prune, windows))
    if "pruning+refresh" in refused and (axes or static_scenes):
        raise ConfigError(f"the sweeps and static scenes vary pruning+refresh, which this model refuses: "
                          f"{refused['pruning+refresh']}")
    report = {"model": adapter.name, "videos": len(videos), "cpu_count": os.cpu_count(), "device": str(adapter.device),
              "machine": platform.processor() or platform.machine(), "window_s": windows.window_s,
              "stride_fraction": windows.stride_fraction, "fps": windows.fps, "tau": prune.tau,
              "motion_source": prune.source,
              "configs": run_watch(adapter, videos, configs, progress, flop_videos=flop_videos), "refused": refused}
    both, base = configurations(prune, windows)["pruning+refresh"], report["configs"]["full-comp"]
    report["sweeps"] = {axis: {value: run_watch(adapter, videos, {"both": config}, progress, base, flop_videos)["both"]
                               for value, config in values.items()}
                        for axis, values in sweeps(prune, windows).items() if axis in axes}
    if "stride" in axes:
        report["sweeps"]["stride"] = {}
        for stride in (0.1, 0.2, 0.4):
            strided = WindowConfig(windows.window_s, stride, windows.fps)
            configs = {"full-comp": WatchConfig(strided), "both": dataclasses.replace(both, windows=strided)}
            report["sweeps"]["stride"][stride] = run_watch(adapter, videos, configs, progress,
                                                           flop_videos=flop_videos)["both"]
    if "gop" in axes and videos_at is not None:
        report["sweeps"]["gop"] = {gop: run_watch(adapter, videos_at(gop), {"full-comp": WatchConfig(windows),
                                                                           "both": both}, progress,
                                                     flop_videos=flop_videos)["both"]
                                   for gop in (8, 32, 64)}
    if static_scenes:
        report["static_scenes"] = {
            "qwen2.5-vl grid": run_motion_bench(root, codecs=static_scenes, cost_codecs=static_scenes,
                                                cost_video=cost_video, camera_fps=camera_fps),
            "this model's grid": run_motion_bench(root, spec=adapter.vision, codecs=static_scenes,
                                                  camera_fps=camera_fps)}
    return report


def format_watch_report(report: dict) -> str:
    lines = [f"{report['videos']} videos, model {report['model']} on {report['device']} ({report['cpu_count']} CPUs); "
             f"windows {report['window_s']:g} s, stride {report['stride_fraction']:.0%}, {report['fps']:g} fps, "
             f"tau {report['tau']} px, motion source {report.get('motion_source', 'auto')}", "",
             f"{'config':<16} {'vis+pre s':>9} {'speed-up':>8} {'GFLOP':>8} {'FLOP ÷':>7} {'kept/visual':>12} "
             f"{'reused':>7} {'refresh':>7} {'carry ms':>8} {'P':>5} {'R':>5} {'F1':>5} {'win F1':>6}"]
    for name, r in report["configs"].items():
        m = r["mean_per_window"]
        window_f1 = f"{r['per_window']['f1']:6.2f}" if "per_window" in r else f"{'-':>6}"
        lines.append(f"{name:<16} {r['vision_prefill_s']:9.4f} {r.get('speedup_vision_prefill', 1):7.2f}x "
                     f"{m['flops'] / 1e9:8.2f} {r.get('flops_reduction', 1):6.2f}x "
                     f"{m['kept']:5.0f}/{m['visual']:<6.0f} {m['reused']:7.0f} {m['refreshed']:7.0f} "
                     f"{1000 * m['carry']:8.2f} {r['precision']:5.2f} {r['recall']:5.2f} {r['f1']:5.2f} {window_f1}")
    families = report["configs"]["full-comp"].get("accuracy_per_family", {})
    if len(families) > 1:
        lines.append("\nvideo-level accuracy per family: " + "; ".join(
            f"{name}: " + " ".join(f"{family} {r['accuracy_per_family'][family]:.2f}" for family in families)
            for name, r in report["configs"].items()))
    lines.append("\naccuracy (95 % Wilson) and McNemar against Full-Comp (right only under Full-Comp / only under "
                 "the configuration, p):")
    for name, r in report["configs"].items():
        lines.append(f"  {name:<16} {_accuracy_text(r, r.get('against_full_comp', {}), 'videos')}"
                     + (f"; {_accuracy_text(r['per_window'], r.get('against_full_comp', {}), 'windows')}"
                        if "per_window" in r else ""))
    for axis, runs in report.get("sweeps", {}).items():
        lines.append(f"\nsweep {axis} (pruning+refresh): " + "; ".join(
            f"{value}: {r['speedup_vision_prefill']:.2f}x, {r['flops_reduction']:.2f}x FLOP, kept "
            f"{r['mean_per_window']['kept']:.0f}, carry {1000 * r['mean_per_window']['carry']:.2f} ms, F1 {r['f1']:.2f}"
            + (f", window F1 {r['per_window']['f1']:.2f}" if "per_window" in r else "") for value, r in runs.items()))
    for grid, scenes in report.get("static_scenes", {}).items():
        lines += ["", f"static scenes, {grid}:", format_motion_report(scenes)]
    return "\n".join(lines)


def _accuracy_text(result: dict, paired: dict, unit: str) -> str:
    low, high = result["accuracy_interval"]
    text = f"{unit} {result['accuracy']:.3f} ({low:.3f}-{high:.3f})"
    if unit in paired:
        test = paired[unit]
        text += f", {test['only_first']}/{test['only_second']} p={test['p_value']:.2g}"
    return text


def plot_watch_report(report: dict, path: str | Path) -> Path:
    """Per-window latency breakdown, tokens, and F1 per configuration (CodecSight's Figures 11, 13, 15)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report["configs"]
    names = list(configs)
    sweeps = report.get("sweeps", {})
    columns = min(4, 3 + len(sweeps))
    rows = -(-(3 + len(sweeps)) // columns)
    fig, grid = plt.subplots(rows, columns, figsize=(5 * columns, 4 * rows), squeeze=False)
    axes = grid.ravel()
    for ax in axes[3 + len(sweeps):]:
        ax.axis("off")
    left = np.zeros(len(names))
    for stage in ("preprocess", "vision", "prefill"):
        values = np.array([configs[n]["mean_per_window"][stage] for n in names])
        axes[0].bar(names, values, bottom=left, label=stage)
        left += values
    axes[0].set(ylabel="seconds per window", title="per-window latency")
    axes[0].legend()
    x = np.arange(len(names))
    for offset, key in zip((-0.3, -0.1, 0.1, 0.3), ("visual", "kept", "reused", "refreshed")):
        axes[1].bar(x + offset, [configs[n]["mean_per_window"][key] for n in names], width=0.2, label=key)
    axes[1].set_xticks(x, names)
    axes[1].set(ylabel="tokens per window", title="tokens")
    axes[1].legend()
    axes[2].bar(x - 0.2, [configs[n]["f1"] for n in names], width=0.4, label="per video")
    if all("per_window" in configs[n] for n in names):
        axes[2].bar(x + 0.2, [configs[n]["per_window"]["f1"] for n in names], width=0.4, label="per window")
    axes[2].set_xticks(x, names)
    axes[2].set(ylim=(0, 1.05), ylabel="F1", title="accuracy")
    axes[2].legend()
    for ax, (axis, runs) in zip(axes[3:], sweeps.items()):
        values = list(runs)
        ax.plot([str(v) for v in values], [runs[v]["speedup_vision_prefill"] for v in values], marker="o",
                label="vision+prefill speed-up")
        ax.plot([str(v) for v in values], [runs[v]["f1"] for v in values], marker="s", label="F1")
        ax.set(xlabel=axis, title=f"sweep: {axis}")
        ax.legend()
    for ax in axes[:3]:
        ax.tick_params(axis="x", labelrotation=20)
    return save_figure(fig, path)


def write_watch_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    return write_report(report, out, "watch", plot_watch_report)

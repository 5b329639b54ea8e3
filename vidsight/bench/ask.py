"""`vidsight bench ask`: full-compute ask against QuickVideo's pipeline, in one process on one video.

Runs, all with the same random-weight model shape, video, sampling and question:

* ``full compute``: one sequential decoder (FFmpeg's threads) decoding every frame, like other
  video loaders, then the whole prompt in one prefill;
* ``decode, then groups``: interval-parallel decoding of the whole video, then group prefill with
  pruning at the first ratio (the stages alone, for the overlap check);
* ``overlap, rho=R``: decoding overlapped with group prefill, for rho 1 and each ratio;
* ``overlap, rho=R, skip pruned`` and ``decode, then groups, rho=R, skip pruned``: with the
  pruned tokens also skipping the layers above the first pruned one (`PruneConfig.skip_pruned`),
  for each ratio, overlapped and not (on a CPU-only machine the model and the decoders share the
  cores, so overlapping can cost more than it hides);
* ``overlap, rho=R, skip pruned, oversubscribed``: the first ratio with the model keeping all its
  threads while the decoders run (`FeedConfig.split_cores` off), as before the cores were split.

``headline`` runs only three (the device check's): full compute, QuickVideo's pipeline (``overlap,
rho=R``) and it with motion pruning (``overlap, rho=R, motion pruning``, CodecSight's tau 0.25).

The overlap is real when an overlapped run's wall time is within 15 % of QuickVideo's bound (section
3.3, eq. 3): max(decoding + the last group's prefill, prefill + the first group's decoding), plus
generation. Decoding, prefill and the last group come from the ``decode, then groups`` run of the
same prefill settings; the first group's decoding (probing included: nothing overlaps it) from the
overlapped run itself. Checked for pruning at the first ratio and for every skip-pruned ratio.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from pathlib import Path

import numpy as np

from vidsight.bench.decode import bench_video
from vidsight.bench.report import save_figure, write_report
from vidsight.engine import Asker, GenerationConfig, PrefillConfig, PruneConfig
from vidsight.ingest import FeedConfig
from vidsight.engine.stats import STAGES
from vidsight.ingest import MotionPruneConfig, SamplingConfig, SyntheticSpec, probe

# The issue's video: 5 minutes, sampled at 1 fps. Keyframes every 250 frames, x264's default (what
# FFmpeg writes unless told otherwise); `--gop` makes others.
ASK_VIDEO = SyntheticSpec(width=1280, height=720, fps=24, duration_s=300, gop=250, bframes=True, square_size=96)
ASK_FPS = 1.0
QUESTION = "What happens in this video?"
OVERLAP_TOLERANCE = 0.15


def _runs(rhos, group_frames: int, workers: int | None, headline: bool = False
          ) -> dict[str, tuple[PrefillConfig, FeedConfig]]:
    first = PruneConfig(rho=rhos[0])
    plain = FeedConfig(workers=0, overlap=False, trim_gops=False, resize_in_decoder=False)  # like other loaders
    if headline:
        motion = PrefillConfig(group_frames, first, motion=MotionPruneConfig(tau=0.25))
        return {"full compute": (PrefillConfig(group_frames=0), plain),
                f"overlap, rho={rhos[0]:g}": (PrefillConfig(group_frames, first), FeedConfig(workers)),
                f"overlap, rho={rhos[0]:g}, motion pruning": (motion, FeedConfig(workers))}
    runs = {"full compute": (PrefillConfig(group_frames=0), plain),
            f"decode, then groups, rho={rhos[0]:g}": (PrefillConfig(group_frames, first),
                                                      FeedConfig(workers, overlap=False))}
    for rho in (1.0, *rhos):
        runs[f"overlap, rho={rho:g}"] = (PrefillConfig(group_frames, PruneConfig(rho=rho)), FeedConfig(workers))
    for rho in rhos:
        skip = PrefillConfig(group_frames, PruneConfig(rho=rho, skip_pruned=True))
        runs[f"overlap, rho={rho:g}, skip pruned"] = (skip, FeedConfig(workers))
        runs[f"decode, then groups, rho={rho:g}, skip pruned"] = (skip, FeedConfig(workers, overlap=False))
        if rho == rhos[0]:
            runs[f"overlap, rho={rho:g}, skip pruned, oversubscribed"] = (skip, FeedConfig(workers, split_cores=False))
    return runs


def run_ask_bench(video: str | Path, shape: str = "small", rhos=(0.5, 0.2), group_frames: int = 32,
                  workers: int | None = None, fps: float = ASK_FPS, max_new_tokens: int = 8,
                  dtype: str = "bfloat16", progress: bool = False, headline: bool = False) -> dict:
    """Time every run on ``video`` with a random-weight model of ``shape``; see the module docstring."""
    import torch

    from vidsight.models.shapes import build_shape

    adapter = build_shape(shape, dtype=getattr(torch, dtype))
    asker = Asker(adapter, meter_memory=True)
    info = probe(video)
    sampling = SamplingConfig(fps=fps, max_frames=100_000)
    generation = GenerationConfig(max_new_tokens=max_new_tokens)
    report = {"video": str(video), "size": f"{info.width}x{info.height}", "duration_s": info.duration_s,
              "sample_fps": fps, "shape": shape, "dtype": dtype, "group_frames": group_frames,
              "cpu_count": os.cpu_count(),
              "machine": platform.processor() or platform.machine(), "device": str(adapter.device), "runs": {}}
    answers = {}
    for name, (prefill, feed) in _runs(tuple(rhos), group_frames, workers, headline).items():
        result = asker.ask(video, QUESTION, sampling=sampling, generation=generation, prefill=prefill, feed=feed,
                           progress=progress)
        report["runs"][name] = result.stats.to_dict()
        answers[name] = result.token_ids
        # One line per run as it ends, so a run stopped part way (the device check's limits) keeps them.
        print(f"{name}: {result.stats.wall_s:.1f} s", file=sys.stderr, flush=True)
    if "overlap, rho=1" in answers:
        report["rho1_answer_identical"] = answers["overlap, rho=1"] == answers["full compute"]
    _summarise(report, rhos)
    return report


def _summarise(report: dict, rhos) -> None:
    runs = report["runs"]
    base = runs["full compute"]
    for stats in runs.values():
        stats["speedup"] = base["wall_s"] / stats["wall_s"]
        stats["memory_reduction"] = base["prefill_peak_bytes"] / max(stats["prefill_peak_bytes"], 1)
        stats["stage_sum_s"] = sum(stats["stages_s"].values())
    report["overlap"] = {}
    for overlapped_name, alone_name in _overlap_pairs(rhos):
        if alone_name not in runs:
            continue
        alone, overlapped = runs[alone_name], runs[overlapped_name]
        decoding = alone["stages_s"]["decode"]
        prefill = sum(alone["stages_s"][s] for s in ("preprocess", "vision", "prefill"))
        generate = alone["stages_s"]["generate"]
        bound = max(decoding + alone["last_group_s"], prefill + overlapped["fill_s"]) + generate
        wall = overlapped["wall_s"]
        report["overlap"][overlapped_name] = {
            "decoding_alone_s": decoding, "prefill_alone_s": prefill, "last_group_s": alone["last_group_s"],
            "fill_s": overlapped["fill_s"], "generate_s": generate, "bound_s": bound, "overlapped_wall_s": wall,
            "over_bound": wall / bound - 1, "within_tolerance": wall <= (1 + OVERLAP_TOLERANCE) * bound}


def _overlap_pairs(rhos) -> list[tuple[str, str]]:
    """Each overlapped run with the decode-first run of the same prefill, whose stages bound it."""
    first, skip = f"rho={rhos[0]:g}", f"rho={rhos[0]:g}, skip pruned"
    return [(f"overlap, {first}", f"decode, then groups, {first}"),
            *((f"overlap, rho={rho:g}, skip pruned", f"decode, then groups, rho={rho:g}, skip pruned") for rho in rhos),
            (f"overlap, {skip}, oversubscribed", f"decode, then groups, {skip}")]


def format_ask_report(report: dict) -> str:
    lines = [f"{report['video']}: {report['size']}, {report['duration_s']:.0f} s at {report['sample_fps']:g} fps; "
             f"shape {report['shape']} ({report['dtype']}) on {report['device']} ({report['cpu_count']} CPUs); "
             f"groups of {report['group_frames']} frames",
             "", f"{'run':<34} {'wall s':>8} {'speed-up':>9} {'peak MiB':>9} {'mem ÷':>6} {'kept/visual':>12}  stages"]
    for name, s in report["runs"].items():
        stages = " ".join(f"{k[:4]} {s['stages_s'][k]:.1f}" for k in STAGES)
        lines.append(f"{name:<34} {s['wall_s']:8.1f} {s['speedup']:8.2f}x {s['prefill_peak_bytes'] / 2**20:9.0f} "
                     f"{s['memory_reduction']:5.1f}x {s['kept_visual_tokens']:>5}/{s['visual_tokens']:<6}  {stages}")
    lines.append("")
    for name, o in report["overlap"].items():
        lines.append(f"{name}: wall {o['overlapped_wall_s']:.1f} s vs max(decoding {o['decoding_alone_s']:.1f} + "
                     f"last group {o['last_group_s']:.1f}, prefill {o['prefill_alone_s']:.1f} + first group's "
                     f"decoding {o['fill_s']:.1f}) + generate {o['generate_s']:.1f} = {o['bound_s']:.1f} s "
                     f"({o['over_bound']:+.0%}): {'within' if o['within_tolerance'] else 'NOT within'} "
                     f"{OVERLAP_TOLERANCE:.0%}")
    if "rho1_answer_identical" in report:
        lines.append(f"rho=1 answer identical to full compute: {report['rho1_answer_identical']}")
    return "\n".join(lines)


def plot_ask_report(report: dict, path: str | Path) -> Path:
    """A latency breakdown per run (QuickVideo's Figure 5) and prefill peak memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    names = list(runs)
    y = np.arange(len(names))
    fig, (bars, memory) = plt.subplots(1, 2, figsize=(14, 0.6 * len(names) + 2.5),
                                       gridspec_kw={"width_ratios": [2, 1]})
    left = np.zeros(len(names))
    for stage in STAGES:
        seconds = np.array([runs[n]["stages_s"][stage] for n in names])
        bars.barh(y, seconds, left=left, label=stage if stage != "decode" else "decode (waiting, when overlapped)")
        left += seconds
    bars.scatter([runs[n]["wall_s"] for n in names], y, color="black", marker="|", s=300, label="wall time", zorder=3)
    bars.set_yticks(y, names)
    bars.invert_yaxis()
    bars.set(xlabel="seconds", title=f"ask latency, {report['duration_s'] / 60:.0f}-min {report['size']} video, "
                                     f"shape {report['shape']}, {report['dtype']}")
    bars.legend(fontsize=8)
    memory.barh(y, [runs[n]["prefill_peak_bytes"] / 2**20 for n in names], color="tab:purple")
    memory.set_yticks(y, [])
    memory.invert_yaxis()
    memory.set(xlabel="MiB", title="peak prefill memory")
    return save_figure(fig, path)


def write_ask_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    return write_report(report, out, "ask", plot_ask_report)


def ask_video(directory: str | Path, gop: int | None = None, duration_s: float | None = None,
              fps: float | None = None) -> Path:
    """The generated 1280x720 benchmark video (5 minutes at 24 fps, keyframes every 250 frames,
    unless told otherwise), made once and reused."""
    changes = {k: v for k, v in dict(gop=gop, duration_s=duration_s, fps=fps).items() if v is not None}
    return bench_video(directory, dataclasses.replace(ASK_VIDEO, **changes))

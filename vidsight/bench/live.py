"""A watch of a live stream when the model is slower than the stream: catching up against judging
every window, in one run on the same replay (`vidsight bench live`).

The video is replayed at its own frame rate (`StreamSource(realtime=True)`, a camera's pace) twice:
once with the watch catching up (`WatchConfig.catch_up`: the newest complete window judged, the
ones before it passed over) and once judging every window. For each: windows judged and skipped,
frames dropped, the lag from a window's last frame to its verdict, and the model's work per window;
and, for the windows both judged, how far their answers' p(yes) differ.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from vidsight.engine.watch import WatchConfig, Watcher
from vidsight.models.base import VLMAdapter

MODES = {"catch-up": True, "every-window": False}


def run_live_bench(adapter: VLMAdapter, video: str | Path, config: WatchConfig, query: str,
                   progress=print) -> dict:
    """Watch ``video`` replayed in real time under ``config``, catching up and judging every window."""
    runs = {}
    for mode, catch_up in MODES.items():
        watch = dataclasses.replace(config, catch_up=catch_up)
        watcher = Watcher(adapter, query, watch)
        source = watch.open(str(video), realtime=True)
        started, verdicts = time.perf_counter(), []
        for verdict in watcher.watch(source):
            verdicts.append({"window": verdict.window, "lag_s": verdict.lag_s, "skipped": verdict.windows_skipped,
                             "p_yes": verdict.p_yes, "answer": verdict.answer,
                             "work_s": verdict.stages_s.get("vision", 0.0) + verdict.stages_s.get("prefill", 0.0),
                             "at_s": time.perf_counter() - started})
        runs[mode] = {"verdicts": verdicts, "windows_skipped": watcher.windows_skipped,
                      "frames_dropped": watcher.frames_dropped, "frames_decoded": source.frames_decoded,
                      "wall_s": time.perf_counter() - started, **_figures(verdicts)}
        progress(f"{mode}: {len(verdicts)} windows judged, {watcher.windows_skipped} skipped, lag p50 "
                 f"{runs[mode]['lag_s']['p50']:.2f} s, max {runs[mode]['lag_s']['max']:.2f} s")
    both = {v["window"]: v["p_yes"] for v in runs["catch-up"]["verdicts"]}
    shared = [abs(both[v["window"]] - v["p_yes"]) for v in runs["every-window"]["verdicts"] if v["window"] in both]
    windows = config.windows
    return {"video": str(video), "model": adapter.name, "query": query, "window_s": windows.window_s,
            "stride_s": windows.stride_frames / windows.fps, "fps": windows.fps, "refresh": config.refresh,
            "prune_tau": config.prune.tau if config.prune else None, "runs": runs,
            "shared_windows": len(shared), "p_yes_max_difference": max(shared, default=None)}


def _figures(verdicts: list[dict]) -> dict:
    lags = np.array([v["lag_s"] for v in verdicts])
    work = np.array([v["work_s"] for v in verdicts])
    return {"windows_judged": len(verdicts),
            "lag_s": {"p50": float(np.median(lags)), "p90": float(np.percentile(lags, 90)), "max": float(lags.max())},
            "work_s_per_window": float(work.mean())}


def format_live_report(report: dict) -> str:
    lines = [f"{report['video']}: {report['model']}, {report['window_s']:g}-s windows every "
             f"{report['stride_s']:g} s at {report['fps']:g} fps, refresh {report['refresh']}, replayed in real time",
             "mode           judged  skipped  dropped  work/window  lag p50  lag p90  lag max"]
    for mode, run in report["runs"].items():
        lag = run["lag_s"]
        lines.append(f"{mode:<14} {run['windows_judged']:>6}  {run['windows_skipped']:>7}  {run['frames_dropped']:>7}  "
                     f"{run['work_s_per_window']:>9.2f} s  {lag['p50']:>5.2f} s  {lag['p90']:>5.2f} s  "
                     f"{lag['max']:>5.2f} s")
    if report["p_yes_max_difference"] is not None:
        lines.append(f"windows judged by both: {report['shared_windows']}, p(yes) differs by at most "
                     f"{report['p_yes_max_difference']:.2e}")
    return "\n".join(lines)

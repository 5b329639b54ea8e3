"""`vidsight bench decode`: sequential, FFmpeg-threaded, interval-parallel and other decoders, one run.

Every method decodes the same sampled frames of the same file; vidsight's methods are checked
frame for frame against single-threaded sequential decoding, other libraries are compared
pixel-wise and their largest difference reported. Two more rows, apart from the parallel-scaling
ones, time the parallel decoder with the most workers as processes instead of threads, and with
`DecodeConfig.trim_gops` (only the packets the sampled frames depend on).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from vidsight.bench.report import save_figure, write_report
from vidsight.ingest import DecodeConfig, SamplingConfig, SyntheticSpec, decode_frames, decode_parallel, make_video
from vidsight.ingest import FrameBatch, probe, sample_frames

# The benchmark video: 10 minutes of 1280x720 H.264.
BENCH_VIDEO = SyntheticSpec(width=1280, height=720, fps=24, duration_s=600, gop=16, bframes=True, square_size=96)


def bench_video(directory: str | Path, spec: SyntheticSpec = BENCH_VIDEO) -> Path:
    """The generated benchmark video, made once and reused (named by size, length and GOP)."""
    path = Path(directory) / f"bench_{spec.width}x{spec.height}_{int(spec.duration_s)}s_{spec.fps:g}fps_gop{spec.gop}.mp4"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        make_video(path, spec)
    return path


REPEATS = 2  # each method's best of this many runs, so one disturbed run does not decide


def _timed(fn, repeats: int = REPEATS):
    best, out = float("inf"), None
    for _ in range(repeats):
        out = None  # long videos: never hold two decodes at once
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def _other_libraries(path: Path, indices: np.ndarray) -> dict[str, Callable[[], torch.Tensor]]:
    """Decoders from other libraries that are installed here, as ``name -> () -> (T, H, W, 3) uint8``."""
    found = {}
    try:
        import decord

        def with_decord():
            reader = decord.VideoReader(str(path), ctx=decord.cpu(0))
            return torch.from_numpy(reader.get_batch(list(indices)).asnumpy())
        found["decord get_batch"] = with_decord
    except (ImportError, OSError):
        pass
    try:
        from torchcodec.decoders import VideoDecoder

        def with_torchcodec():
            return VideoDecoder(str(path)).get_frames_at(indices.tolist()).data.permute(0, 2, 3, 1).contiguous()
        found["torchcodec get_frames_at"] = with_torchcodec
        if torch.cuda.is_available():
            def with_torchcodec_cuda():
                decoder = VideoDecoder(str(path), device="cuda")
                return decoder.get_frames_at(indices.tolist()).data.permute(0, 2, 3, 1).contiguous().cpu()
            found["torchcodec get_frames_at, CUDA (NVDEC)"] = with_torchcodec_cuda
    except (ImportError, OSError, RuntimeError):
        pass
    return found


def unavailable_decoders() -> dict[str, str]:
    """The other decoders the report would compare against that do not load here, with why."""
    import importlib.util

    import av

    missing = {name: "not installed" for name in ("decord", "torchcodec") if importlib.util.find_spec(name) is None}
    if "h264_cuvid" not in av.codecs_available:
        missing["PyAV NVDEC (h264_cuvid)"] = "this FFmpeg build has no NVDEC decoders"
    if not torch.cuda.is_available():
        missing["torchcodec CUDA"] = "no CUDA device"
    return missing


def _max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Largest per-pixel difference, frame by frame so long videos fit in memory; None if shapes differ."""
    if a.shape != b.shape:
        return None
    return max(int((x.to(torch.int16) - y.to(torch.int16)).abs().max()) for x, y in zip(a, b))


def run_decode_bench(path: str | Path, fps_values=(1.0, 2.0), workers=None, repeats: int = REPEATS,
                     lengths_s=(), worker_counts=None) -> dict:
    """Time every decoding method at each sampling rate (best of ``repeats``); see the module docstring.

    ``lengths_s`` adds QuickVideo's Figure 3: sequential against parallel decoding of the video's
    first N seconds, at the first sampling rate, for each N.
    """
    info = probe(path)
    cores = os.cpu_count() or 1
    worker_counts = sorted(set(worker_counts or (1, *range(2, (workers or cores) + 1))))
    report = {"repeats": repeats, "video": str(path), "codec": info.codec, "size": f"{info.width}x{info.height}",
              "duration_s": info.duration_s, "frames": info.frame_count, "cpu_count": cores, "runs": [],
              "unavailable": unavailable_decoders()}
    for fps in fps_values:
        indices = sample_frames(info, SamplingConfig(fps=fps))
        reference, base = _timed(lambda: decode_frames(path, indices, DecodeConfig(threads="NONE"), info), repeats)
        methods = {"sequential, 1 thread": {"seconds": base, "identical": True}}
        threaded, seconds = _timed(lambda: decode_frames(path, indices, DecodeConfig(threads="AUTO"), info), repeats)
        methods["PyAV, FFmpeg threads"] = {"seconds": seconds, "identical": torch.equal(threaded.data, reference.data)}
        del threaded
        for count in worker_counts:
            methods[f"vidsight parallel, {count} workers"] = _parallel_entry(
                lambda: decode_parallel(path, indices, info=info, workers=count), reference, repeats, workers=count)
        most = worker_counts[-1]
        methods[f"vidsight parallel, {most} processes"] = _parallel_entry(
            lambda: decode_parallel(path, indices, info=info, workers=most, backend="processes"), reference, repeats,
            processes=most)
        methods[f"vidsight parallel, {most} workers, trimmed GOPs"] = _parallel_entry(
            lambda: decode_parallel(path, indices, DecodeConfig(trim_gops=True), info, workers=most), reference,
            repeats)
        for name, decode in _other_libraries(Path(path), indices).items():
            frames, seconds = _timed(decode, repeats)
            diff = _max_abs_difference(frames, reference.data)
            methods[name] = {"seconds": seconds, "identical": diff == 0, "max_abs_difference": diff,
                             "shape": list(frames.shape)}
            del frames
        for name, entry in methods.items():   # one line each, kept when a run is stopped part way
            print(f"{fps:g} fps, {name}: {entry['seconds']:.2f} s", file=sys.stderr, flush=True)
        for entry in methods.values():
            entry["speedup"] = base / entry["seconds"]
            if "workers" in entry or "processes" in entry:
                entry["parallel_efficiency"] = entry["speedup"] / entry.get("workers", entry.get("processes"))
        report["runs"].append({"sample_fps": fps, "sampled_frames": len(indices), "methods": methods})
    report["lengths"] = [_length_run(path, info, fps_values[0], length, workers or cores, repeats)
                         for length in lengths_s]
    return report


def _parallel_entry(decode: Callable[[], FrameBatch], reference: FrameBatch, repeats: int, **extra) -> dict:
    """Time one of vidsight's parallel decodes and check its frames against ``reference``."""
    batch, seconds = _timed(decode, repeats)
    return {"seconds": seconds, **extra, "strategy": batch.strategy,
            "identical": torch.equal(batch.data, reference.data) and torch.equal(batch.indices, reference.indices)}


def _length_run(path, info, fps: float, length_s: float, workers: int, repeats: int) -> dict:
    indices = sample_frames(info, SamplingConfig(fps=fps))
    indices = indices[info.pts_s[indices] < info.start_time_s + length_s]
    reference, base = _timed(lambda: decode_frames(path, indices, DecodeConfig(threads="NONE"), info), repeats)
    batch, seconds = _timed(lambda: decode_parallel(path, indices, info=info, workers=workers), repeats)
    return {"length_s": length_s, "sampled_frames": len(indices), "sequential_s": base, "parallel_s": seconds,
            "workers": workers, "speedup": base / seconds, "identical": torch.equal(batch.data, reference.data)}


def plot_decode_report(report: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    lengths = report.get("lengths") or []
    fig, axes = plt.subplots(1, 3 if lengths else 2, figsize=(19 if lengths else 13, 4.5))
    bars, lines = axes[0], axes[1]
    names = list(runs[0]["methods"])
    width = 0.8 / len(runs)
    for k, run in enumerate(runs):
        bars.barh(np.arange(len(names)) + k * width, [run["methods"][n]["seconds"] for n in names], height=width,
                  label=f"{run['sample_fps']:g} fps ({run['sampled_frames']} frames)")
    bars.set_yticks(np.arange(len(names)) + width * (len(runs) - 1) / 2, names)
    bars.set(xlabel="seconds", title=f"decoding {report['size']}, {report['duration_s'] / 60:.0f} min")
    bars.legend()
    for run in runs:
        parallel = [m for m in run["methods"].values() if "workers" in m]
        lines.plot([m["workers"] for m in parallel], [m["speedup"] for m in parallel], marker="o",
                   label=f"{run['sample_fps']:g} fps")
    top = max(m["workers"] for m in runs[0]["methods"].values() if "workers" in m)
    lines.plot([1, top], [1, top], color="grey", linestyle="--", label="linear")
    lines.set(xlabel="workers", ylabel="speed-up over 1-thread sequential", title="interval-parallel scaling")
    lines.legend()
    if lengths:
        minutes = [r["length_s"] / 60 for r in lengths]
        axes[2].plot(minutes, [r["sequential_s"] for r in lengths], marker="o", label="sequential, 1 thread")
        axes[2].plot(minutes, [r["parallel_s"] for r in lengths], marker="o",
                     label=f"vidsight parallel, {lengths[0]['workers']} workers")
        axes[2].set(xlabel="video length (min)", ylabel="seconds",
                    title=f"decoding vs length, {runs[0]['sample_fps']:g} fps")
        axes[2].legend()
    return save_figure(fig, path)


def format_decode_report(report: dict) -> str:
    lines = [f"{report['video']}: {report['size']} {report['codec']}, {report['duration_s']:.0f} s, "
             f"{report['frames']} frames, {report['cpu_count']} CPUs"]
    for run in report["runs"]:
        lines.append(f"\nsampling {run['sample_fps']:g} fps ({run['sampled_frames']} frames)")
        for name, m in run["methods"].items():
            extra = f", efficiency {m['parallel_efficiency']:.0%}" if "parallel_efficiency" in m else ""
            lines.append(f"  {name:<30} {m['seconds']:8.2f} s  {m['speedup']:5.2f}x{extra}"
                         f"  {'identical' if m['identical'] else 'differs'}")
    for r in report.get("lengths") or []:
        lines.append(f"first {r['length_s'] / 60:g} min ({r['sampled_frames']} frames): "
                     f"sequential {r['sequential_s']:.2f} s, parallel {r['parallel_s']:.2f} s ({r['speedup']:.2f}x), "
                     f"{'identical' if r['identical'] else 'differs'}")
    return "\n".join(lines)


def write_decode_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    return write_report(report, out, "decode", plot_decode_report)

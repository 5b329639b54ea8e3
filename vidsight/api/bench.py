"""`vidsight bench ...`: the benchmarks' command lines and how each is run."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

from vidsight.api.bench_live import add_bench_live_parser, run_bench_live
from vidsight.api.bench_serve import add_bench_serve_parser, run_bench_serve
from vidsight.api.lmms.cli import add_lmms_task_parser, run_lmms_task
from vidsight.api.options import (_float, add_motion_source_option, add_policy_options, add_prefill_options,
                                  add_tier_options, policy_settings)
from vidsight.api.settings import prefill_config, tier_config
from vidsight.bench.fuzz import COMMANDS as FUZZ_COMMANDS
from vidsight.errors import ConfigError


def add_split_option(parser: argparse.ArgumentParser, what: str) -> None:
    from vidsight.tasks.splits import SPLITS

    parser.add_argument("--suite-split", default="validation", choices=SPLITS,
                        help=f"{what}: validation (default; where vidsight's models, thresholds and defaults were "
                             "chosen) or test (fresh seeds, for reporting)")


def add_bench_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.models.paths import TASK_MODEL

    common = parents[0]
    bench = commands.add_parser("bench", parents=parents, help="benchmarks")
    bench.set_defaults(run=run_bench)
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    accuracy = bench_commands.add_parser("accuracy", parents=[common], help="accuracy on a held-out generated suite")
    accuracy.add_argument("--model", default=str(TASK_MODEL), help=f"checkpoint (default: {TASK_MODEL})")
    accuracy.add_argument("--suite", default="default", help="suite name: default or smoke")
    accuracy.add_argument("--root", default="out/suites", help="where suites are generated (default: out/suites)")
    accuracy.add_argument("--json", action="store_true", help="print the JSON report")
    accuracy.add_argument("--report", default=None, help="also write the JSON report to this file")
    add_split_option(accuracy, "which seeds the suite is generated from")
    add_prefill_options(accuracy)

    decode = bench_commands.add_parser("decode", parents=[common],
                                       help="sequential vs threaded vs interval-parallel decoding, in one run")
    decode.add_argument("video", nargs="?", default=None, help="video file (default: a generated 10-min 1280x720 one)")
    decode.add_argument("--video-s", type=_float, default=None,
                        help="length of the generated video when no VIDEO is given (default: 600)")
    decode.add_argument("--video-fps", type=_float, default=None,
                        help="frame rate of the generated video when no VIDEO is given (default: 24)")
    decode.add_argument("--gop", type=int, default=None,
                        help="keyframe interval of the generated video when no VIDEO is given (default: 16)")
    decode.add_argument("--fps", type=_float, nargs="+", default=[1.0, 2.0], help="sampling rates (default: 1 2)")
    decode.add_argument("--workers", type=int, default=None, help="most parallel workers to try (default: CPU count)")
    decode.add_argument("--worker-counts", type=int, nargs="+", default=None,
                        help="time parallel decoding at exactly these worker counts (default: 1 to --workers)")
    decode.add_argument("--repeats", type=int, default=2, help="best of this many runs per method (default: 2)")
    decode.add_argument("--lengths", type=_float, nargs="*", default=[],
                        help="also time the first N seconds of the video for each N (decoding vs length)")
    decode.add_argument("--out", default="out/bench", help="JSON and PNG go here (default: out/bench)")
    decode.add_argument("--json", action="store_true", help="print the JSON report")

    bench_ask = bench_commands.add_parser("ask", parents=[common],
                                          help="full-compute ask vs parallel decoding + group prefill + pruning + overlap")
    bench_ask.add_argument("video", nargs="?", default=None, help="video file (default: a generated 5-min 1280x720 one)")
    bench_ask.add_argument("--gop", type=int, default=None,
                           help="keyframe interval of the generated video when no VIDEO is given (default: 250, x264's)")
    bench_ask.add_argument("--shape", default="small", help="random-weight model shape: small, qwen2.5-vl-3b, "
                           "qwen2.5-vl-7b, llava-onevision-0.5b, llava-onevision-7b, internvl3-1b, internvl3-8b; tiny "
                           "(the device check's dry run) (default: small)")
    bench_ask.add_argument("--video-s", type=_float, default=None,
                           help="length of the generated video when no VIDEO is given (default: 300)")
    bench_ask.add_argument("--video-fps", type=_float, default=None,
                           help="frame rate of the generated video when no VIDEO is given (default: 24)")
    bench_ask.add_argument("--headline", action="store_true",
                           help="only full compute, QuickVideo's pipeline at the first --rho, and it with motion "
                                "pruning (the device check's runs)")
    bench_ask.add_argument("--rho", type=_float, nargs="+", default=[0.5, 0.2], help="pruning ratios (default: 0.5 0.2)")
    bench_ask.add_argument("--group-frames", type=int, default=32, help="frames per prefill group (default: 32)")
    bench_ask.add_argument("--workers", type=int, default=None, help="parallel decoders (default: CPU count)")
    bench_ask.add_argument("--fps", type=_float, default=1.0, help="sampling rate (default: 1)")
    bench_ask.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                           help="weights and activations (default: bfloat16, the published checkpoints' dtype)")
    bench_ask.add_argument("--set", action="store_true",
                           help="instead: every setting (full compute, the lossless pipeline, KV pruning, motion "
                                "pruning, both) over a generated video set (static noisy camera at GOP 250 and 48, "
                                "panning camera), with needle accuracy per setting from the task model")
    bench_ask.add_argument("--codecs", nargs="+", default=["h264"], metavar="CODEC",
                           help="with --set: encode each video with each codec (h264, hevc, av1, vp9 ...; motion "
                                "pruning reads H.264's vectors and the others' pixels; default: h264)")
    bench_ask.add_argument("--needle-clips", type=int, default=50,
                           help="with --set: held-out needle clips scored per setting (default: 50; 0 skips)")
    bench_ask.add_argument("--out", default="out/bench", help="JSON and PNG go here (default: out/bench)")
    bench_ask.add_argument("--json", action="store_true", help="print the JSON report")

    bench_watch = bench_commands.add_parser("watch", parents=[common],
                                            help="Full-Comp vs motion pruning vs KV refresh vs both on labelled videos")
    bench_watch.add_argument("--model", default=str(TASK_MODEL), help=f"checkpoint (default: {TASK_MODEL})")
    bench_watch.add_argument("--shape", default=None, help="time a random-weight model shape instead of --model")
    bench_watch.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                             help="weights and activations (default: float32; bfloat16 fits the 7-8 B shapes in 24 GiB)")
    bench_watch.add_argument("--flop-videos", type=int, default=3,
                             help="videos whose windows are run again to count FLOPs (default: 3; 0 skips the count, "
                                  "for shapes too slow to run twice)")
    bench_watch.add_argument("--suite", default="anomaly", choices=("anomaly", "hard"),
                             help="anomaly: the task model's anomaly videos (default); hard: families where motion "
                                  "vectors miss events (recolour, appear, creep, brief, pan, lighting, noise)")
    bench_watch.add_argument("--videos", type=int, default=20,
                             help="generated anomaly videos, or videos per family with --suite hard (default: 20)")
    bench_watch.add_argument("--gop", type=int, default=32, help="GOP length the videos are written with (default: 32)")
    bench_watch.add_argument("--tau", type=_float, default=0.25, help="motion threshold in pixels (default: 0.25)")
    add_motion_source_option(bench_watch)
    bench_watch.add_argument("--window-s", type=_float, default=10.0,
                             help="window length in seconds, stride 20 %% at 2 fps (default: 10, the suite's; "
                                  "CodecSight's is 40)")
    bench_watch.add_argument("--video-s", type=_float, default=40.0,
                             help="with --suite hard: length of each generated video in seconds (default: 40)")
    bench_watch.add_argument("--sweeps", nargs="*", default=None, metavar="AXIS",
                             help="also sweep pruning+refresh along these axes, one setting at a time: tau, alpha, rule, "
                                  "refresh, align, reuse_in_place, stride, gop (no axis named: all of them)")
    bench_watch.add_argument("--static-scenes", nargs="*", default=None, metavar="CODEC",
                             help="also measure the motion rules on noisy static-camera scenes (kept share, recall) "
                                  "encoded with each CODEC (h264 by its vectors; hevc, av1, vp9 ... by pixels; "
                                  "hevc-10bit, hevc-pq, hevc-hlg: x265's 10-bit SDR and HDR; none named: h264), and "
                                  "judging's cost per codec at 1280x720")
    bench_watch.add_argument("--camera-fps", type=_float, default=None, metavar="FPS",
                             help="with --static-scenes: the scenes' frame rate (default: 15, the rate the pixel "
                                  "path's thresholds were chosen at)")
    bench_watch.add_argument("--cost-video", default=None, metavar="FILE",
                             help="with --static-scenes: time judging on this 1280x720 video's frames re-encoded by "
                                  "each codec (real footage; default: a generated noisy static camera)")
    add_split_option(bench_watch, "which seeds the generated suite comes from")
    bench_watch.add_argument("--codec", default="h264",
                             help="encode the generated suite with this codec (h264, hevc, av1, vp9, mpeg4 ...; "
                                  "default: h264)")
    bench_watch.add_argument("--folder", default=None, help="a folder of videos to use instead (UCF-Crime style)")
    bench_watch.add_argument("--labels", default=None, help="with --folder: CSV with video,label columns")
    bench_watch.add_argument("--query", default=None, help="with --folder: the standing query")
    bench_watch.add_argument("--root", default="out/suites", help="where generated videos go (default: out/suites)")
    bench_watch.add_argument("--out", default="out/bench", help="JSON and PNG go here (default: out/bench)")
    bench_watch.add_argument("--json", action="store_true", help="print the JSON report")

    bench_chat = bench_commands.add_parser("chat", parents=[common],
                                           help="per-patch prefill and question latency against history, per KV policy")
    bench_chat.add_argument("--shape", default="small", help="random-weight model shape (default: small)")
    bench_chat.add_argument("--histories", type=int, nargs="+", default=[1000, 4000, 16000, 40000],
                            help="cached tokens to time at (default: 1000 4000 16000 40000)")
    bench_chat.add_argument("--policies", nargs="+", default=["full", "recent", "rekv"],
                            help="policies to compare; a variant fixes settings: mosaic:clustering=visual,split=eager")
    bench_chat.add_argument("--timed-patches", type=int, default=4, help="temporal patches timed per point (default: 4)")
    bench_chat.add_argument("--history-batch", type=int, default=1, metavar="K",
                            help="temporal patches prefilled together while the history is built (default: 1, as "
                                 "a stream arrives; the timed patches go one by one)")
    add_policy_options(bench_chat)
    add_tier_options(bench_chat)
    bench_chat.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    add_split_option(bench_chat, "with --accuracy, which seeds the chat suite's streams come from")
    bench_chat.add_argument("--accuracy", action="store_true",
                            help="instead of timing, answer the chat suite (questions at several times) with --model")
    bench_chat.add_argument("--model", default=None,
                            help=f"with --accuracy, the model answering (default: {TASK_MODEL}); without it, a "
                                 "checkpoint to time instead of --shape")
    bench_chat.add_argument("--streams", type=int, default=20, help="with --accuracy: streams (default: 20)")
    bench_chat.add_argument("--choices", action="store_true",
                            help="with --accuracy: also rank each question's possible answers by likelihood "
                                 "(ChatSession.score) and score the likeliest")
    bench_chat.add_argument("--stream-frames", type=int, default=512,
                            help="with --accuracy: sampled frames per stream (default: 512)")
    bench_chat.add_argument("--out", default="out/bench", help="JSON and PNG go here (default: out/bench)")
    bench_chat.add_argument("--json", action="store_true", help="print the JSON report")

    containers = bench_commands.add_parser(
        "containers", parents=[common],
        help="copy a video into MP4, MKV, MPEG-TS and MPEG-PS and check every decoding path against sequential")
    containers.add_argument("video", help="a video file (real footage is the point)")
    containers.add_argument("--fps", type=_float, default=2.0, help="sampling rate (default: 2)")
    containers.add_argument("--workers", type=int, default=2, help="parallel decoders (default: 2)")
    containers.add_argument("--out", default="out/bench/containers", help="the copies go here")
    containers.add_argument("--json", action="store_true", help="print JSON")

    add_bench_serve_parser(bench_commands, common)
    add_bench_live_parser(bench_commands, common)
    add_lmms_task_parser(bench_commands, common)

    device = bench_commands.add_parser(
        "device", parents=[common],
        help="the GPU check: the exactness tests on CUDA, then ask, decode, watch, chat and serve on the 7B shape")
    device.add_argument("--dry-run", action="store_true",
                        help="the same stages on the CPU with the small shape and short videos (about a minute)")
    device.add_argument("--only", nargs="+", default=(), metavar="STAGE",
                        help="run only these stages: tests-float32, tests-bfloat16, ask, decode, watch, chat, serve")
    device.add_argument("--part", type=int, choices=(1, 2), default=None,
                        help="on a GPU, one of the two calls of at most 8 minutes: 1 (tests, ask) or 2 (decode, "
                             "watch, chat, serve)")
    device.add_argument("--limit", nargs="+", default=(), metavar="STAGE=SECONDS",
                        help="change stages' time limits (e.g. ask=240 when the other stages are left out)")
    device.add_argument("--out", default="out/device-check",
                        help="device-check.json, device-check.md and each bench's files go here "
                             "(default: out/device-check)")
    device.add_argument("--json", action="store_true", help="print the JSON report")

    fuzz = bench_commands.add_parser("fuzz", parents=[common],
                                     help="damaged and hostile inputs through probe, ask and watch (from the file and "
                                          "from a pipe): exit 0 or 2, "
                                          "nothing else")
    fuzz.add_argument("--cases", type=int, default=1000, help="inputs to make (default: 1000)")
    fuzz.add_argument("--seed", type=int, default=0, help="seeds the damage (default: 0)")
    fuzz.add_argument("--model", default=str(TASK_MODEL), help=f"checkpoint ask and watch load (default: {TASK_MODEL})")
    fuzz.add_argument("--commands", nargs="+", default=list(FUZZ_COMMANDS), choices=FUZZ_COMMANDS,
                      help="what each input goes through (default: all; watch-stdin: watch - with the input "
                           "piped in)")
    fuzz.add_argument("--workers", type=int, default=None, help="commands at once (default: CPU count)")
    fuzz.add_argument("--time-limit", type=_float, default=60.0, help="seconds before a run counts as a hang (default: 60)")
    fuzz.add_argument("--out", default="out/bench", help="the JSON report goes here (default: out/bench)")
    fuzz.add_argument("--json", action="store_true", help="print the JSON report")



def run_bench(args) -> int:
    benches = {"decode": _run_bench_decode, "ask": _run_bench_ask, "watch": _run_bench_watch, "fuzz": _run_bench_fuzz,
               "containers": _run_bench_containers, "chat": _run_bench_chat, "serve": run_bench_serve,
               "device": _run_bench_device, "lmms-task": run_lmms_task, "live": run_bench_live}
    if args.bench_command in benches:
        return benches[args.bench_command](args)
    from vidsight.bench.accuracy import format_report, run_accuracy

    report = run_accuracy(args.model, args.suite, args.root, prefill_config(vars(args)), split=args.suite_split,
                          progress=sys.stderr.isatty() and not args.json)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1))
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def _run_bench_decode(args) -> int:
    from vidsight.bench.decode import (BENCH_VIDEO, bench_video, format_decode_report, run_decode_bench,
                                       write_decode_report)

    changes = {k: v for k, v in dict(duration_s=args.video_s, fps=args.video_fps, gop=args.gop).items() if v is not None}
    video = args.video or bench_video(args.out, dataclasses.replace(BENCH_VIDEO, **changes))
    if args.worker_counts and min(args.worker_counts) < 1:
        raise ConfigError("--worker-counts must be positive")
    report = run_decode_bench(video, args.fps, args.workers, args.repeats, args.lengths, args.worker_counts)
    json_path, png_path = write_decode_report(report, args.out)
    print(json.dumps(report) if args.json else f"{format_decode_report(report)}\n\n{json_path}\n{png_path}")
    return 0


def _run_bench_ask(args) -> int:
    from vidsight.bench.ask import ask_video, format_ask_report, run_ask_bench, write_ask_report

    if args.set:
        return _run_bench_ask_set(args)
    video = args.video or ask_video(args.out, args.gop, args.video_s, args.video_fps)
    report = run_ask_bench(video, args.shape, args.rho, args.group_frames, args.workers, args.fps,
                           dtype=args.dtype, progress=sys.stderr.isatty() and not args.json, headline=args.headline)
    json_path, png_path = write_ask_report(report, args.out)
    print(json.dumps(report) if args.json else f"{format_ask_report(report)}\n\n{json_path}\n{png_path}")
    return 0


def _run_bench_ask_set(args) -> int:
    from vidsight.bench.ask_set import format_ask_set, run_ask_set, write_ask_set

    if args.video is not None:
        raise ConfigError("--set generates its own videos; give no VIDEO with it")
    report = run_ask_set(args.out, args.shape, args.fps, args.needle_clips, args.dtype,
                         progress=sys.stderr.isatty() and not args.json, codecs=tuple(args.codecs))
    json_path, png_path = write_ask_set(report, args.out)
    print(json.dumps(report) if args.json else f"{format_ask_set(report)}\n\n{json_path}\n{png_path}")
    return 0


def _run_bench_watch(args) -> int:
    from vidsight.bench.motion import TEN_BIT_HEVC
    from vidsight.bench.suite import ANOMALY_VIDEO_S
    from vidsight.bench.watch import (SUITE_WINDOWS, SWEEP_AXES, anomaly_videos, format_watch_report, hard_videos,
                                      labelled_folder, run_watch_bench, write_watch_report)
    from vidsight.ingest.writer import ENCODERS
    from vidsight.models import load_model
    from vidsight.models.shapes import build_shape

    if unknown := [codec for codec in args.static_scenes or () if codec not in ENCODERS and codec not in TEN_BIT_HEVC]:
        raise ConfigError(f"--static-scenes: unknown codec {', '.join(unknown)} "
                          f"(known: {', '.join([*ENCODERS, *TEN_BIT_HEVC])})")

    axes = () if args.sweeps is None else tuple(args.sweeps) or SWEEP_AXES
    unknown = set(axes) - set(SWEEP_AXES)
    if unknown:
        raise ConfigError(f"unknown sweep axis {', '.join(sorted(unknown))}; choose from {', '.join(SWEEP_AXES)}")
    if args.camera_fps is not None and not 1 <= args.camera_fps <= 120:
        raise ConfigError(f"--camera-fps must be in [1, 120], got {args.camera_fps:g}")
    rate = {} if args.camera_fps is None else {"camera_fps": args.camera_fps}
    if args.folder:
        if not args.labels or not args.query:
            raise ConfigError("--folder needs --labels and --query")
        videos = labelled_folder(args.folder, args.labels, args.query)
    else:
        if args.videos < 1 or args.gop < 1:
            raise ConfigError("--videos and --gop must be positive")
        if args.suite == "hard":
            suite = functools.partial(hard_videos, duration_s=args.video_s, codec=args.codec, split=args.suite_split)
        elif args.video_s != ANOMALY_VIDEO_S:
            raise ConfigError(f"--video-s: the anomaly suite's videos are {ANOMALY_VIDEO_S:g} s; "
                              "generated lengths need --suite hard")
        else:
            suite = functools.partial(anomaly_videos, codec=args.codec, split=args.suite_split)
        if args.window_s > args.video_s:
            raise ConfigError(f"--window-s {args.window_s:g} is longer than the {args.video_s:g}-s videos")
        videos = suite(args.root, args.videos, args.gop)
    windows = dataclasses.replace(SUITE_WINDOWS, window_s=args.window_s)
    if args.cost_video is not None:
        from vidsight.ingest.container import check_readable

        check_readable(args.cost_video)
    if args.flop_videos < 0:
        raise ConfigError(f"--flop-videos must be 0 or more, got {args.flop_videos}")
    import torch

    dtype = getattr(torch, args.dtype)
    adapter = build_shape(args.shape, dtype=dtype) if args.shape else load_model(args.model, dtype=dtype)
    static_scenes = () if args.static_scenes is None else tuple(args.static_scenes) or ("h264",)
    from vidsight.ingest.dynamic import MotionPruneConfig

    prune = MotionPruneConfig(tau=args.tau, source=args.motion_source)
    report = run_watch_bench(adapter, videos, prune, axes, args.root, static_scenes,
                             progress=sys.stderr.isatty() and not args.json,
                             videos_at=None if args.folder else lambda gop: suite(args.root, args.videos, gop),
                             windows=windows, flop_videos=args.flop_videos, cost_video=args.cost_video, **rate)
    report["codec"], report["split"] = (None, None) if args.folder else (args.codec, args.suite_split)
    json_path, png_path = write_watch_report(report, args.out)
    print(json.dumps(report, default=str) if args.json else f"{format_watch_report(report)}\n\n{json_path}\n{png_path}")
    return 0


def _run_bench_chat(args) -> int:
    from vidsight.bench.chat import format_chat_report, run_chat_bench, write_chat_report

    settings = policy_settings(args)
    if args.accuracy:
        from vidsight.bench.chat_accuracy import format_chat_accuracy, run_chat_accuracy
        from vidsight.models import load_model
        from vidsight.models.paths import TASK_MODEL

        report = run_chat_accuracy(load_model(args.model or TASK_MODEL, device="cpu"), args.streams, args.stream_frames,
                                   tuple(args.policies), settings, progress=not args.json, tiers=tier_config(vars(args)),
                                   split=args.suite_split, choices=args.choices)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "chat-accuracy.json").write_text(json.dumps(report, indent=1))
        print(json.dumps(report) if args.json else f"{format_chat_accuracy(report)}\n\n{out / 'chat-accuracy.json'}")
        return 0
    report = run_chat_bench(args.shape, tuple(args.histories), tuple(args.policies), args.timed_patches, args.dtype,
                            args.out, progress=not args.json, settings=settings, tiers=tier_config(vars(args)),
                            model=args.model, history_batch=args.history_batch,
                            on_point=lambda so_far: write_chat_report(so_far, args.out))   # kept if cut off
    json_path, png_path = write_chat_report(report, args.out)
    print(json.dumps(report) if args.json else f"{format_chat_report(report)}\n\n{json_path}\n{png_path}")
    return 0


def _run_bench_device(args) -> int:
    from vidsight.bench.device import format_device_report, run_device_check, stage_names
    from vidsight.bench.device_stages import PARTS

    if args.part is not None and args.only:
        raise ConfigError("give --part or --only, not both")
    names = stage_names(args.dry_run)
    only = PARTS[args.part - 1] if args.part else tuple(args.only)
    unknown = set(only) - set(names)
    if unknown:
        raise ConfigError(f"--only: unknown stage {', '.join(sorted(unknown))}; choose from {', '.join(names)}")
    limits = {}
    for item in args.limit:
        stage, _, seconds = item.partition("=")
        if stage not in names or not seconds.replace(".", "", 1).isdigit() or float(seconds) <= 0:
            raise ConfigError(f"--limit {item}: give STAGE=SECONDS with a stage of {', '.join(names)}")
        limits[stage] = float(seconds)
    quiet = args.json
    report = run_device_check(args.out, args.dry_run, only, limits,
                              progress=(lambda _: None) if quiet else (lambda line: print(line, file=sys.stderr)))
    print(json.dumps(report, default=str) if args.json else format_device_report(report))
    return 0 if all(stage["status"] == "ok" for stage in report["stages"].values()) else 1


def _run_bench_containers(args) -> int:
    from vidsight.bench.containers import all_equal, format_container_report, run_container_check

    if args.fps <= 0 or args.workers < 1:
        raise ConfigError("--fps and --workers must be positive")
    rows = run_container_check(args.video, args.out, args.fps, args.workers)
    print(json.dumps(rows) if args.json else format_container_report(rows))
    return 0 if all_equal(rows) else 1


def _run_bench_fuzz(args) -> int:
    from vidsight.bench.fuzz import format_fuzz_report, run_fuzz, summarise

    if args.cases < 1 or args.time_limit <= 0 or (args.workers is not None and args.workers < 1):
        raise ConfigError("--cases, --workers and --time-limit must be positive")
    outcomes = run_fuzz(args.cases, args.seed, args.model, workers=args.workers or os.cpu_count() or 1,
                        commands=tuple(dict.fromkeys(args.commands)), time_limit_s=args.time_limit,
                        progress=sys.stderr.isatty() and not args.json)
    report = {"seed": args.seed, **summarise(outcomes)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"fuzz-seed{args.seed}.json"
    json_path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report) if args.json else f"{format_fuzz_report(report)}\n\n{json_path}")
    return 0 if not report["failures"] else 1

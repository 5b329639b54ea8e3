"""`vidsight bench serve`: load against a server, or against one started here on loopback."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

from vidsight.api.extras import require_extra
from vidsight.api.options import _float


def add_bench_serve_parser(bench_commands, common) -> None:
    from vidsight.api.serve.config import DEFAULT_PREFIX_CACHE_BYTES
    from vidsight.models.paths import TASK_MODEL

    serve = bench_commands.add_parser("serve", parents=[common],
                                      help="chat completions at several concurrencies, then beside real-time watches")
    serve.add_argument("--url", default=None,
                       help="a running server (default: start one on 127.0.0.1 with --model and generated videos)")
    serve.add_argument("--api-key", default=None, help="the server's API key")
    serve.add_argument("--model", default=str(TASK_MODEL), help=f"without --url: the model (default: {TASK_MODEL})")
    serve.add_argument("--device", default=None, help="without --url: cpu, cuda or cuda:N")
    serve.add_argument("--video", default=None, help="the video the completions ask about, as the server names it "
                                                     "(default: a generated anomaly video)")
    serve.add_argument("--question", default=None, help="default: the anomaly suite's standing query")
    serve.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8],
                       help="concurrent completions per level (default: 1 2 4 8)")
    serve.add_argument("--requests", type=int, default=16, help="completions per level (default: 16)")
    serve.add_argument("--max-tokens", type=int, default=16, help="answer length limit (default: 16)")
    serve.add_argument("--watches", type=int, default=4, help="concurrent real-time watches (default: 4)")
    serve.add_argument("--watch-video", default=None, help="the watched video (default: the completions' video)")
    serve.add_argument("--window", type=_float, default=8.0, help="watch window in seconds (default: 8)")
    serve.add_argument("--stride", type=_float, default=0.25, help="watch stride as a share (default: 0.25)")
    serve.add_argument("--fps", type=_float, default=2.0, help="watch sampling rate (default: 2)")
    serve.add_argument("--unbatched", action="store_true",
                       help="without --url: also load a second server that runs each completion whole in its turn "
                            "(--no-answer-batching, with --plain-weights: one answer at a time decodes faster so), "
                            "the same levels, for the comparison")
    serve.add_argument("--plain-weights", action="store_true",
                       help="without --url: the server's --plain-weights (row-major linear weights on a CPU)")
    serve.add_argument("--prefix-cache-bytes", type=int, default=DEFAULT_PREFIX_CACHE_BYTES, metavar="N",
                       help="the in-process server's video prefix cache (0: off, so every completion prefills "
                            f"its video; default: the server's {DEFAULT_PREFIX_CACHE_BYTES})")
    serve.add_argument("--max-prefill-tokens", type=int, default=None, metavar="N",
                       help="without --url: the server's --max-prefill-tokens (default: the server's for the device)")
    serve.add_argument("--reuse-questions", type=int, default=0, metavar="N",
                       help="then ask N different questions about each --reuse-video, one at a time: time to "
                            "first token of a video's first question against the later ones (default: 0, not run)")
    serve.add_argument("--reuse-video", nargs="+", default=None, metavar="VIDEO",
                       help="the videos --reuse-questions asks about, as the server names them; a server started "
                            "here serves --video's folder (default: --video)")
    serve.add_argument("--ray", action="store_true",
                       help="without --url: deploy on Ray Serve once per --replicas count and load each")
    serve.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="with --ray: replica counts (default: 1 2)")
    serve.add_argument("--replica-cpus", type=_float, default=1.0, help="with --ray: CPUs per replica (default: 1)")
    serve.add_argument("--ray-address", default=None, help="with --ray: the cluster to use (default: start one here)")
    serve.add_argument("--soak", type=_float, default=None, metavar="SECONDS",
                       help="instead: a server process under mixed load (completions, real-time watches whose "
                            "event streams drop, sessions, malformed requests) this long; answers by status, and "
                            "its RSS, descriptors, threads and temporary entries after warm-up against after the load")
    serve.add_argument("--out", default="out/bench", help="JSON and PNG go here (default: out/bench)")
    serve.add_argument("--json", action="store_true", help="print the JSON report")


def run_bench_serve(args) -> int:
    from vidsight.bench.serve import format_serve_report, write_serve_report
    from vidsight.errors import ConfigError

    if args.ray and args.url:
        raise ConfigError("--ray deploys its own server: leave out --url")
    require_extra("ray" if args.ray else "serve", "vidsight bench serve" + (" --ray" if args.ray else ""))
    if args.soak is not None:
        return _run_soak(args)
    if args.ray:
        return _run_on_ray(args)
    with contextlib.ExitStack() as stack:
        url, video = args.url, args.video
        if url is None:
            url, video = stack.enter_context(_local_server(args))
        if video is None:
            raise ConfigError("with --url, name the video the server should read (--video)")
        # Questions about videos not asked about yet: before the load, which asks about --video.
        reuse = _reuse(args, url, video) if args.reuse_questions else None
        report = _load(args, url, video)
        if reuse is not None:
            report["prefix_reuse"] = reuse
        if args.unbatched:
            report["unbatched"] = _unbatched_levels(args)
    report["settings"]["server"] = args.url or f"in-process, model {args.model}"
    if args.url is None:
        report["settings"]["weights"] = "plain" if args.plain_weights else "packed (large weights, on a CPU, in float32)"
    json_path, png_path = write_serve_report(report, args.out)
    print(json.dumps(report) if args.json else f"{format_serve_report(report)}\n\n{json_path}\n{png_path}")
    return 0


def _reuse(args, url: str, video: str) -> dict:
    from vidsight.bench.serve import REUSE_QUESTIONS, ServeClient, prefix_reuse
    from vidsight.errors import ConfigError

    if not 2 <= args.reuse_questions <= len(REUSE_QUESTIONS):
        raise ConfigError(f"--reuse-questions takes 2 to {len(REUSE_QUESTIONS)}, got {args.reuse_questions}")
    videos = [Path(v).name if args.url is None else v for v in args.reuse_video] if args.reuse_video else [video]
    return prefix_reuse(ServeClient(url, args.api_key), videos, list(REUSE_QUESTIONS[:args.reuse_questions]),
                        args.max_tokens, progress=(lambda _: None) if args.json else (
                            lambda line: print(line, file=sys.stderr)))


def _unbatched_levels(args) -> list[dict]:
    """The completion levels against a server that runs each request whole in its turn."""
    from vidsight.bench.serve import ServeClient, completion_levels
    from vidsight.errors import ConfigError
    from vidsight.tasks.families import ANOMALY_QUERY

    if args.url:
        raise ConfigError("--unbatched starts its own second server: leave out --url")
    with _local_server(args, batch_answers=False) as (url, video):
        return completion_levels(ServeClient(url, args.api_key), video, args.question or ANOMALY_QUERY,
                                 args.concurrency, args.requests, args.max_tokens,
                                 progress=(lambda _: None) if args.json else (lambda line: print(f"unbatched {line}",
                                                                                             file=sys.stderr)))


def _run_soak(args) -> int:
    from vidsight.api.serve.config import absolute_model
    from vidsight.bench.report import write_report
    from vidsight.bench.soak import format_soak_report, plot_soak_report, run_soak
    from vidsight.bench.watch import anomaly_videos
    from vidsight.errors import ConfigError

    if args.url or args.ray or not args.soak > 0:
        raise ConfigError("--soak takes positive seconds and starts its own server: leave out --url and --ray")
    videos = [Path(v["video"]) for v in anomaly_videos(Path(args.out) / "videos", 3)]
    report = run_soak(args.soak, absolute_model(args.model), videos, args.device,
                      progress=(lambda _: None) if args.json else (lambda line: print(line, file=sys.stderr)))
    json_path, png_path = write_report(report, args.out, "soak", plot_soak_report)
    print(json.dumps(report) if args.json else f"{format_soak_report(report)}\n\n{json_path}\n{png_path}")
    return 0


def _load(args, url: str, video: str) -> dict:
    from vidsight.bench.serve import ServeClient, run_serve_bench
    from vidsight.tasks.families import ANOMALY_QUERY

    watch = {"query": args.question or ANOMALY_QUERY, "window_s": args.window, "stride": args.stride, "fps": args.fps}
    quiet = args.json   # lines, not bars: kept in logs too, so a run stopped part way keeps its levels
    return run_serve_bench(ServeClient(url, args.api_key), video, args.question or ANOMALY_QUERY, args.concurrency,
                           args.requests, args.watches, args.watch_video or video, watch, args.max_tokens,
                           progress=(lambda _: None) if quiet else (lambda line: print(line, file=sys.stderr)))


def _run_on_ray(args) -> int:
    """One deployment per replica count on a Ray instance of this process, the same load on each."""
    import ray
    from ray import serve

    from vidsight.api.serve.config import RayConfig
    from vidsight.api.serve.ray_app import build_app
    from vidsight.api.serve.ray_cli import start_serve_on_a_free_port
    from vidsight.bench.serve_scaling import format_scaling_report, scaling_report, write_scaling_report

    runs = []
    ray.init(address=args.ray_address or "local", include_dashboard=False, log_to_driver=False)
    try:
        port = start_serve_on_a_free_port()
        for replicas in args.replicas:
            with _served_video(args) as (config, video):
                serve.run(build_app(config, RayConfig(replicas=replicas, replica_cpus=args.replica_cpus)),
                          name="vidsight-bench", route_prefix="/")
                runs.append({"replicas": replicas, **_load(args, f"http://127.0.0.1:{port}", video)})
                serve.delete("vidsight-bench")
    finally:
        serve.shutdown()
        ray.shutdown()
    report = scaling_report(runs)
    report["settings"] = {**runs[0]["settings"], "server": f"Ray Serve, model {args.model}",
                          "replica_cpus": args.replica_cpus}
    json_path, png_path = write_scaling_report(report, args.out)
    print(json.dumps(report) if args.json else f"{format_scaling_report(report)}\n\n{json_path}\n{png_path}")
    return 0


@contextlib.contextmanager
def _served_video(args, batch_answers: bool = True):
    """A server's settings over ``--model``, serving a generated anomaly video (or ``--video``'s
    folder), with a database of its own; and the video's name as the server knows it."""
    from vidsight.api.serve import ServeConfig
    from vidsight.api.serve.config import absolute_model
    from vidsight.bench.watch import anomaly_videos

    video = Path(args.video) if args.video else Path(anomaly_videos(Path(args.out) / "videos", 1)[0]["video"])
    model = absolute_model(args.model)
    with tempfile.TemporaryDirectory(prefix="vidsight-bench-serve-") as scratch:
        yield ServeConfig(model=model, device=args.device, allowed_local_media_path=video.resolve().parent,
                          db=Path(scratch) / "serve.db", max_concurrent=max(64, 4 * max(args.concurrency)),
                          batch_answers=batch_answers, prefix_cache_bytes=args.prefix_cache_bytes,
                          max_prefill_tokens=args.max_prefill_tokens,
                          packed_weights=batch_answers and not args.plain_weights), video.name


@contextlib.contextmanager
def _local_server(args, batch_answers: bool = True):
    """A server on loopback in this process (`_served_video`'s settings)."""
    from vidsight.api.serve import create_app
    from vidsight.api.serve.background import serve_in_background

    with _served_video(args, batch_answers) as (config, video), serve_in_background(create_app(config)) as url:
        yield url, video

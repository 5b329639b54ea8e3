"""`vidsight bench serve`: load against a server, or against one started here on loopback."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

from vidsight.api.options import _float


def add_bench_serve_parser(bench_commands, common) -> None:
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
    serve.add_argument("--out", default="out/bench", help="JSON and PNG go here (default: out/bench)")
    serve.add_argument("--json", action="store_true", help="print the JSON report")


def run_bench_serve(args) -> int:
    from vidsight.bench.serve import ServeClient, format_serve_report, run_serve_bench, write_serve_report
    from vidsight.tasks.families import ANOMALY_QUERY

    with contextlib.ExitStack() as stack:
        url, video = args.url, args.video
        if url is None:
            url, video = stack.enter_context(_local_server(args))
        if video is None:
            from vidsight.errors import ConfigError

            raise ConfigError("with --url, name the video the server should read (--video)")
        watch = {"query": args.question or ANOMALY_QUERY, "window_s": args.window, "stride": args.stride,
                 "fps": args.fps}
        quiet = args.json or not sys.stderr.isatty()
        report = run_serve_bench(ServeClient(url, args.api_key), video, args.question or ANOMALY_QUERY,
                                 args.concurrency, args.requests, args.watches, args.watch_video or video, watch,
                                 args.max_tokens, progress=(lambda _: None) if quiet else
                                 (lambda line: print(line, file=sys.stderr)))
    report["settings"]["server"] = args.url or f"in-process, model {args.model}"
    json_path, png_path = write_serve_report(report, args.out)
    print(json.dumps(report) if args.json else f"{format_serve_report(report)}\n\n{json_path}\n{png_path}")
    return 0


@contextlib.contextmanager
def _local_server(args):
    """A server on loopback over ``--model``, serving a generated anomaly video (or ``--video``'s folder)."""
    from vidsight.api.serve import ServeConfig, create_app
    from vidsight.api.serve.background import serve_in_background
    from vidsight.bench.watch import anomaly_videos

    video = Path(args.video) if args.video else Path(anomaly_videos(Path(args.out) / "videos", 1)[0]["video"])
    with tempfile.TemporaryDirectory(prefix="vidsight-bench-serve-") as scratch:
        config = ServeConfig(model=args.model, device=args.device, allowed_local_media_path=video.resolve().parent,
                             db=Path(scratch) / "serve.db", max_concurrent=max(64, 4 * max(args.concurrency)))
        with serve_in_background(create_app(config)) as url:
            yield url, video.name

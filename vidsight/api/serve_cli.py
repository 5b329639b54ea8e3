"""`vidsight serve`: the command line of the HTTP server."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vidsight.api.options import _float


def add_serve_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.api.serve.config import (API_KEY_ENV, DEFAULT_FETCH_TIMEOUT_S, DEFAULT_MAX_CONCURRENT,
                                           DEFAULT_MAX_VIDEO_BYTES, default_db_path)
    from vidsight.engine.config import DEFAULT_MODEL

    serve = commands.add_parser("serve", parents=parents,
                                help="an HTTP server: OpenAI-compatible video chat completions, watches, metrics")
    serve.add_argument("--model", default=DEFAULT_MODEL, help=f"Hugging Face id or checkpoint directory (default: {DEFAULT_MODEL})")
    serve.add_argument("--served-model-name", default=None, help="the model id clients name (default: --model)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument("--api-key", default=None,
                       help=f"required as 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV}, else none)")
    serve.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                       help="local videos (paths, file://) must lie under DIR (default: none are served)")
    serve.add_argument("--db", default=None, help="watches, verdicts and alerts: a SQLite file or a postgresql:// URL "
                                                  f"(default: {default_db_path()})")
    serve.add_argument("--max-video-bytes", type=int, default=DEFAULT_MAX_VIDEO_BYTES,
                       help=f"largest video uploaded or fetched (default: {DEFAULT_MAX_VIDEO_BYTES})")
    serve.add_argument("--fetch-timeout", type=_float, default=DEFAULT_FETCH_TIMEOUT_S, metavar="S",
                       help=f"longest an http(s) video may take to arrive (default: {DEFAULT_FETCH_TIMEOUT_S:g})")
    serve.add_argument("--max-concurrent", type=int, default=DEFAULT_MAX_CONCURRENT,
                       help=f"requests in progress at once; more get 429 (default: {DEFAULT_MAX_CONCURRENT})")
    serve.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")


def serve_config(args):
    from vidsight.api.serve.config import API_KEY_ENV, ServeConfig, default_db_path

    return ServeConfig(model=args.model, device=args.device, api_key=args.api_key or os.environ.get(API_KEY_ENV),
                       allowed_local_media_path=Path(args.allowed_local_media_path) if args.allowed_local_media_path
                       else None, db=args.db or default_db_path(),
                       max_video_bytes=args.max_video_bytes, fetch_timeout_s=args.fetch_timeout,
                       max_concurrent=args.max_concurrent, model_name=args.served_model_name)


def run_serve(args) -> int:
    import uvicorn

    from vidsight.api.serve import create_app

    app = create_app(serve_config(args))
    # In-flight requests get this long to finish on SIGINT/SIGTERM; streams stop at a window boundary.
    uvicorn.run(app, host=args.host, port=args.port, log_level="debug" if args.debug else "warning",
                timeout_graceful_shutdown=30)
    return 0

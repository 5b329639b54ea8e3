"""`vidsight serve`: the command line of the HTTP server."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vidsight.api.extras import require_extra
from vidsight.api.options import _float, add_server_answer_options, server_answer_settings


def add_serve_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.api.serve.config import (API_KEY_ENV, DEFAULT_FETCH_TIMEOUT_S, DEFAULT_MAX_CONCURRENT,
                                           DEFAULT_MAX_VIDEO_BYTES, DEFAULT_PREFIX_CACHE_BYTES,
                                           DEFAULT_MAX_PREFILL_TOKENS, DEFAULT_PREFIX_CACHE_HOST_BYTES,
                                           DEFAULT_REPLICA_TIMEOUT_S, DEFAULT_SOURCE_RETRIES,
                                           DEFAULT_SOURCE_RETRY_WINDOW_S, default_db_path)
    from vidsight.engine.config import DEFAULT_MODEL

    serve = commands.add_parser("serve", parents=parents,
                                help="an HTTP server: OpenAI-compatible video chat completions, watches, metrics")
    serve.set_defaults(run=run_serve)
    serve.add_argument("--model", default=DEFAULT_MODEL, help=f"Hugging Face id or checkpoint directory (default: {DEFAULT_MODEL})")
    serve.add_argument("--served-model-name", default=None, help="the model id clients name (default: --model)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument("--api-key", default=None,
                       help=f"required as 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV}, else none)")
    serve.add_argument("--api-keys", default=None, metavar="FILE",
                       help="keys per tenant, a line each: NAME KEY [admin] [watches=N] [sessions=N] [requests=N]; "
                            "a tenant sees only its own watches and sessions, an admin all")
    serve.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                       help="local videos (paths, file://) must lie under DIR (default: none are served)")
    egress = serve.add_argument_group(
        "outbound connections (refused to loopback, private, link-local, multicast and reserved addresses by default)")
    egress.add_argument("--allowed-media-domains", nargs="+", default=None, metavar="DOMAIN",
                        help="fetch http(s) videos only from these domains and their subdomains, at any address "
                             "(vLLM's flag; default: any host whose addresses are public)")
    egress.add_argument("--allowed-stream-networks", nargs="+", default=(), metavar="CIDR",
                        help="networks watch and session sources may reach although private (cameras on a LAN, "
                             "e.g. 192.168.1.0/24)")
    egress.add_argument("--allowed-webhook-networks", nargs="+", default=(), metavar="CIDR",
                        help="networks webhooks may reach although private")
    serve.add_argument("--source-retries", type=int, default=DEFAULT_SOURCE_RETRIES, metavar="N",
                       help="a watch's or session's network source failing this many times in a row ends failed "
                            f"(default: {DEFAULT_SOURCE_RETRIES})")
    serve.add_argument("--source-retry-window", type=_float, default=DEFAULT_SOURCE_RETRY_WINDOW_S, metavar="S",
                       help="...or failing this many seconds without a frame "
                            f"(default: {DEFAULT_SOURCE_RETRY_WINDOW_S:g})")
    serve.add_argument("--no-answer-batching", action="store_true",
                       help="run each completion and session question whole in its turn instead of generating "
                            "concurrent answers together")
    serve.add_argument("--plain-weights", action="store_true",
                       help="on a CPU, keep the large linear weights row-major instead of reordering them into "
                            "oneDNN's blocked layout, which decodes 8 answers together about 1.6x faster and one "
                            "answer about 13 %% slower")
    add_server_answer_options(serve)
    serve.add_argument("--prefix-cache-bytes", type=int, default=DEFAULT_PREFIX_CACHE_BYTES, metavar="N",
                       help="KV bytes of videos kept so a later completion about the same video (same bytes, "
                            "sampling and prefill settings, no KV pruning) prefills only its question; 0 turns it "
                            f"off (default: {DEFAULT_PREFIX_CACHE_BYTES})")
    serve.add_argument("--prefix-cache-host-bytes", type=int, default=None, metavar="N",
                       help="host-memory bytes for video prefixes past --prefix-cache-bytes, brought back up on a "
                            f"hit (default: {DEFAULT_PREFIX_CACHE_HOST_BYTES} on a CUDA device, vLLM's swap space; "
                            "0 on the CPU)")
    serve.add_argument("--max-prefill-tokens", type=int, default=None, metavar="N",
                       help="prompt tokens of completions' prefill a model turn, a longer group split there and "
                            "finished in later turns, so watches wait for at most N tokens' pass (0: a whole group a "
                            f"turn; default: {DEFAULT_MAX_PREFILL_TOKENS['cuda']} on a CUDA device, "
                            f"{DEFAULT_MAX_PREFILL_TOKENS['cpu']} on the CPU)")
    serve.add_argument("--kv-disk", default=None, metavar="DIR",
                       help="disk tier of sessions opened with KV budgets (a directory per session; default: none, "
                            "KV past the host budget is evicted)")
    serve.add_argument("--db", default=None, help="watches, verdicts and alerts: a SQLite file or a postgresql:// URL "
                                                  f"(default: {default_db_path()})")
    serve.add_argument("--max-video-bytes", type=int, default=DEFAULT_MAX_VIDEO_BYTES,
                       help=f"largest video uploaded or fetched (default: {DEFAULT_MAX_VIDEO_BYTES})")
    serve.add_argument("--fetch-timeout", type=_float, default=DEFAULT_FETCH_TIMEOUT_S, metavar="S",
                       help=f"longest an http(s) video may take to arrive (default: {DEFAULT_FETCH_TIMEOUT_S:g})")
    serve.add_argument("--max-concurrent", type=int, default=DEFAULT_MAX_CONCURRENT,
                       help=f"requests in progress at once; more get 429 (default: {DEFAULT_MAX_CONCURRENT})")
    serve.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    ray = serve.add_argument_group("Ray Serve (many replicas, many hosts; needs pip install 'vidsight[ray]')")
    ray.add_argument("--ray", action="store_true", help="serve as a Ray Serve application of model replicas")
    ray.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="the Ray cluster to join, e.g. auto or ray://head:10001 (default: start one here)")
    scale = ray.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=int, default=1, help="model replicas (default: 1)")
    scale.add_argument("--autoscale", type=int, nargs=2, metavar=("MIN", "MAX"), default=None,
                       help="let Ray Serve scale the replicas between MIN and MAX on requests in flight")
    ray.add_argument("--replica-cpus", type=_float, default=1.0, help="CPUs each replica reserves (default: 1)")
    ray.add_argument("--replica-gpus", type=_float, default=0.0, help="GPUs each replica reserves (default: 0)")
    ray.add_argument("--replica-timeout", type=_float, default=DEFAULT_REPLICA_TIMEOUT_S, metavar="S",
                     help="a replica silent this long is taken for dead and its watches move "
                          f"(default: {DEFAULT_REPLICA_TIMEOUT_S:g})")


def serve_config(args):
    from vidsight.api.serve.config import API_KEY_ENV, ServeConfig, absolute_model, default_db_path
    from vidsight.api.serve.tenants import read_api_keys

    # Absolute paths: Ray's replicas run in other working directories, maybe on other hosts.
    model = absolute_model(args.model)
    db = args.db if args.db and "://" in args.db else Path(args.db or default_db_path()).resolve()
    return ServeConfig(model=model, device=args.device, api_key=args.api_key or os.environ.get(API_KEY_ENV),
                       allowed_local_media_path=Path(args.allowed_local_media_path).resolve()
                       if args.allowed_local_media_path else None, db=db,
                       max_video_bytes=args.max_video_bytes, fetch_timeout_s=args.fetch_timeout,
                       max_concurrent=args.max_concurrent, model_name=args.served_model_name or args.model,
                       allowed_media_domains=tuple(args.allowed_media_domains) if args.allowed_media_domains else None,
                       allowed_stream_networks=tuple(args.allowed_stream_networks),
                       allowed_webhook_networks=tuple(args.allowed_webhook_networks),
                       api_keys=read_api_keys(args.api_keys) if args.api_keys else (),
                       source_retries=args.source_retries, source_retry_window_s=args.source_retry_window,
                       kv_disk=Path(args.kv_disk).resolve() if args.kv_disk else None,
                       batch_answers=not args.no_answer_batching, prefix_cache_bytes=args.prefix_cache_bytes,
                       prefix_cache_host_bytes=args.prefix_cache_host_bytes,
                       max_prefill_tokens=args.max_prefill_tokens, packed_weights=not args.plain_weights,
                       **server_answer_settings(args))


def ray_config(args):
    from vidsight.api.serve.config import RayConfig

    return RayConfig(address=args.ray_address, replicas=args.replicas,
                     autoscale=tuple(args.autoscale) if args.autoscale else None, replica_cpus=args.replica_cpus,
                     replica_gpus=args.replica_gpus, replica_timeout_s=args.replica_timeout)


def run_serve(args) -> int:
    require_extra("serve", "vidsight serve")
    import uvicorn

    from vidsight.api.serve import create_app

    if args.ray:
        from vidsight.api.serve.ray_cli import run_on_ray

        return run_on_ray(serve_config(args), ray_config(args), args.host, args.port, args.debug)
    app = create_app(serve_config(args))
    app.state.server.load()
    # In-flight requests get this long to finish on SIGINT/SIGTERM; streams stop at a window boundary.
    uvicorn.run(app, host=args.host, port=args.port, log_level="debug" if args.debug else "warning",
                timeout_graceful_shutdown=30)
    return 0

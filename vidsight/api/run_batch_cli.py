"""`vidsight run-batch`: a file of chat-completion requests answered offline (OpenAI's batch format,
as ``vllm run-batch``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from vidsight.api.extras import require_extra
from vidsight.api.options import add_server_answer_options, server_answer_settings
from vidsight.errors import ConfigError


def add_run_batch_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.api.serve.config import DEFAULT_MAX_CONCURRENT, DEFAULT_PREFIX_CACHE_BYTES
    from vidsight.engine.config import DEFAULT_MODEL

    batch = commands.add_parser("run-batch", parents=parents,
                                help="answer a file of chat completion requests (OpenAI's batch format)")
    batch.set_defaults(run=run_batch)
    batch.add_argument("-i", "--input-file", required=True, metavar="FILE.jsonl",
                       help='one request per line: {"custom_id": ..., "method": "POST", "url": '
                            '"/v1/chat/completions", "body": {...}} (- for standard input)')
    batch.add_argument("-o", "--output-file", required=True, metavar="FILE.jsonl",
                       help="one result per line, in the input's order (- for standard output)")
    batch.add_argument("--model", default=DEFAULT_MODEL, help=f"Hugging Face id or checkpoint directory (default: {DEFAULT_MODEL})")
    batch.add_argument("--served-model-name", default=None, help="the model id requests name (default: --model)")
    batch.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    batch.add_argument("--allowed-local-media-path", default=".", metavar="DIR",
                       help="local videos the requests may name lie under this directory (default: the current one)")
    batch.add_argument("--max-concurrent", type=int, default=DEFAULT_MAX_CONCURRENT,
                       help=f"requests in flight at once, decoded together (default: {DEFAULT_MAX_CONCURRENT})")
    batch.add_argument("--prefix-cache-bytes", type=int, default=DEFAULT_PREFIX_CACHE_BYTES, metavar="N",
                       help="KV bytes of videos kept for later requests about the same video (0: off)")
    batch.add_argument("--max-prefill-tokens", type=int, default=None, metavar="N",
                       help="prefill tokens per model step beside the running answers (default: the server's)")
    add_server_answer_options(batch)


def run_batch(args) -> int:
    require_extra("serve", "vidsight run-batch")
    from tqdm import tqdm

    from vidsight.api.serve import ServeConfig, create_app
    from vidsight.api.serve.batch_file import answer_batch, read_batch
    from vidsight.api.serve.config import absolute_model

    lines = read_batch(_read(args.input_file), args.input_file)
    with tempfile.TemporaryDirectory(prefix="vidsight-batch-") as scratch:
        config = ServeConfig(model=absolute_model(args.model), device=args.device,
                             model_name=args.served_model_name or args.model,
                             allowed_local_media_path=Path(args.allowed_local_media_path).resolve(),
                             db=Path(scratch) / "batch.db", max_concurrent=args.max_concurrent,
                             prefix_cache_bytes=args.prefix_cache_bytes, max_prefill_tokens=args.max_prefill_tokens,
                             **server_answer_settings(args))
        with tqdm(total=len(lines), desc="requests", unit="req", disable=not sys.stderr.isatty()) as bar:
            results = asyncio.run(answer_batch(create_app(config), lines, args.max_concurrent, bar.update))
    text = "".join(json.dumps(result) + "\n" for result in results)
    if args.output_file == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(args.output_file).write_text(text)
        except OSError as exc:
            raise ConfigError(f"{args.output_file}: cannot write the results ({exc.strerror or exc})") from None
    failed = sum(result["response"]["status_code"] != 200 for result in results)
    print(f"vidsight: {len(results)} requests, {len(results) - failed} answered, {failed} refused"
          + ("" if args.output_file == "-" else f"; results in {args.output_file}"), file=sys.stderr)
    return 0


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name}: cannot read the requests ({getattr(exc, 'strerror', None) or exc})") from None

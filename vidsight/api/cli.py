"""`vidsight`: the command-line tool."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys

from vidsight.api.bench import add_bench_parser, run_bench
from vidsight.api.chat import add_chat_parser, run_chat
from vidsight.api.serve_cli import add_serve_parser, run_serve
from vidsight.api.watch import add_watch_parser, run_watch
from vidsight.api.options import _float, add_feed_options, add_prefill_options, feed_config, prefill_config
from vidsight.errors import VidsightError

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    # Only torch-free modules: --help, flag errors and probe must start fast.
    from vidsight.tasks.families import FAMILIES
    from vidsight.engine.config import DEFAULT_MODEL, GenerationConfig
    from vidsight.ingest.sampling import DEFAULT_FPS, DEFAULT_MAX_FRAMES
    from vidsight.models.paths import TASK_MODEL
    from vidsight.train.config import TrainConfig

    parser = argparse.ArgumentParser(prog="vidsight", description="Video understanding with vision-language models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    # --debug is accepted after the subcommand too; SUPPRESS keeps it from resetting the global one.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logs")
    commands = parser.add_subparsers(dest="command", required=True)
    add = functools.partial(commands.add_parser, parents=[common])

    ask = add("ask", help="answer a question about a video file")
    ask.add_argument("video", help="video file")
    ask.add_argument("question", help="the question, in quotes")
    ask.add_argument("--model", default=DEFAULT_MODEL, help=f"Hugging Face id or checkpoint directory (default: {DEFAULT_MODEL})")
    ask.add_argument("--fps", type=_float, default=DEFAULT_FPS, help=f"frames sampled per second (default: {DEFAULT_FPS}, Qwen's)")
    ask.add_argument("--max-frames", type=int, default=DEFAULT_MAX_FRAMES, help=f"at most this many frames (default: {DEFAULT_MAX_FRAMES})")
    ask.add_argument("--max-new-tokens", type=int, default=GenerationConfig.max_new_tokens, help="answer length limit")
    ask.add_argument("--temperature", type=_float, default=0.0, help="0 (default) is greedy; above 0 samples")
    ask.add_argument("--top-p", type=_float, default=1.0, help="nucleus mass when sampling")
    ask.add_argument("--seed", type=int, default=0, help="sampling seed")
    ask.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    ask.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ask.add_argument("--meter-memory", action="store_true",
                     help="record prefill's peak tensor memory on the CPU too (slower; always on with CUDA)")
    add_prefill_options(ask)
    add_feed_options(ask)

    add_watch_parser(commands, [common])
    add_chat_parser(commands, [common])
    add_serve_parser(commands, [common])

    probe = add("probe", help="describe a video's stream without decoding it")
    probe.add_argument("video")
    probe.add_argument("--json", action="store_true", help="print JSON")

    model = add("model", help="model utilities")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    tiny = model_commands.add_parser("tiny", parents=[common], help="write a tiny random-weight Qwen2.5-VL checkpoint (no download)")
    tiny.add_argument("directory")
    tiny.add_argument("--seed", type=int, default=0)

    add_bench_parser(commands, [common])

    train = add("train", help="train the small task model on generated videos")
    train.add_argument("--out", default="out/train", help="checkpoints, logs, plots and the model (default: out/train)")
    train.add_argument("--steps", type=int, default=TrainConfig.steps)
    train.add_argument("--seed", type=int, default=TrainConfig.seed)
    train.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    train.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate")
    train.add_argument("--warmup", type=int, default=TrainConfig.warmup, help="warm-up steps")
    train.add_argument("--init", default=None, metavar="MODEL",
                       help="fine-tune this checkpoint instead of starting from random weights")
    train.add_argument("--offset-patches", type=int, default=TrainConfig.offset_patches, metavar="N",
                       help="clips start up to N temporal patches into a stream (default: 0, at the start)")
    train.add_argument("--chat-frames", type=int, nargs="*", default=list(TrainConfig.chat_frames), metavar="F",
                       help="train on chat-suite streams of these lengths too (every other step)")
    train.add_argument("--chat-questions", nargs="*", default=[], metavar="FAMILY",
                       help="chat steps ask these families (colour, shape, order; repeat to weight; "
                            "default: the streams' own questions)")
    train.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    train.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    train.add_argument("--export", action="store_true", help="only write OUT/model from OUT/checkpoint.pt")

    demo = add("demo", help="generate a sample video and ask about it")
    demo.add_argument("--out", default="out/demo", help="where the video and contact sheet go (default: out/demo)")
    demo.add_argument("--family", default="needle", choices=list(FAMILIES), help="which kind of question")
    demo.add_argument("--seed", type=int, default=7, help="which generated video")
    demo.add_argument("--model", default=str(TASK_MODEL), help=f"checkpoint (default: {TASK_MODEL})")
    demo.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _run_ask(args) -> int:
    from vidsight.engine import Asker, GenerationConfig
    from vidsight.ingest import SamplingConfig

    sampling = SamplingConfig(fps=args.fps, max_frames=args.max_frames)
    generation = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  top_p=args.top_p, seed=args.seed)
    result = Asker(args.model, device=args.device, meter_memory=args.meter_memory or None).ask(args.video, args.question, sampling, generation,
                                                       prefill_config(args), feed_config(args),
                                                       progress=sys.stderr.isatty() and not args.json)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(result.answer)
        s = result.stats
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in s.stages_s.items())
        print(f"[{s.frames} frames, {s.visual_tokens} visual tokens ({s.kept_visual_tokens} kept), "
              f"{s.generated_tokens} generated; {stages}; wall {s.wall_s:.2f}s; "
              f"peak {s.peak_memory_bytes / 2**20:.0f} MiB on {s.device}]", file=sys.stderr)
    return 0


def _run_probe(args) -> int:
    from vidsight.ingest import probe

    info = probe(args.video).to_dict()
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            if isinstance(value, list) and len(value) > 12:
                value = f"{value[:12]}... ({len(value)} in all)"
            print(f"{key:>16}: {value}")
    return 0


def _run_model(args) -> int:
    from vidsight.models import write_tiny_model

    print(write_tiny_model(args.directory, seed=args.seed))
    return 0


def _run_train(args) -> int:
    from vidsight.train import TrainConfig, export_checkpoint, train

    if args.export:
        print(export_checkpoint(args.out, seed=args.seed))
        return 0
    config = TrainConfig(steps=args.steps, seed=args.seed, eval_every=args.eval_every, lr=args.lr,
                         warmup=args.warmup, init=args.init,
                         offset_patches=args.offset_patches, chat_frames=tuple(args.chat_frames),
                         chat_questions=tuple(args.chat_questions))
    logging.getLogger("vidsight.train").setLevel(logging.INFO)
    print(train(args.out, config, resume=args.resume, progress=sys.stderr.isatty(), device=args.device))
    return 0


def _run_demo(args) -> int:
    from vidsight.api.demo import run_demo

    return run_demo(args.out, family=args.family, seed=args.seed, model=args.model, as_json=args.json)


def _quiet_libraries() -> None:
    """Silence transformers' load bars and FFmpeg's decoder chatter: vidsight reports losses itself."""
    import av

    # Read by transformers and huggingface_hub when (and if) a command imports them.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # FFmpeg's own level, not PyAV's callback: that callback takes the GIL from decoder threads
    # and deadlocks when a frame-threaded decoder is freed.
    av.logging.set_libav_level(av.logging.PANIC)
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="vidsight: %(message)s")
    if not args.debug:
        _quiet_libraries()
    handlers = {"ask": _run_ask, "watch": run_watch, "chat": run_chat, "probe": _run_probe, "model": _run_model, "demo": _run_demo,
                "bench": run_bench, "train": _run_train, "serve": run_serve}
    try:
        return handlers[args.command](args)
    except VidsightError as exc:
        if args.debug:
            raise
        print(f"vidsight: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`vidsight watch ... | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

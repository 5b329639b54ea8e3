"""`vidsight ask`: a question about a video file."""

from __future__ import annotations

import argparse
import json
import sys

from vidsight.api.options import (_float, add_chat_template_option, add_feed_options, add_generation_options,
                                  add_prefill_options, add_reasoning_option, answer_format_settings, chat_template_of,
                                  json_object, motion_note, with_checkpoint_sampling)
from vidsight.api.sources import whole_file
from vidsight.api.settings import ask_configs, feed_config, generation_config
from vidsight.errors import ConfigError


def add_ask_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.engine.config import DEFAULT_MODEL, GenerationConfig
    from vidsight.ingest.sampling import DEFAULT_FPS, DEFAULT_MAX_FRAMES

    ask = commands.add_parser("ask", parents=parents, help="answer a question about a video file (or an image)")
    ask.add_argument("video", help="video file; or an http(s) URL, or - for a video piped in, either read "
                                    "whole into a temporary file first; a picture (PNG, JPEG, WebP ...) is shown "
                                    "to the model as its image processor shows one")
    ask.add_argument("question", nargs="+",
                     help="the question, in quotes; several are answered in turn, the video decoded and "
                          "prefilled once (each later question continues its KV) unless KV pruning is on")
    ask.add_argument("--system", default=None, metavar="TEXT",
                     help="a system message before the question (default: the chat template's own, e.g. Qwen's "
                          "'You are a helpful assistant.')")
    ask.add_argument("--chat-template-kwargs", type=json_object, default=None, metavar="JSON",
                     help="further variables for the chat template, as a JSON object (vLLM's chat_template_kwargs; "
                          "e.g. '{\"enable_thinking\": false}' for Qwen3's)")
    ask.add_argument("--answer-start", default=None, metavar="TEXT",
                     help="begin the answer with TEXT and let the model go on from it (vLLM's continue_final_message); "
                          "the answer printed is what follows TEXT")
    ask.add_argument("--model", default=DEFAULT_MODEL, help=f"Hugging Face id or checkpoint directory (default: {DEFAULT_MODEL})")
    ask.add_argument("--fps", type=_float, default=DEFAULT_FPS, help=f"frames sampled per second (default: {DEFAULT_FPS}, Qwen's)")
    ask.add_argument("--max-frames", type=int, default=DEFAULT_MAX_FRAMES, help=f"at most this many frames (default: {DEFAULT_MAX_FRAMES})")
    ask.add_argument("--start", dest="start_s", type=_float, default=None, metavar="SECONDS",
                     help="ask about the clip from SECONDS on (from the video's first frame): only its frames are "
                          "decoded, from the keyframe before it (qwen-vl-utils' video_start)")
    ask.add_argument("--end", dest="end_s", type=_float, default=None, metavar="SECONDS",
                     help="... up to SECONDS (default: the video's end; video_end)")
    ask.add_argument("--min-pixels", type=int, default=None, metavar="PIXELS",
                     help="fewest pixels a frame (or a picture) is resized to (default: the checkpoint's; "
                          "qwen-vl-utils' and vLLM's min_pixels; Qwen models only)")
    ask.add_argument("--max-pixels", type=int, default=None, metavar="PIXELS",
                     help="most pixels a frame (or a picture) is resized to: fewer visual tokens each, e.g. "
                          "200704 for QuickVideo's 448x448 (default: the checkpoint's; Qwen models only)")
    ask.add_argument("--total-pixels", type=int, default=None, metavar="PIXELS",
                     help="the whole video's pixel budget, which shrinks each frame of a long video (default: the "
                          "checkpoint's, else qwen-vl-utils'; Qwen models only)")
    ask.add_argument("--max-new-tokens", type=int, default=GenerationConfig.max_new_tokens, help="answer length limit")
    ask.add_argument("--logprobs", type=int, default=None, metavar="K",
                     help="with --json: each answer token's log probability and the K likeliest tokens' (0-20)")
    add_generation_options(ask)
    ask.add_argument("--choices", nargs="+", default=None, metavar="TEXT",
                     help="score these answers instead of generating one (a multiple-choice question): print the "
                          "likeliest, and each one's log probability under the model on stderr (or with --json)")
    ask.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    ask.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ask.add_argument("--meter-memory", action="store_true",
                     help="record prefill's peak tensor memory on the CPU too (slower; always on with CUDA)")
    add_chat_template_option(ask)
    add_reasoning_option(ask)
    add_prefill_options(ask)
    add_feed_options(ask)
    ask.set_defaults(run=run_ask)


def run_ask(args) -> int:
    from vidsight.engine import Asker
    from vidsight.engine.prefix_cache import PrefixCache
    from vidsight.models import load_model

    _conversations(args)   # a bad question or answer begun is refused before the model loads
    shaped = args.answer_schema or args.answer_regex or args.answer_grammar
    if args.choices and (args.logprobs is not None or args.stop or shaped):
        raise ConfigError("--choices scores the answers given, each token's log probability included; "
                          "--logprobs, --stop and answer formats apply to a generated answer")
    sampling, generation, prefill = ask_configs(answer_format_settings(args))
    # Several questions about the one video: its prefix is kept for the later ones, whatever its size.
    prefix_cache = PrefixCache(sys.maxsize) if len(args.question) > 1 else None
    adapter = load_model(args.model, device=args.device, chat_template=chat_template_of(args))
    if not args.choices:   # a choice is scored, not sampled
        generation = generation_config(with_checkpoint_sampling(answer_format_settings(args), args, adapter))
    asker = Asker(adapter, meter_memory=args.meter_memory or None, prefix_cache=prefix_cache)
    with whole_file(args.video) as video:
        _answer(args, asker, video, _conversations(args, asker.visual_of(video)), sampling, generation, prefill)
    return 0


def _conversations(args, visual=None) -> list:
    """Each of ``args.question`` as a conversation about the video (or the image, ``visual`` being
    `IMAGE_PART`), with the system message, template arguments and answer begun the flags give."""
    from vidsight.models.conversation import VIDEO_PART, Conversation

    conversations = [Conversation.of(question, args.system, args.chat_template_kwargs, visual=visual or VIDEO_PART)
                     for question in args.question]
    if args.answer_start is not None:
        conversations = [conversation.continued(args.answer_start) for conversation in conversations]
    return conversations


def _answer(args, asker, video: str, conversations, sampling, generation, prefill) -> None:
    """Answer each of ``args.question`` (as ``conversations``) about ``video`` in turn, printing each answer."""
    progress = sys.stderr.isatty() and not args.json
    # On a terminal the answer is printed as it is generated (a thinking model's once it is whole).
    streamed = sys.stdout.isatty() and not args.json and not args.choices and generation.reasoning_parser is None
    for question, conversation in zip(args.question, conversations):
        if args.choices:
            result = asker.score(video, conversation, args.choices, sampling=sampling, prefill=prefill,
                                 feed=feed_config(vars(args)), progress=progress)
        else:
            result = asker.ask(video, conversation, sampling=sampling, generation=generation, prefill=prefill,
                               feed=feed_config(vars(args)), progress=progress,
                               on_text=(lambda text: print(text, end="", flush=True)) if streamed else None)
        if args.json:   # one object per question, a line each
            print(json.dumps({**({"question": question} if len(args.question) > 1 else {}), **result.to_dict()}),
                  flush=True)
            continue
        if args.choices:
            print(result.scores[result.best].text, flush=True)
            for score in result.scores:
                print(f"  {score.logprob:9.3f}  {score.text}{'  (greedy)' if score.greedy else ''}", file=sys.stderr)
        else:
            if result.reasoning is not None:
                print(f"[reasoning]\n{result.reasoning}\n[answer]", file=sys.stderr, flush=True)
            print("" if streamed else result.answer, flush=True)
        s = result.stats
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in s.stages_s.items())
        encoded = f"{s.encoded_visual_tokens} encoded, " if s.encoded_visual_tokens != s.visual_tokens else ""
        cached = f", {s.cached_tokens} prompt tokens from the video's cached prefix" if s.cached_tokens else ""
        motion = f", {motion_note(s.motion_source)}" if s.motion_source else ""
        shown = (f"1 picture{f' in {s.frames} tiles' if s.frames > 1 else ''}" if s.still else f"{s.frames} frames")
        print(f"[{shown}, {s.visual_tokens} visual tokens ({encoded}{s.kept_visual_tokens} kept{motion}), "
              f"{s.generated_tokens} generated{cached}; {stages}; wall {s.wall_s:.2f}s; "
              f"peak {s.peak_memory_bytes / 2**20:.0f} MiB on {s.device}]", file=sys.stderr)

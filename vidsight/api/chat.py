"""`vidsight chat`: questions about a stream, asked at the stream time they arrive."""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
from pathlib import Path

from vidsight.api.options import (_float, add_chat_template_option, add_generation_options, add_policy_options,
                                  add_reasoning_option, add_tier_options, answer_format_settings, chat_template_of,
                                  foreign_policy_flags, policy_settings, with_checkpoint_sampling)
from vidsight.api.sources import STDIN, live_source
from vidsight.api.settings import chat_configs, generation_config
from vidsight.errors import ConfigError

PROGRESS_EVERY_PATCHES = 32


def add_chat_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.engine.config import DEFAULT_MODEL
    from vidsight.kv.policies.registry import POLICIES

    chat = commands.add_parser("chat", parents=parents, help="ask questions at any moment about a stream seen so far")
    chat.set_defaults(run=run_chat)
    chat.add_argument("source", help="video file, - for standard input (questions then from --questions), or "
                                        "a stream URL (rtsp://, http://, ...)")
    chat.add_argument("--model", default=DEFAULT_MODEL, help=f"Hugging Face id or checkpoint directory (default: {DEFAULT_MODEL})")
    chat.add_argument("--fps", type=_float, default=1.0, help="frames sampled per second (default: 1; ReKV's is 0.5)")
    chat.add_argument("--policy", default="full", choices=list(POLICIES),
                      help="which cached tokens each step attends to (default: full, exact)")
    add_policy_options(chat)
    add_tier_options(chat)
    add_generation_options(chat)
    add_reasoning_option(chat)
    chat.add_argument("--questions", default=None, metavar="FILE.jsonl",
                      help='{"time_s": ..., "question": ...} per line, with "choices": [...] to score those answers '
                           'instead of generating one (default: questions typed on stdin)')
    chat.add_argument("--batch-patches", type=int, default=1, metavar="K",
                      help="encode and prefill K temporal patches together (Mosaic's batching; default: 1)")
    chat.add_argument("--keep-dialogue", action="store_true",
                      help="keep each question and answer in the memory, as a chat would (default: only video)")
    chat.add_argument("--system", default=None, metavar="TEXT",
                      help="a system message before the stream (default: the chat template's own)")
    chat.add_argument("--max-new-tokens", type=int, default=64, help="answer length limit (default: 64)")
    chat.add_argument("--realtime", action="store_true", help="replay a file at its own frame rate")
    chat.add_argument("--follow", type=_float, default=None, metavar="IDLE_S",
                      help="keep reading a growing file until idle this long")
    chat.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    add_chat_template_option(chat)
    chat.add_argument("--json", action="store_true", help="one JSON line per answer and progress report")


def read_questions(path: str | Path) -> list[tuple[float, str, tuple[str, ...] | None]]:
    """``(time_s, question, choices)`` from a JSON-lines file, in time order: a line's optional
    ``choices`` (a list of answers) are scored instead of generating an answer."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the questions ({exc.strerror or exc})") from None
    questions = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            time_s, question, choices = float(record["time_s"]), str(record["question"]), record.get("choices")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(f'{path}:{number}: expected {{"time_s": seconds, "question": text}}, got {line[:80]!r}') from None
        if time_s < 0 or not question.strip():
            raise ConfigError(f"{path}:{number}: time_s must be >= 0 and the question non-empty")
        if choices is not None and (not isinstance(choices, list) or not choices
                                    or not all(isinstance(c, str) and c.strip() for c in choices)):
            raise ConfigError(f"{path}:{number}: choices must be a list of one or more non-empty strings, "
                              f"got {choices!r}"[:200])
        questions.append((time_s, question, None if choices is None else tuple(choices)))
    return sorted(questions, key=lambda q: q[0])


def chat_policy(args):
    """The policy ``--policy`` names, built from its flags (a flag of another policy is an error)."""
    from vidsight.kv.policies.registry import make_policy

    others = foreign_policy_flags(args, args.policy)
    if others:
        raise ConfigError(f"{', '.join(others)} do not apply to the {args.policy} policy")
    return make_policy(args.policy, **policy_settings(args)[args.policy])


def _stdin_questions() -> queue.Queue:
    """Questions typed on stdin, each stamped when the stream reaches it; None marks the end."""
    lines: queue.Queue = queue.Queue()

    def read():
        try:
            for line in sys.stdin:
                if line.strip():
                    lines.put(line.strip())
        except (OSError, ValueError):  # no readable stdin: no typed questions
            pass
        finally:
            lines.put(None)

    threading.Thread(target=read, daemon=True, name="vidsight-stdin").start()
    return lines


def run_chat(args) -> int:
    from vidsight.engine.chat import ChatSession
    from vidsight.ingest.stream import StreamSource
    from vidsight.models import load_model

    if args.source == STDIN and not args.questions:
        raise ConfigError("-: the video comes on standard input, so the questions cannot be typed there: "
                          "give them with --questions FILE.jsonl")
    scheduled = read_questions(args.questions) if args.questions else None
    generation = generation_config(answer_format_settings(args))
    config, tiers = chat_configs(vars(args))
    policy = chat_policy(args)
    source = StreamSource(live_source(args.source), fps=args.fps, realtime=args.realtime, follow_idle_s=args.follow)
    adapter = load_model(args.model, device=args.device, chat_template=chat_template_of(args))
    generation = generation_config(with_checkpoint_sampling(answer_format_settings(args), args, adapter))
    with ChatSession(adapter, policy, config, tiers) as session:
        return _converse(args, session, source, scheduled, generation)


def _converse(args, session, source, scheduled, generation) -> int:
    """Feed ``source`` to ``session`` and answer the questions as their times come."""
    from vidsight.ingest.queue import FrameQueue

    # Frames keep arriving while a question is answered: a live source drops the oldest queued ones.
    frames = FrameQueue(source, drop_oldest=lambda: source.live, stop_source=source.close)
    typed = _stdin_questions() if scheduled is None else None
    typing_ended = False
    origin = None

    def answer(question: str, choices: tuple[str, ...] | None = None) -> None:
        if choices is not None:
            scored = session.score(question, choices)
            best = scored.scores[scored.best].text
            if args.json:
                print(json.dumps({"type": "answer", "time_s": scored.stats.time_s, "question": question,
                                  "answer": best, "best": scored.best, "scores": [s.to_dict() for s in scored.scores],
                                  "stats": {**scored.stats.to_dict(), "frames_dropped": frames.dropped}}), flush=True)
                return
            print(f"[{session.time_s:8.1f} s] {question}\n{best}  ("
                  + ", ".join(f"{s.text} {s.logprob:.3f}" for s in scored.scores) + ")", flush=True)
            return
        if args.json:
            record = session.ask(question, generation).to_dict()
            record["stats"]["frames_dropped"] = frames.dropped
            print(json.dumps({"type": "answer", **record}), flush=True)
            return
        print(f"[{session.time_s:8.1f} s] {question}", flush=True)
        if generation.reasoning_parser is not None:   # the thinking apart, once the answer is whole
            answered = session.ask(question, generation)
            if answered.reasoning is not None:
                print(f"[reasoning]\n{answered.reasoning}\n[answer]", file=sys.stderr, flush=True)
            print(answered.answer, flush=True)
            return
        session.ask(question, generation, on_text=lambda text: print(text, end="", flush=True))
        print(flush=True)

    def due(now_s: float) -> list[tuple[str, tuple[str, ...] | None]]:
        """Questions whose time has come (typed ones at once) and their choices, once the session has video."""
        if session.frames_seen < session.adapter.vision.temporal_patch_size:
            return []
        nonlocal typing_ended
        if typed is not None:
            ready = []
            while not typing_ended and not typed.empty():
                item = typed.get_nowait()
                typing_ended = item is None
                ready += [(item, None)] if item is not None else []
            return ready
        ready = [(q, choices) for t, q, choices in scheduled if t <= now_s]
        del scheduled[: len(ready)]
        return ready

    patches = 0
    for frame in frames:
        origin = frame.pts_s if origin is None else origin
        session.push([frame])
        for question, choices in due(frame.pts_s - origin):
            answer(question, choices)
        if len(session.patches) >= patches + PROGRESS_EVERY_PATCHES:
            patches = len(session.patches)
            recent = [p.per_patch_s for p in session.patches[-PROGRESS_EVERY_PATCHES:]]
            report = {"type": "progress", "time_s": session.time_s, "frames_seen": session.frames_seen,
                      "cached_tokens": session.cache.length, "patch_prefill_s": sum(recent) / len(recent),
                      "queued_frames": len(frames), "frames_dropped": frames.dropped}
            print(json.dumps(report) if args.json else
                  f"[{session.time_s:8.1f} s] {session.frames_seen} frames, {session.cache.length} tokens cached, "
                  f"{report['patch_prefill_s'] * 1000:.0f} ms per temporal patch", file=sys.stdout if args.json
                  else sys.stderr, flush=True)
    # The stream ended: what is still to be asked is answered from everything seen.
    if typed is not None:
        while not typing_ended and (item := typed.get()) is not None:
            answer(item)
    else:
        for _, question, choices in scheduled:
            answer(question, choices)
    damaged = source.damaged_packets
    print(json.dumps({"type": "end", "frames_seen": session.frames_seen, "frames_dropped": frames.dropped,
                      "damaged_packets": damaged}) if args.json else
          f"[{session.frames_seen} frames seen, {frames.dropped} dropped"
          f"{f', {damaged} damaged packets skipped' if damaged else ''}]", flush=True)
    return 0

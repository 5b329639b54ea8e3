"""`vidsight watch`, and the records a watch reports (the CLI's JSON lines, the server's events)."""

from __future__ import annotations

import argparse
import json

from vidsight.api.options import _float, add_chat_template_option, add_motion_options, chat_template_of, motion_note
from vidsight.api.sources import live_source
from vidsight.api.settings import watch_config
from vidsight.errors import ConfigError


def add_watch_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.engine.config import ALERT_AFTER, DEFAULT_MODEL, REFRESH_MODES

    watch = commands.add_parser("watch", parents=parents,
                                help="a standing Yes/No query over sliding windows of a file or stream")
    watch.set_defaults(run=run_watch)
    watch.add_argument("source", help="video file, - for standard input (read as it comes: MPEG-TS, Matroska, "
                                         "fragmented MP4, raw H.264/HEVC), or a stream URL (rtsp://, http://, ...)")
    watch.add_argument("query_text", nargs="?", default=None, metavar="query",
                       help='the standing Yes/No query, e.g. "Is there a red object in the zone? Answer Yes or No." '
                            "(or --query)")
    watch.add_argument("--query", default=None, help="the query, as a flag (a --config file's query: ...)")
    watch.add_argument("--model", default=DEFAULT_MODEL, help=f"Hugging Face id or checkpoint directory (default: {DEFAULT_MODEL})")
    watch.add_argument("--window", dest="window_s", type=_float, default=40.0, help="window length in seconds (default: 40, CodecSight's)")
    watch.add_argument("--stride", type=_float, default=0.2, help="stride as a share of the window (default: 0.2)")
    watch.add_argument("--fps", type=_float, default=2.0, help="frames sampled per second (default: 2)")
    watch.add_argument("--align-windows", action="store_true",
                       help="start each window at a GOP's first sampled frame when one falls within a stride of "
                            "its nominal start, so the overlap with the window before starts at a keyframe "
                            "(CodecSight's; KV is reused only when the shift is whole temporal patches)")
    watch.add_argument("--refresh", default="full-comp", choices=REFRESH_MODES,
                       help="KV reuse between windows (default: full-comp, exact; anchors is CodecSight's)")
    watch.add_argument("--refresh-share", type=_float, default=None, metavar="S",
                       help="with --refresh deviation: the share of reused tokens recomputed each window "
                            "(default: 0.15, CacheBlend's; deeper models lose less to reuse with more)")
    watch.add_argument("--alert-after", type=int, default=ALERT_AFTER,
                       help=f"consecutive Yes windows that raise an alert (default: {ALERT_AFTER})")
    watch.add_argument("--realtime", action="store_true", help="replay a file at its own frame rate")
    watch.add_argument("--every-window", dest="catch_up", action="store_false", default=None,
                       help="judge every window of a live stream (or --realtime replay) however far the model "
                            "falls behind; by default a watch a stride behind judges the newest window and "
                            "passes over the ones before it")
    watch.add_argument("--follow", type=_float, default=None, metavar="IDLE_S",
                       help="keep reading a growing file (e.g. MPEG-TS being recorded) until idle this long")
    watch.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    add_chat_template_option(watch)
    watch.add_argument("--json", action="store_true", help="one JSON line per window and per alert")
    add_motion_options(watch, "prune patches whose motion stays under this many pixels")


def verdict_records(verdict, query: str) -> list[dict]:
    """The window's record, and an alert's when the window raised one."""
    records = [{"type": "window", **verdict.to_dict()}]
    if verdict.alert:
        records.append({"type": "alert", "window": verdict.window, "start_s": verdict.start_s,
                        "end_s": verdict.end_s, "query": query})
    return records


def end_record(source, watcher) -> dict:
    """A watch's last record: what its source (`StreamSource`) decoded and skipped as damaged, how
    its motion was judged, and what its `Watcher` passed over to keep up with a live source."""
    return {"type": "end", "frames_decoded": source.frames_decoded, "damaged_packets": source.damaged_packets,
            "codec": source.codec, "motion_source": source.motion_source,
            "windows_skipped": watcher.windows_skipped, "frames_dropped": watcher.frames_dropped}


def run_watch(args) -> int:
    from vidsight.engine.watch import Watcher
    from vidsight.models import load_model

    if (args.query is None) == (args.query_text is None):
        raise ConfigError("give the watch's query once: vidsight watch SOURCE QUERY, or --query QUERY")
    args.query = args.query or args.query_text
    config = watch_config(vars(args))
    source = config.open(live_source(args.source), realtime=args.realtime, follow_idle_s=args.follow)
    watcher = Watcher(load_model(args.model, device=args.device, chat_template=chat_template_of(args)), args.query, config)
    for verdict in watcher.watch(source):
        for record in verdict_records(verdict, args.query):
            if args.json:
                print(json.dumps(record), flush=True)
            elif record["type"] == "window":
                lag = f"  lag {verdict.lag_s:.1f} s" if source.live else ""
                caught_up = f" ({verdict.windows_skipped} windows skipped to keep up)" if verdict.windows_skipped else ""
                print(f"[{verdict.start_s:8.1f}-{verdict.end_s:8.1f} s] {verdict.answer:<4} p(yes) "
                      f"{verdict.p_yes:.2f}  tokens {verdict.kept_tokens}/{verdict.visual_tokens} (reused "
                      f"{verdict.reused_tokens}, refreshed {verdict.refreshed_tokens}){lag}{caught_up}", flush=True)
            else:
                print(f"ALERT at {verdict.end_s:.1f} s: {args.query}", flush=True)
    codec = f" of {source.codec}" if source.codec else ""
    motion = f"; {motion_note(source.motion_source)}" if source.motion_source else ""
    damaged = f"; {source.damaged_packets} damaged packets skipped" if source.damaged_packets else ""
    behind = (f"; {watcher.windows_skipped} windows skipped and {watcher.frames_dropped} frames dropped to keep "
              "up with the stream" if watcher.windows_skipped or watcher.frames_dropped else "")
    print(json.dumps(end_record(source, watcher)) if args.json else
          f"[{source.frames_decoded} frames{codec} decoded{damaged}{motion}{behind}]", flush=True)
    return 0

"""`vidsight bench live`: a watch of a video replayed in real time, catching up against judging
every window."""

from __future__ import annotations

import json
from pathlib import Path

from vidsight.api.options import _float, add_motion_options
from vidsight.api.settings import watch_config
from vidsight.api.sources import whole_file


def add_bench_live_parser(bench_commands, common) -> None:
    from vidsight.engine.config import REFRESH_MODES
    from vidsight.models.paths import TASK_MODEL

    live = bench_commands.add_parser("live", parents=[common],
                                     help="a watch of a video replayed in real time: catching up against judging "
                                          "every window (lag, windows skipped)")
    live.add_argument("video", help="the video replayed as a camera would deliver it (real footage)")
    live.add_argument("--query", default="Is there a person in the picture? Answer Yes or No.",
                      help="the standing query (default: whether there is a person)")
    live.add_argument("--model", default=str(TASK_MODEL), help=f"checkpoint (default: {TASK_MODEL})")
    live.add_argument("--shape", default=None, help="a random-weight model shape instead of --model")
    live.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="default: float32")
    live.add_argument("--window", dest="window_s", type=_float, default=4.0, help="window in seconds (default: 4)")
    live.add_argument("--stride", type=_float, default=0.25, help="stride as a share of the window (default: 0.25)")
    live.add_argument("--fps", type=_float, default=2.0, help="frames sampled per second (default: 2)")
    live.add_argument("--refresh", default="full-comp", choices=REFRESH_MODES, help="default: full-comp")
    add_motion_options(live, "prune patches whose motion stays under this many pixels")
    live.add_argument("--out", default="out/bench", help="the JSON report goes here (default: out/bench)")
    live.add_argument("--json", action="store_true", help="print the JSON report")


def run_bench_live(args) -> int:
    import torch

    from vidsight.bench.live import format_live_report, run_live_bench
    from vidsight.models import load_model
    from vidsight.models.shapes import build_shape

    config = watch_config(vars(args))
    dtype = getattr(torch, args.dtype)
    adapter = build_shape(args.shape, dtype=dtype) if args.shape else load_model(args.model, dtype=dtype)
    with whole_file(args.video) as video:
        report = run_live_bench(adapter, video, config, args.query,
                                progress=lambda line: None if args.json else print(line))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "live.json"
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report) if args.json else f"{format_live_report(report)}\n\n{path}")
    return 0

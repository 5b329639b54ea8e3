"""`vidsight probe` (a video's stream, undecoded) and `vidsight model tiny` (a random checkpoint)."""

from __future__ import annotations

import argparse
import json


def add_probe_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    probe = commands.add_parser("probe", parents=parents,
                                help="describe a video's stream from its packets (decoding only its first frame)")
    probe.add_argument("video", help="video file; or an http(s) URL, or - for a video piped in, either "
                                      "read whole into a temporary file first")
    probe.add_argument("--json", action="store_true", help="print JSON")
    probe.set_defaults(run=run_probe)


def add_model_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    model = commands.add_parser("model", parents=parents, help="model utilities")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    tiny = model_commands.add_parser("tiny", parents=parents,
                                     help="write a tiny random-weight checkpoint of a family (no download)")
    tiny.add_argument("directory")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--family", default="qwen2_5_vl",
                      help="the family's model_type, as in a checkpoint's config.json (default qwen2_5_vl; "
                           "an unknown one is refused with the list of those built)")
    tiny.set_defaults(run=run_model)


def run_probe(args) -> int:
    from vidsight.api.sources import whole_file
    from vidsight.ingest import probe

    with whole_file(args.video) as video:
        info = probe(video).to_dict()
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            if isinstance(value, list) and len(value) > 12:
                value = f"{value[:12]}... ({len(value)} in all)"
            print(f"{key:>16}: {value}")
    return 0


def run_model(args) -> int:
    from vidsight.models import write_tiny_model

    print(write_tiny_model(args.directory, seed=args.seed, family=args.family))
    return 0

"""`vidsight demo`: a generated video with a known answer, asked of the task model."""

from __future__ import annotations

import argparse


def add_demo_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.models.paths import TASK_MODEL
    from vidsight.tasks.families import FAMILIES

    demo = commands.add_parser("demo", parents=parents, help="generate a sample video and ask about it")
    demo.add_argument("--out", default="out/demo", help="where the video and contact sheet go (default: out/demo)")
    demo.add_argument("--family", default="needle", choices=list(FAMILIES), help="which kind of question")
    demo.add_argument("--seed", type=int, default=7, help="which generated video")
    demo.add_argument("--model", default=str(TASK_MODEL), help=f"checkpoint (default: {TASK_MODEL})")
    demo.add_argument("--json", action="store_true", help="print JSON")
    demo.set_defaults(run=run_demo_command)


def run_demo_command(args) -> int:
    from vidsight.api.demo import run_demo

    return run_demo(args.out, family=args.family, seed=args.seed, model=args.model, as_json=args.json)

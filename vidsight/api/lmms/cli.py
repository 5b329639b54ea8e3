"""`vidsight bench lmms-task`: a generated suite written as a local lmms-eval task, and the command to run it."""

from __future__ import annotations

import json
import shlex
import sys


def add_lmms_task_parser(bench_commands, common) -> None:
    from vidsight.models.paths import TASK_MODEL

    task = bench_commands.add_parser(
        "lmms-task", parents=[common],
        help="write a generated suite's clips as a local lmms-eval task and print the lmms-eval command")
    task.add_argument("--suite", default="smoke", help="suite name: default or smoke (default: smoke)")
    task.add_argument("--root", default="out/suites", help="where suites are generated (default: out/suites)")
    task.add_argument("--out", default="out/lmms-tasks", help="where the task folder goes (default: out/lmms-tasks)")
    task.add_argument("--model", default=str(TASK_MODEL), help=f"the checkpoint the printed command names "
                                                               f"(default: {TASK_MODEL})")
    task.add_argument("--multiple-choice", action="store_true",
                      help="write it as a multiple-choice task: lmms-eval ranks each question's choices by the "
                           "model's likelihood of them (vidsight's loglikelihood) instead of reading a generated answer")
    task.add_argument("--json", action="store_true", help="print the task's name, folder and command as JSON")
    from vidsight.api.bench import add_split_option

    add_split_option(task, "which seeds the suite is generated from")


def lmms_eval_command(task: str, folder: str, model: str, fps: float) -> list[str]:
    """The lmms-eval command that answers ``task`` as `vidsight bench accuracy` would (same sampling rate)."""
    return ["lmms-eval", "eval", "--model", "vidsight", "--model_args", f"pretrained={model},fps={fps:g}",
            "--tasks", task, "--include_path", folder, "--batch_size", "1"]


def run_lmms_task(args) -> int:
    from vidsight.api.lmms.task import task_name, write_task

    folder, fps = write_task(args.suite, args.root, args.out, progress=sys.stderr.isatty() and not args.json,
                             split=args.suite_split, multiple_choice=args.multiple_choice)
    name = task_name(args.suite, args.suite_split, args.multiple_choice)
    command = lmms_eval_command(name, str(folder), args.model, fps)
    if args.json:
        print(json.dumps({"task": name, "folder": str(folder), "command": command}))
    else:
        print(f"task {name} in {folder}; run it with:\n  {shlex.join(command)}")
    return 0

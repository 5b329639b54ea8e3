"""`vidsight`: the command-line tool."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import platform
import sys

from vidsight.api.ask_cli import add_ask_parser
from vidsight.api.bench import add_bench_parser
from vidsight.api.chat import add_chat_parser
from vidsight.api.config_file import FLAG, with_config_file
from vidsight.api.demo_cli import add_demo_parser
from vidsight.api.run_batch_cli import add_run_batch_parser
from vidsight.api.serve_cli import add_serve_parser
from vidsight.api.tools_cli import add_model_parser, add_probe_parser
from vidsight.api.train_cli import add_train_parser
from vidsight.api.watch import add_watch_parser
from vidsight._libraries import quiet_libraries
from vidsight.errors import ConfigError, VidsightError

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    """Each subcommand's flags come from its own module (torch-free: --help, flag errors and probe
    must start fast); each sets ``run``, the function that carries it out."""
    parser = argparse.ArgumentParser(prog="vidsight", description="Video understanding with vision-language models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action=_PrintVersion, nargs=0,
                        help="show vidsight's version and those of the libraries it runs on, and exit")
    # --debug is accepted after the subcommand too; SUPPRESS keeps it from resetting the global one.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logs")
    # Read before parsing (`with_config_file`); here for --help.
    common.add_argument(FLAG, metavar="FILE", help="YAML or JSON file of this command's settings by flag name "
                                                    "(fps: 2, max-new-tokens: 64); flags given here win")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (add_ask_parser, add_watch_parser, add_chat_parser, add_serve_parser, add_run_batch_parser,
                add_probe_parser, add_model_parser, add_bench_parser, add_train_parser, add_demo_parser):
        add(commands, [common])
    return parser


class _PrintVersion(argparse.Action):
    """``--version``: `version_line`, unwrapped (argparse's own action wraps it at the terminal's width)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def version_line() -> str:
    """vidsight's version and its libraries' (what a bug report needs), read from the installed
    packages' metadata: nothing heavy is imported."""
    import av

    def installed(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (f"vidsight {installed('vidsight')} (Python {platform.python_version()}; torch {installed('torch')}, "
            f"transformers {installed('transformers')}, PyAV {av.__version__} with FFmpeg {av.ffmpeg_version_info})")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        argv = with_config_file(parser, sys.argv[1:] if argv is None else list(argv))
    except ConfigError as exc:
        print(f"vidsight: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="vidsight: %(message)s")
    if not args.debug:
        quiet_libraries()
    try:
        return args.run(args)
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

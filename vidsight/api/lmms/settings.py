"""lmms-eval model arguments read as the command line's flags, so each setting has one definition.

``--model_args pretrained=...,rho=0.5,prune_tau=0.25`` sets what ``vidsight ask --rho 0.5
--prune-tau 0.25`` sets; with ``policy=...`` the arguments are ``vidsight chat``'s instead (a
retrieval policy, its thresholds, KV budgets). Types, ranges and choices are checked where the
flags define them.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from vidsight.errors import ConfigError

# Arguments the model takes itself, not settings of the command it borrows flags from.
OWN_ARGUMENTS = ("pretrained", "device", "stats_path", "batch_size", "max_batch_size")
# Flags of `ask` and `chat` that describe a command-line run, not a setting of the model's answers.
NOT_SETTINGS = {"model", "device", "json", "meter_memory", "questions", "realtime", "follow"}


class _RaisingParser(argparse.ArgumentParser):
    """Reports a bad argument as a `ConfigError` naming it, instead of printing usage and exiting."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        # Name arguments as model_args spells them: --kv-score -> kv_score.
        named = re.sub(r"--([a-z0-9-]+)", lambda m: m.group(1).replace("-", "_"), message)
        raise ConfigError(f"vidsight model_args: {named}")


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """What ``--model_args`` asked for.

    Attributes:
        mode: ``ask`` (one prefill of the whole video, QuickVideo's pipeline) or ``chat`` (the video
            streamed into a `ChatSession` under ``policy``, then the question).
        settings: The command's parsed flags by destination (``rho``, ``prune_tau``, ``policy`` ...).
    """

    mode: str
    settings: dict[str, Any]

    def namespace(self) -> argparse.Namespace:
        return argparse.Namespace(**self.settings)


def _command(mode: str) -> argparse.ArgumentParser:
    from vidsight.api.ask_cli import add_ask_parser
    from vidsight.api.chat import add_chat_parser

    commands = _RaisingParser(prog="vidsight").add_subparsers()
    (add_chat_parser if mode == "chat" else add_ask_parser)(commands, [])
    return commands.choices[mode]


def _flag(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    return [flag, str(value)]


def parse_model_args(arguments: dict[str, Any]) -> ModelSettings:
    """Model arguments (already split by lmms-eval, values typed or strings) to `ModelSettings`.

    Raises:
        ConfigError: An argument no flag of the command takes, or a value its flag refuses.
    """
    mode = "chat" if arguments.get("policy") is not None else "ask"
    argv = ["VIDEO"] + (["QUESTION"] if mode == "ask" else [])
    for name, value in arguments.items():
        if name in OWN_ARGUMENTS:
            continue
        if name in NOT_SETTINGS:
            raise ConfigError(f"vidsight model_args: {name} is not a setting of the model's answers")
        argv += _flag(name, value)
    parsed = vars(_command(mode).parse_args(argv))
    settings = {k: v for k, v in parsed.items() if k not in NOT_SETTINGS | {"video", "question", "source", "run"}}
    return ModelSettings(mode, settings)

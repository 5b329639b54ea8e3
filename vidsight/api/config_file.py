"""``--config FILE``: a command's settings from a YAML or JSON file, keyed by its flags' names.

``fps: 2`` or ``max-new-tokens: 64`` (a flag's name without its dashes, or with underscores);
``true`` gives a switch (``dedup-patches: true``), a list gives a repeatable flag each value
(``stop: ["\\n", "Q:"]``), a mapping gives a flag taking a JSON object
(``chat-template-kwargs: {enable_thinking: false}``). The file's settings become flags ahead of
the command line's, so every value is parsed and checked as the flag is, and a flag given on the
command line wins (vLLM's ``--config`` works the same way). Positional arguments (a video, a
question) stay on the command line.
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

from vidsight.api.options import json_object
from vidsight.errors import ConfigError

FLAG = "--config"


def with_config_file(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with the settings of its ``--config FILE`` (if any) as flags of the command they
    are given to, ahead of the command line's own; ``--config`` itself taken out."""
    path, argv = _take_config(argv)
    if path is None:
        return argv
    command, at = _command_parser(parser, argv)
    settings = _read(path)
    given = {token.split("=", 1)[0] for token in argv[at:] if token.startswith("--")}
    ahead, behind = [], []
    for key, value in settings.items():
        action = _action(command, key, path)
        flags = [flag for flag in action.option_strings if flag.startswith("--")]
        if any(flag in given for flag in action.option_strings):
            continue   # the command line's own value wins, a repeatable flag's included
        tokens = _tokens(flags[0], action, value, path, key)
        # A flag taking several values goes last, where it cannot swallow a positional argument.
        (behind if action.nargs in ("+", "*") else ahead).extend(tokens)
    return [*argv[:at], *ahead, *argv[at:], *behind]


def _take_config(argv: list[str]) -> tuple[str | None, list[str]]:
    rest, path = [], None
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            rest += [token, *tokens]
            break
        if token == FLAG or token.startswith(FLAG + "="):
            if path is not None:
                raise ConfigError(f"{FLAG} is given twice; give one settings file")
            path = token.split("=", 1)[1] if "=" in token else next(tokens, None)
            if not path:
                raise ConfigError(f"{FLAG} needs a file (YAML or JSON)")
            continue
        rest.append(token)
    return path, rest


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.ArgumentParser, int]:
    """The (sub)command's parser ``argv`` names and the index just past its name."""
    at = 0
    while True:
        commands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is None:
            return parser, at
        while at < len(argv) and argv[at].startswith("-"):
            at += 1
        if at == len(argv) or argv[at] not in commands.choices:
            raise ConfigError(f"{FLAG} sets a command's flags: name the command (vidsight ask --config FILE ...)")
        parser, at = commands.choices[argv[at]], at + 1


def _read(path: str) -> dict:
    file = Path(path)
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the settings file ({getattr(exc, 'strerror', None) or exc})") from None
    if file.suffix.lower() == ".json":
        try:
            settings = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    else:
        import yaml

        try:
            settings = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise ConfigError(f"{path}: a settings file holds a mapping of flag names to values, not a "
                          f"{type(settings).__name__}")
    return settings


def _action(command: argparse.ArgumentParser, key, path: str) -> argparse.Action:
    names = {}
    for action in command._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag not in (FLAG, "--help"):
                names[flag[2:]] = names[flag[2:].replace("-", "_")] = action
    if isinstance(key, str) and key.lstrip("-") in names:
        return names[key.lstrip("-")]
    close = difflib.get_close_matches(str(key), sorted({flag[2:] for a in names.values() for flag in a.option_strings
                                                        if flag.startswith("--")}), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(f"{path}: {key!r} is no setting of `{command.prog}`{hint}; `{command.prog} --help` lists them")


def _tokens(flag: str, action: argparse.Action, value, path: str, key) -> list[str]:
    def scalar(item) -> str:
        if isinstance(item, bool) or item is None or not isinstance(item, (str, int, float)):
            raise ConfigError(f"{path}: {key!r} takes a number or a text, not {item!r}")
        # Checked here as argparse will check it, so the error names the file, not only the flag.
        try:
            parsed = action.type(str(item)) if callable(action.type) else str(item)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: {key!r}: {exc or f'not a valid value: {item!r}'}") from None
        if action.choices is not None and parsed not in action.choices:
            raise ConfigError(f"{path}: {key!r} is one of {', '.join(map(str, action.choices))}, not {item!r}")
        return str(item)

    if isinstance(value, dict) and action.type is json_object:   # a mapping for a flag taking a JSON object
        return [flag, json.dumps(value)]
    if action.nargs == 0:   # a switch
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {key!r} is a switch: true or false, not {value!r}")
        return [flag] if value else []
    if isinstance(value, list):
        if isinstance(action, argparse._AppendAction):
            return [token for item in value for token in (flag, scalar(item))]
        if action.nargs in ("+", "*") and value:
            return [flag, *map(scalar, value)]
        raise ConfigError(f"{path}: {key!r} takes one value, not a list")
    return [flag, scalar(value)]

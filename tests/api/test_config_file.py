"""``--config FILE``: a YAML or JSON file's settings parse as the same flags would, the command
line's own flags win, and a bad file is refused naming it and the setting."""

import json

import pytest

from vidsight.api.cli import build_parser, main
from vidsight.api.config_file import with_config_file
from vidsight.errors import ConfigError

SETTINGS = {"fps": 2, "max-new-tokens": 64, "stop": ["\n", "Q:"], "dedup_patches": True, "skip-pruned": False,
            "prune-rule": "paper", "choices": ["red", "blue"], "temperature": 0.5}
FLAGS = ["--fps", "2", "--max-new-tokens", "64", "--stop", "\n", "--stop", "Q:", "--dedup-patches",
         "--prune-rule", "paper", "--choices", "red", "blue", "--temperature", "0.5"]


def parsed(argv: list[str]) -> dict:
    parser = build_parser()
    return vars(parser.parse_args(with_config_file(parser, argv)))


@pytest.fixture(params=["yaml", "json"])
def settings_file(request, tmp_path):
    def write(settings: dict):
        path = tmp_path / f"settings.{request.param}"
        if request.param == "json":
            path.write_text(json.dumps(settings))
        else:
            import yaml

            path.write_text(yaml.safe_dump(settings))
        return str(path)
    return write


def test_a_files_settings_parse_as_the_flags_do(settings_file):
    path = settings_file(SETTINGS)
    from_file = parsed(["ask", "v.mp4", "what?", "also?", "--config", path])
    assert from_file == parsed(["ask", "v.mp4", "what?", "also?", *FLAGS])
    assert from_file["question"] == ["what?", "also?"]   # the choices list did not swallow the questions
    assert from_file["fps"] == 2.0 and from_file["stop"] == ["\n", "Q:"] and from_file["dedup_patches"]


def test_a_mapping_gives_a_flag_taking_a_json_object(settings_file):
    path = settings_file({"chat-template-kwargs": {"enable_thinking": False, "note": "a, b"}})
    kwargs = {"enable_thinking": False, "note": "a, b"}
    assert parsed(["ask", "v.mp4", "q", "--config", path]) == parsed(
        ["ask", "v.mp4", "q", "--chat-template-kwargs", json.dumps(kwargs)])
    assert parsed(["serve", "--config", settings_file({"default-chat-template-kwargs": kwargs})])[
        "default_chat_template_kwargs"] == kwargs
    with pytest.raises(ConfigError, match="'fps' takes a number or a text"):
        parsed(["ask", "v.mp4", "q", "--config", settings_file({"fps": {"a": 1}})])


def test_the_command_lines_flags_win(settings_file):
    path = settings_file(SETTINGS)
    args = parsed(["ask", "--fps", "4", "v.mp4", "q", "--config", path, "--stop=A", "--choices", "green"])
    assert args["fps"] == 4.0 and args["stop"] == ["A"] and args["choices"] == ["green"]
    assert args["max_new_tokens"] == 64


def test_a_subcommands_file_reaches_its_own_flags(settings_file):
    path = settings_file({"suite": "smoke", "json": True, "group-frames": 8})
    args = parsed(["bench", "accuracy", f"--config={path}"])
    assert (args["suite"], args["json"], args["group_frames"]) == ("smoke", True, 8)


def test_without_a_file_nothing_changes():
    argv = ["ask", "v.mp4", "q", "--fps", "3"]
    assert with_config_file(build_parser(), argv) == argv


@pytest.mark.parametrize("content,said", [
    ("fsp: 2\n", r"'fsp' is no setting of `vidsight ask` \(did you mean fps\?\)"),
    ("json: 3\n", "'json' is a switch: true or false, not 3"),
    ("fps: [1, 2]\n", "'fps' takes one value, not a list"),
    ("fps: {a: 1}\n", r"'fps' takes a number or a text, not \{'a': 1\}"),
    ("stop: [null]\n", "'stop' takes a number or a text, not None"),
    ("- fps\n", "a mapping of flag names to values, not a list"),
    ("fps: [2\n", "not valid YAML"),
    ("fps: fast\n", "'fps': not a number: 'fast'"),
    ("max-new-tokens: 2.5\n", "'max-new-tokens': invalid literal for int"),
    ("prune-rule: median\n", "'prune-rule' is one of persistent, paper, max, not 'median'"),
])
def test_a_bad_file_is_refused_naming_it_and_the_setting(tmp_path, content, said):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=said) as refused:
        with_config_file(build_parser(), ["ask", "v.mp4", "q", "--config", str(path)])
    assert str(refused.value).startswith(str(path))


def test_misplaced_missing_or_repeated_files_are_refused(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text("{not json")
    for argv, said in [(["--config", str(path)], "name the command"),
                       (["ask", "v", "q", "--config"], "needs a file"),
                       (["ask", "v", "q", "--config", "a.yaml", "--config", "b.yaml"], "given twice"),
                       (["ask", "v", "q", "--config", str(tmp_path / "none.yaml")], "cannot read the settings file"),
                       (["ask", "v", "q", "--config", str(path)], "not valid JSON")]:
        assert main(argv) == 2
        assert said in capsys.readouterr().err

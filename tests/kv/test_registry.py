"""The policy registry: a new policy is one file plus one `register` line, and its flags follow."""

import argparse

import pytest

from vidsight.api.options import add_policy_options, foreign_policy_flags, policy_settings
from vidsight.errors import ConfigError
from vidsight.kv.policies import registry
from vidsight.kv.policies.configs import MosaicConfig, ReKVConfig

from tests.kv.strided_policy import StridedConfig
from tests.kv.test_policy_reference import Recording, check_against_definition


@pytest.fixture
def with_strided(monkeypatch):
    monkeypatch.setattr(registry, "POLICIES", dict(registry.POLICIES))
    registry.register("strided", "tests.kv.strided_policy:StridedPolicy", StridedConfig)


def parse(argv):
    parser = argparse.ArgumentParser()
    add_policy_options(parser)
    return parser.parse_args(argv)


def test_flags_and_their_defaults_come_from_the_configs():
    flags = registry.policy_flags()
    assert flags["--top-frames"].field == "top_frames"
    assert [name for name, _, _ in flags["--local-tokens"].policies] == ["rekv", "mosaic", "resv"]
    assert f"default: {ReKVConfig.top_frames}" in flags["--top-frames"].help
    assert f"{MosaicConfig.visual_tau}" in flags["--visual-tau"].help
    args = parse(["--top-frames", "3", "--no-prefetch"])
    settings = policy_settings(args)
    assert settings["rekv"] == {"top_frames": 3} and settings["mosaic"] == {"top_frames": 3, "prefetch": False}
    assert settings["resv"] == {"prefetch": False} and settings["full"] == {}
    assert foreign_policy_flags(args, "resv") == ["--top-frames"]


def test_a_new_policy_is_one_file_and_one_register_line(with_strided, ask_along, frames, tiny_adapter, monkeypatch):
    from vidsight.engine import GenerationConfig
    from vidsight.engine.chat import ChatConfig, ChatSession

    assert registry.policy_flags()["--stride"].policies[0][0] == "strided"
    assert "strided" in [name for name, _, _ in registry.policy_flags()["--local-tokens"].policies]
    args = parse(["--stride", "3"])
    policy = registry.make_policy("strided", **policy_settings(args)["strided"])
    assert policy.config.stride == 3
    answers, _ = ask_along(tiny_adapter, frames[:12], policy)
    assert all(a.stats.attended_tokens < a.stats.cached_tokens for a in answers[1:])
    session = ChatSession(tiny_adapter, Recording(policy), ChatConfig(fps=2.0))
    seen = check_against_definition(monkeypatch, session, session.policy)
    session.push(frames[:12])
    session.ask("What colour is the square?", GenerationConfig(max_new_tokens=2))
    assert seen["checked"] > 0 and seen["dropped"] > 0
    with pytest.raises(ConfigError, match="stride must be positive"):
        registry.make_policy("strided:stride=0")


def test_labels_and_settings_are_checked():
    assert registry.make_policy("rekv:top_frames=2,rotated=true").config == ReKVConfig(top_frames=2, rotated=True)
    for label, message in [("nope", "unknown KV policy"), ("full:x=1", "takes no settings"),
                           ("rekv:top_frames=two", "takes a int"), ("rekv:speed=1", "expected field=value"),
                           ("rekv:rotated=maybe", "true or false")]:
        with pytest.raises(ConfigError, match=message):
            registry.make_policy(label)

"""A completion request's video settings map onto the same configs as `vidsight ask`'s flags."""

import pytest

from vidsight.api.cli import build_parser
from vidsight.api.serve.media import RequestError
from vidsight.api.serve.openai_api import ChatCompletionRequest
from vidsight.api.settings import ask_configs
from vidsight.errors import ConfigError


def request(**settings) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}],
                                 mm_processor_kwargs=settings)


@pytest.mark.parametrize("settings,flags", [
    ({}, []),
    ({"rho": 0.5, "kv_score": "attention", "prune_start_layer": 1}, ["--rho", "0.5", "--kv-score", "attention",
                                                                     "--prune-start-layer", "1"]),
    ({"prune_tau": 0.25}, ["--prune-tau", "0.25"]),
    ({"prune_tau": 1.0, "prune_alpha": 0.004, "prune_rule": "paper", "dedup_patches": True},
     ["--prune-tau", "1", "--prune-alpha", "0.004", "--prune-rule", "paper", "--dedup-patches"]),
])
def test_request_settings_give_the_prefill_the_cli_flags_give(settings, flags):
    _, _, prefill = ask_configs(request(**settings).ask_options())
    assert prefill == ask_configs(vars(build_parser().parse_args(["ask", "v.mp4", "q", *flags])))[2]


def test_a_requests_generation_fields_give_the_config_the_ask_flags_give():
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], max_tokens=7,
                                 temperature=0.5, top_p=0.9, top_k=20, min_p=0.05, min_tokens=2, ignore_eos=True,
                                 seed=3, stop=["\n", "Q:"], stop_token_ids=[9, 4], include_stop_str_in_output=True,
                                 repetition_penalty=1.1,
                                 frequency_penalty=0.5, presence_penalty=1.5, logprobs=True, top_logprobs=3,
                                 response_format={"type": "text"}, tools=[], logit_bias={"42": -100, " 7": 2.5})
    flags = ["--max-new-tokens", "7", "--temperature", "0.5", "--top-p", "0.9", "--top-k", "20", "--min-p", "0.05",
             "--min-tokens", "2", "--ignore-eos", "--seed", "3", "--stop", "\n", "--stop", "Q:",
             "--stop-token-id", "9", "--stop-token-id", "4", "--include-stop-str-in-output",
             "--repetition-penalty", "1.1", "--frequency-penalty", "0.5", "--presence-penalty", "1.5",
             "--logprobs", "3", "--logit-bias", "7=2.5", "--logit-bias", "42=-100"]
    _, generation, _ = ask_configs(body.ask_options())
    assert generation == ask_configs(vars(build_parser().parse_args(["ask", "v.mp4", "q", *flags])))[1]
    assert generation.stop == ("\n", "Q:") and generation.repetition_penalty == 1.1
    assert generation.top_k == 20 and generation.min_p == 0.05 and generation.min_tokens == 2 and generation.ignore_eos
    assert generation.logit_bias == ((7, 2.5), (42, -100.0)) and generation.stop_token_ids == (9, 4)
    assert generation.include_stop_str_in_output
    off = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], top_k=-1)
    assert ask_configs(off.ask_options())[1].top_k == 0   # vLLM's "no top-k"


def test_an_unknown_motion_rule_is_refused():
    with pytest.raises(ConfigError, match="unknown motion rule"):
        ask_configs(request(prune_tau=0.25, prune_rule="median").ask_options())


def test_a_misspelt_setting_is_refused():
    with pytest.raises(RequestError, match="unknown video settings: prune_ta"):
        request(prune_ta=0.25).ask_options()


@pytest.mark.parametrize("body,flags,catch_up", [({}, [], True), ({"catch_up": False}, ["--every-window"], False)])
def test_a_watch_body_and_the_watch_flags_give_the_same_config(body, flags, catch_up):
    from vidsight.api.serve.watch_routes import WatchRequest
    from vidsight.api.settings import watch_config

    served = watch_config(WatchRequest(source="cam", query="q", **body).model_dump())
    assert served == watch_config(vars(build_parser().parse_args(["watch", "cam", "--query", "q", *flags])))
    assert served.catch_up is catch_up


def test_a_session_body_and_the_chat_flags_give_the_same_system_message():
    from vidsight.api.serve.session_routes import SessionRequest
    from vidsight.api.settings import chat_configs

    body = SessionRequest(source="cam", system="You watch a shop's camera.").model_dump()
    config, _ = chat_configs({name: body[name] for name in ("fps", "batch_patches", "system")})
    assert config == chat_configs(vars(build_parser().parse_args(["chat", "cam", "--system", body["system"]])))[0]
    assert config.system == "You watch a shop's camera."


@pytest.mark.parametrize("fields,settings", [
    ({}, {}),
    ({"response_format": {"type": "text"}}, {}),
    ({"response_format": {"type": "json_object"}}, {"answer_schema": '{"type": "object"}', "compact_json": False}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}},
     {"answer_schema": '{"type": "integer"}', "compact_json": False}),
    ({"structured_outputs": {"json": '{"type": "integer"}', "disable_any_whitespace": True}},
     {"answer_schema": '{"type": "integer"}', "compact_json": True}),
    ({"structured_outputs": {"json_object": True}}, {"answer_schema": '{"type": "object"}', "compact_json": False}),
    ({"structured_outputs": {"regex": "a+"}}, {"answer_regex": "a+", "compact_json": False}),
    ({"guided_grammar": "start: /a+/"}, {"answer_grammar": "start: /a+/", "compact_json": False}),
    ({"guided_json": {"type": "integer"}}, {"answer_schema": '{"type": "integer"}', "compact_json": False}),
])
def test_each_spelling_of_an_answer_format_gives_the_flags_setting(fields, settings):
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], **fields)
    options = body.ask_options()
    assert {k: options[k] for k in options if k.startswith("answer_") or k == "compact_json"} == settings
    flags = {"answer_schema": "--answer-schema", "answer_regex": "--answer-regex", "answer_grammar": "--answer-grammar"}
    given = [token for name, value in settings.items() if name in flags for token in (flags[name], value)]
    given += ["--compact-json"] if settings.get("compact_json") else []
    cli = ask_configs(vars(build_parser().parse_args(["ask", "v.mp4", "q", *given])))[1]
    assert ask_configs(options)[1] == cli


@pytest.mark.parametrize("fields,said", [
    ({"response_format": {"type": "json_schema"}}, "needs 'json_schema'"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "one answer format at most"),
    ({"structured_outputs": {"regex": "a", "grammar": "start: /a/"}}, "one answer format at most"),
    ({"structured_outputs": {"regex": 3}}, "structured_outputs.regex must be a text"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "whitespace_pattern is not supported"),
    ({"guided_json": 3}, "guided_json must be a JSON schema"),
])
def test_malformed_answer_formats_are_refused(fields, said):
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], **fields)
    with pytest.raises(RequestError, match=said):
        body.ask_options()


def test_a_clip_is_asked_for_by_qwens_names_or_the_flags_names():
    """qwen-vl-utils' ``video_start``/``video_end`` (or ``start_s``/``end_s``), in
    ``mm_processor_kwargs`` or ``media_io_kwargs.video``, give the sampling ``ask --start --end`` gives."""
    flags = vars(build_parser().parse_args(["ask", "v.mp4", "q", "--start", "60", "--end", "90.5"]))
    sampling = ask_configs(flags)[0]
    assert (sampling.start_s, sampling.end_s) == (60.0, 90.5)
    for given in ({"mm_processor_kwargs": {"video_start": 60, "video_end": 90.5}},
                  {"media_io_kwargs": {"video": {"start_s": 60, "end_s": 90.5}}}):
        body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], **given)
        assert ask_configs(body.ask_options())[0] == sampling
    with pytest.raises(ConfigError, match=r"the clip's end \(10 s\) must come after its start \(60 s\)"):
        ask_configs(request(video_start=60, video_end=10).ask_options())


def test_pixel_bounds_are_asked_for_by_the_processors_names_or_the_flags():
    """vLLM's ``mm_processor_kwargs`` ``min_pixels``/``max_pixels`` (and qwen-vl-utils'
    ``total_pixels``) give the sampling ``ask --min-pixels --max-pixels --total-pixels`` gives."""
    flags = ["--min-pixels", "3136", "--max-pixels", "200704", "--total-pixels", "20070400"]
    sampling = ask_configs(vars(build_parser().parse_args(["ask", "v.mp4", "q", *flags])))[0]
    assert sampling.pixel_bounds == {"min_pixels": 3136, "max_pixels": 200704, "total_pixels": 20070400}
    given = request(min_pixels=3136, max_pixels=200704, total_pixels=20070400)
    assert ask_configs(given.ask_options())[0] == sampling
    with pytest.raises(ConfigError, match="max_pixels must be a whole number of pixels"):
        ask_configs(request(max_pixels=-5).ask_options())


def test_a_session_message_takes_the_servers_sampling_defaults_unless_it_gives_its_own():
    from vidsight.api.serve.session_routes import MessageRequest

    defaults = {"temperature": 0.7, "top_k": 20, "max_new_tokens": 300}
    plain = MessageRequest(question="q").generation(defaults)   # its max_tokens has a default of its own, 64
    assert (plain.temperature, plain.top_k, plain.max_new_tokens) == (0.7, 20, 64)
    own = MessageRequest(question="q", temperature=0.0, max_tokens=5).generation(defaults)
    assert (own.temperature, own.top_k, own.max_new_tokens) == (0.0, 20, 5)
    assert MessageRequest(question="q").generation({}).temperature == 0.0   # vidsight's own: greedy

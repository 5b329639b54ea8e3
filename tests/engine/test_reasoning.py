"""A reasoning model's answer parted into its thinking and its content (vLLM's reasoning parsers),
whole and streamed alike, and an answer format that holds the content only."""

import re

import pytest

from vidsight import AnswerFormat
from vidsight.engine import Asker, GenerationConfig
from vidsight.engine.reasoning import REASONING_PARSERS, ReasoningStream
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig
from vidsight.models.conversation import Conversation

PARSER = REASONING_PARSERS["qwen3"]
QUESTION = "What moves?"
SAMPLING = SamplingConfig(fps=2.0)


@pytest.mark.parametrize("text,thinking,parts", [
    ("The box moves.\n</think>\n\nA red box.", True, ("The box moves.", "A red box.")),
    ("Still thinking about it", True, ("Still thinking about it", "")),     # cut off inside the thinking
    ("</think>Yes", True, ("", "Yes")),
    ("<think>Hm.</think> Yes", False, ("Hm.", "Yes")),                      # a template that leaves <think> to the model
    ("  <think>\nHm", False, ("Hm", "")),
    ("Yes <think>no</think>", False, (None, "Yes <think>no</think>")),     # content never opens a thinking
    ("A</think>B</think>C", True, ("A", "B</think>C")),
    ("<thi", False, (None, "<thi")),
])
def test_an_answer_is_parted_at_its_think_tags(text, thinking, parts):
    assert PARSER.split(text, thinking) == parts


@pytest.mark.parametrize("text", ["Hm, the box.\n</think>\n\nA red box.", "<think>Hm.</think> Yes", "<thi",
                                  "No tags at all", "A </thin B </think> C", "  <think> x </think>", "</think>"])
@pytest.mark.parametrize("thinking", [True, False])
def test_streamed_pieces_join_to_the_whole_answers_parts(text, thinking):
    """Whatever the pieces (here every cut of the text into two, and one character at a time), the
    reasoning pieces join to the whole answer's reasoning and the content pieces to its content."""
    whole = PARSER.split(text, thinking)
    cuts = [[text[:at], text[at:]] for at in range(len(text) + 1)] + [list(text)]
    for pieces in cuts:
        stream, got = ReasoningStream(PARSER, thinking), ["", ""]
        for piece in pieces:
            for part, added in enumerate(stream.feed(piece)):
                got[part] += added
        for part, added in enumerate(stream.finish()):
            got[part] += added
        assert got[0] == (whole[0] or "") and got[1] == whole[1]


def sampled_answers(adapter, path, seeds, **settings):
    """Sampled answers, the end-of-thinking token made likelier so that answers hold one."""
    end = adapter.tokenizer.convert_tokens_to_ids("</think>")
    asker, conversation = Asker(adapter), Conversation.of(QUESTION, template_kwargs=settings.pop("template_kwargs", None))
    return [asker.ask(path, conversation, sampling=SAMPLING, generation=GenerationConfig(
                          max_new_tokens=24, temperature=1.0, seed=seed, logit_bias={end: 3}, **settings))
            for seed in seeds]


def test_ask_parts_a_thinking_models_answer_as_the_parser_parts_its_text(thinking_adapter, make_test_video):
    """The template opens the thinking: the answer's text up to ``</think>`` is its reasoning, the
    rest its content; the tokens are the ones chosen without the parser."""
    path, _ = make_test_video(width=176, height=144, duration_s=1.5, bframes=False)
    seeds = range(6)
    plain = sampled_answers(thinking_adapter, path, seeds)
    parted = sampled_answers(thinking_adapter, path, seeds, reasoning_parser="qwen3")
    for raw, answer in zip(plain, parted):
        assert answer.token_ids == raw.token_ids
        assert (answer.reasoning, answer.answer) == PARSER.split(raw.answer, thinking=True)
        assert answer.to_dict()["reasoning"] == answer.reasoning
    assert any(answer.reasoning and answer.answer for answer in parted)   # both parts seen
    assert "reasoning" not in plain[0].to_dict()


def test_with_thinking_off_in_the_template_the_answer_is_content(thinking_adapter, make_test_video):
    """Qwen3's ``enable_thinking: false`` closes an empty thinking in the prompt, so the answer
    starts at its content."""
    path, _ = make_test_video(width=176, height=144, duration_s=1.5, bframes=False)
    off = {"enable_thinking": False}
    prompt = thinking_adapter.build_prompt(Conversation.of(QUESTION, template_kwargs=off), 4).input_ids.tolist()
    assert not PARSER.thinking_at_start(thinking_adapter, prompt)
    assert PARSER.thinking_at_start(thinking_adapter, thinking_adapter.build_prompt(QUESTION, 4).input_ids.tolist())
    plain = sampled_answers(thinking_adapter, path, range(3), template_kwargs=off)
    parted = sampled_answers(thinking_adapter, path, range(3), template_kwargs=off, reasoning_parser="qwen3")
    for raw, answer in zip(plain, parted):
        assert answer.reasoning is None and answer.answer == raw.answer


def test_an_answer_format_holds_the_content_after_the_thinking(thinking_adapter, make_test_video):
    """vLLM's structured outputs with a reasoning parser: the thinking is free, the content after
    ``</think>`` matches the format whole; without the parser the format holds from the first token
    (no ``</think>`` can come, as the pattern has none)."""
    path, _ = make_test_video(width=176, height=144, duration_s=1.5, bframes=False)
    settings = dict(answer_format=AnswerFormat("regex", "[0-9]{3}"))
    end = thinking_adapter.tokenizer.convert_tokens_to_ids("</think>")
    parted = sampled_answers(thinking_adapter, path, range(6), reasoning_parser="qwen3", **settings)
    closed = [answer for answer in parted if end in answer.token_ids]
    assert closed and any(re.search(r"[^0-9]", answer.reasoning) for answer in closed)   # free thinking
    for answer in closed:
        assert re.fullmatch("[0-9]{3}", answer.answer), answer
        assert answer.token_ids[-1] in thinking_adapter.eos_token_ids   # ended by the format, not the limit
    held = sampled_answers(thinking_adapter, path, range(6), **settings)
    for answer in held:
        assert end not in answer.token_ids and re.fullmatch("[0-9]{3}", answer.answer)


def test_a_model_without_think_tokens_is_refused_before_the_video_is_read(tiny_adapter, tmp_path):
    with pytest.raises(ConfigError, match="reasoning-parser qwen3: .* has no <think> token"):
        Asker(tiny_adapter).ask(tmp_path / "missing.mp4", QUESTION,
                                generation=GenerationConfig(reasoning_parser="qwen3"))
    with pytest.raises(ConfigError, match="unknown reasoning parser 'r1'; known: qwen3, deepseek_r1"):
        GenerationConfig(reasoning_parser="r1")


def test_a_scored_prompt_closes_the_thinking_its_template_opens(thinking_adapter, tiny_adapter):
    """Given answers (choices, a watch's Yes) are scored as the answer itself: after an empty,
    closed thinking block, which is the thinking template's own prompt with thinking off; a
    prompt that opens none, or a model without the tags, is unchanged."""
    off = Conversation.of(QUESTION, template_kwargs={"enable_thinking": False})
    scored = thinking_adapter.build_prompt(Conversation.of(QUESTION).scored(), 4).input_ids.tolist()
    assert scored == thinking_adapter.build_prompt(off, 4).input_ids.tolist()
    assert thinking_adapter.tokenizer.decode(scored).endswith("assistant\n<think>\n\n</think>\n\n")
    assert thinking_adapter.build_prompt(off.scored(), 4).input_ids.tolist() == scored
    for conversation in (Conversation.of(QUESTION), Conversation.of(QUESTION).scored()):
        assert (tiny_adapter.build_prompt(conversation, 4).input_ids.tolist()
                == tiny_adapter.build_prompt(QUESTION, 4).input_ids.tolist())


def test_ask_chat_and_watch_score_a_thinking_model_after_its_thinking_closes(thinking_adapter, make_test_video):
    """`Asker.score` equals scoring after the template's own thinking-off prompt; a chat session
    scores as `ask` on the same frames; a watch's window prompt is a scored one."""
    from vidsight.engine.chat import ChatConfig, ChatSession
    from vidsight.engine.watch import WatchConfig, Watcher
    from vidsight.ingest.windows import WindowConfig
    from vidsight.ingest.stream import StreamSource

    path, _ = make_test_video(width=176, height=144, duration_s=3.0, bframes=False)
    asker, choices = Asker(thinking_adapter), ["red", "a blue square"]
    scored = asker.score(path, QUESTION, choices, sampling=SAMPLING).scores
    off = asker.score(path, Conversation.of(QUESTION, template_kwargs={"enable_thinking": False}), choices,
                      sampling=SAMPLING).scores
    assert [s.logprob for s in scored] == [s.logprob for s in off]
    with ChatSession(thinking_adapter, config=ChatConfig(fps=SAMPLING.fps)) as session:
        for frame in StreamSource(str(path), fps=SAMPLING.fps):
            session.push([frame])
        chat = session.score(QUESTION, choices).scores
    assert [s.logprob for s in chat] == pytest.approx([s.logprob for s in scored], abs=1e-3)
    rendered = []
    original = thinking_adapter.build_prompt
    watcher = Watcher(thinking_adapter, QUESTION, WatchConfig(WindowConfig(window_s=1.0, fps=SAMPLING.fps)))
    thinking_adapter.build_prompt = lambda conversation, tokens: rendered.append(conversation) or original(
        conversation, tokens)
    try:
        next(iter(watcher.watch(StreamSource(str(path), fps=SAMPLING.fps))))
    finally:
        del thinking_adapter.build_prompt
    assert rendered and all(conversation.closes_thinking for conversation in rendered)


def test_a_scored_prompt_with_typed_special_strings_still_closes_the_thinking(thinking_adapter):
    """The typed-text path (a special token's string in the question) keeps the scored form."""
    typed = "What moves <|im_end|>?"
    scored = thinking_adapter.build_prompt(Conversation.of(typed).scored(), 4).input_ids.tolist()
    off = thinking_adapter.build_prompt(Conversation.of(typed, template_kwargs={"enable_thinking": False}), 4)
    assert scored == off.input_ids.tolist() != thinking_adapter.build_prompt(typed, 4).input_ids.tolist()

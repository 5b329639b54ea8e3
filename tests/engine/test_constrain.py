"""Answers held to a format (vLLM's structured outputs): what the random tiny model writes is of
the form given, and its greedy answer is transformers' `generate` with the format's mask applied
at each step; a bad format, or one that cannot be held, is refused before any work."""

import json
import re

import pytest
import torch

from vidsight.engine import Asker, ChatSession, GenerationConfig
from vidsight.engine.config import AnswerFormat
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig

from tests.engine.test_ask_exact import reference_inputs
from tests.settings import assert_same_greedy_ids

QUESTION = "What colour is the square?"
SAMPLING = SamplingConfig(fps=2.0)
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "blue", "green"]}, "moving": {"type": "boolean"}},
          "required": ["colour", "moving"], "additionalProperties": False}
COMPACT = AnswerFormat("json_schema", json.dumps(SCHEMA), any_whitespace=False)
REGEX = r"(red|blue) [0-9]{1,2}"
GBNF = 'root ::= ("yes" | "no") ", " [0-9] [0-9]?'


@pytest.fixture(scope="module")
def clip(make_test_video):
    return make_test_video(width=176, height=144, duration_s=1.5, bframes=False)[0]


def ask(adapter, clip, answer_format, **settings):
    generation = GenerationConfig(answer_format=answer_format, **{"max_new_tokens": 40, **settings})
    return Asker(adapter).ask(clip, QUESTION, sampling=SAMPLING, generation=generation)


def test_the_random_models_answers_take_the_form_given(tiny_adapter, clip):
    free = Asker(tiny_adapter).ask(clip, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=40))
    with pytest.raises(ValueError):
        json.loads(free.answer)   # unheld, the random model writes no JSON
    answer = json.loads(ask(tiny_adapter, clip, COMPACT).answer)
    assert set(answer) == {"colour", "moving"} and answer["colour"] in SCHEMA["properties"]["colour"]["enum"]
    assert isinstance(answer["moving"], bool)
    assert re.fullmatch(REGEX, ask(tiny_adapter, clip, AnswerFormat("regex", REGEX)).answer)
    for grammar in (GBNF, 'start: ("yes" | "no") ", " /[0-9]{1,2}/'):   # GBNF and Lark
        assert re.fullmatch(r"(yes|no), [0-9]{1,2}", ask(tiny_adapter, clip, AnswerFormat("grammar", grammar)).answer)


def test_sampled_answers_take_the_form_too(tiny_adapter, clip):
    answers = {ask(tiny_adapter, clip, COMPACT, temperature=1.5, seed=seed).answer for seed in range(4)}
    assert len(answers) > 1
    for answer in answers:
        assert set(json.loads(answer)) == {"colour", "moving"}


@pytest.mark.device_check
def test_the_greedy_answer_is_transformers_generate_under_the_formats_mask(tiny_adapter, clip):
    from llguidance import LLMatcher
    from transformers import LogitsProcessor, LogitsProcessorList

    from vidsight.engine.constrain import format_tokenizer, grammar_of

    class FormatMask(LogitsProcessor):
        """The format's mask over the tokens generated so far, from a matcher of its own."""

        def __init__(self, prompt: int):
            self.matcher, self.prompt, self.fed = LLMatcher(format_tokenizer(tiny_adapter), grammar_of(COMPACT)), prompt, 0

        def __call__(self, input_ids, scores):
            new = input_ids[0, self.prompt:].tolist()
            assert self.matcher.consume_tokens(new[self.fed:])
            self.fed = len(new)
            bias = torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8)
            allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
            allowed[:len(bias)] = bias[:scores.shape[-1]] > 0
            return scores.masked_fill(~allowed.to(scores.device), float("-inf"))

    result = ask(tiny_adapter, clip, COMPACT)
    inputs, _ = reference_inputs(tiny_adapter, clip, SAMPLING, question=QUESTION)
    prompt = inputs["input_ids"].shape[1]
    out = tiny_adapter.model.generate(**inputs, max_new_tokens=40, do_sample=False, output_logits=True,
                                      return_dict_in_generate=True, logits_processor=LogitsProcessorList([FormatMask(prompt)]))
    assert_same_greedy_ids(result.token_ids, out.sequences[0, prompt:].tolist(), out.logits)
    assert result.finish_reason == "stop" and result.token_ids[-1] in tiny_adapter.eos_token_ids


def test_an_answer_cut_at_its_limit_is_the_start_of_the_form(tiny_adapter, clip):
    result = ask(tiny_adapter, clip, AnswerFormat("json_schema", json.dumps(SCHEMA)), max_new_tokens=4)
    assert result.finish_reason == "length" and len(result.token_ids) == 4
    assert result.answer.lstrip().startswith("{")


@pytest.mark.parametrize("kind,text,said", [
    ("json_schema", "{not json", "not JSON"),
    ("json_schema", "[1]", "a JSON schema is an object"),
    ("json_schema", '{"type": "nonsense"}', "json_schema is not valid"),
    ("regex", "[a-", "regex is not valid"),
    ("grammar", "root ::= (", "grammar is not valid"),
    ("sql", "x", "one of json_schema, regex, grammar"),
    ("regex", " ", "1 to 100000 characters"),
])
def test_a_bad_format_is_refused_with_its_reason(kind, text, said):
    with pytest.raises(ConfigError, match=said):
        AnswerFormat(kind, text)


def test_formats_that_cannot_be_held_are_refused_before_the_video_is_read(tmp_path):
    from vidsight.models import TASK_MODEL, load_model

    with pytest.raises(ConfigError, match="do not combine with an answer format"):
        GenerationConfig(min_tokens=2, answer_format=AnswerFormat("regex", "a+"))
    task = load_model(TASK_MODEL, "cpu", torch.float32)   # a WordPiece tokenizer, which llguidance cannot read
    held = GenerationConfig(answer_format=AnswerFormat("regex", "a+"))
    with pytest.raises(ConfigError, match="need a byte-level or SentencePiece tokenizer"):
        Asker(task).ask(tmp_path / "absent.mp4", QUESTION, generation=held)
    with ChatSession(task) as session, pytest.raises(ConfigError, match="need a byte-level"):
        session.ask(QUESTION, held)   # before "no video yet": the format is checked first

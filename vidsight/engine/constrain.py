"""Answers held to a form (`AnswerFormat`: a JSON schema, a regular expression, a grammar), as
vLLM's structured outputs hold them, through llguidance (one of vLLM's structured-output
backends): at each step the tokens that would leave the answer no longer a prefix of a text of
the form are masked out before a token is chosen, and the end token is allowed only once the
answer is whole.
"""

from __future__ import annotations

import json
import weakref

import torch

from vidsight.engine.config import AnswerFormat
from vidsight.engine.reasoning import REASONING_PARSERS
from vidsight.errors import ConfigError, ModelError

# Per tokenizer, its llguidance form by end tokens: built once (about a second for a 150,000-token
# vocabulary), dropped with the tokenizer.
_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grammar_of(answer_format: AnswerFormat) -> str:
    """The format as llguidance's grammar."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if answer_format.kind == "regex":
        return LLMatcher.grammar_from_regex(answer_format.text)
    if answer_format.kind == "grammar":
        return LLMatcher.grammar_from_lark(any_to_lark(answer_format.text))   # GBNF is converted, Lark kept
    try:
        schema = json.loads(answer_format.text)
    except ValueError as exc:
        raise ConfigError(f"the answer's JSON schema is not JSON ({exc})") from None
    if not isinstance(schema, (dict, bool)):
        raise ConfigError(f"a JSON schema is an object (or true), not {type(schema).__name__}")
    options = {} if answer_format.any_whitespace else {"whitespace_flexible": False}
    return LLMatcher.grammar_from_json_schema(schema, overrides=options)


def check_format(answer_format: AnswerFormat) -> None:
    """Refuse a format llguidance cannot compile, with its reason, before any work is done."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import GbnfToLarkError

    try:
        grammar = grammar_of(answer_format)
    except (ValueError, GbnfToLarkError) as exc:   # a schema or GBNF grammar that does not even parse
        raise ConfigError(f"the answer's {answer_format.kind} is not valid: {exc}") from None
    problem = LLMatcher.validate_grammar(grammar)
    if problem:
        raise ConfigError(f"the answer's {answer_format.kind} is not valid: {' '.join(problem.split())}")


def format_tokenizer(adapter):
    """``adapter``'s tokenizer as llguidance reads it (built once per tokenizer); refused with a
    `ConfigError` where llguidance cannot read it, before any work is done."""
    from llguidance.hf import from_tokenizer

    built = _TOKENIZERS.setdefault(adapter.tokenizer, {})
    ends = tuple(sorted(adapter.eos_token_ids))
    if ends not in built:
        try:
            built[ends] = from_tokenizer(adapter.tokenizer, eos_token=list(ends))
        except ValueError as exc:   # a tokenizer llguidance cannot read (a WordPiece one, say)
            raise ConfigError(f"{adapter.name}: answer formats need a byte-level or SentencePiece tokenizer "
                              f"({exc})") from None
    return built[ends]


def check_generation(adapter, generation) -> None:
    """Refuse a `GenerationConfig` whose answer format ``adapter``'s tokenizer cannot hold, whose
    thinking tags it lacks, or whose logit biases or stop tokens name tokens it does not have, before the video
    is read (the matcher itself is made at the answer's first token)."""
    if generation.answer_format is not None:
        format_tokenizer(adapter)
    if generation.reasoning_parser is not None:
        REASONING_PARSERS[generation.reasoning_parser].tag_ids(adapter)
    for name, ids in (("logit_bias", [token for token, _ in generation.logit_bias]),
                      ("stop_token_ids", generation.stop_token_ids)):
        unknown = [token for token in ids if token >= len(adapter.tokenizer)]
        if unknown:
            raise ConfigError(f"{name}: {adapter.name} has no token {unknown[0]} (its ids run to "
                              f"{len(adapter.tokenizer) - 1})")


class FormatMatcher:
    """One answer's place in its format: which tokens may come next, fed each token chosen.

    Args:
        adapter: The model (its tokenizer and end tokens).
        answer_format: The form the answer takes.
    """

    def __init__(self, adapter, answer_format: AnswerFormat):
        from llguidance import LLMatcher

        self._matcher = LLMatcher(format_tokenizer(adapter), grammar_of(answer_format), log_level=0)
        if self._matcher.is_error():
            raise ConfigError(f"the answer's {answer_format.kind} is not valid: {self._matcher.get_error()}")

    def allowed(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        """``(vocab_size,)`` bool: the tokens that keep the answer in its format (none past the
        tokenizer's vocabulary, where a model's logits may run on)."""
        bias = torch.frombuffer(bytearray(self._matcher.compute_logit_bias()), dtype=torch.uint8)[:vocab_size]
        allowed = torch.zeros(vocab_size, dtype=torch.bool)
        allowed[:len(bias)] = bias > 0
        return allowed.to(device)

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise ModelError(f"token {token} left the answer's format: {self._matcher.get_error()}")

"""Settings the command line reads without loading torch: the default model, generation, watch's refresh
modes. Prefill's and the feed's settings live with them (`engine.prefill.config`, `ingest.feed.config`)."""

from __future__ import annotations

import dataclasses

from vidsight.errors import ConfigError

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
# watch: how KV is reused between windows, and how many Yes windows in a row raise an alert.
REFRESH_MODES = ("full-comp", "anchors", "reuse", "deviation", "all")
# Stop strings an answer takes (vLLM takes any number; OpenAI's API four).
MAX_STOP_STRINGS, MAX_STOP_CHARS = 16, 256
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20   # OpenAI's top_logprobs
MAX_LOGIT_BIAS = 100   # OpenAI's bound on a token's logit bias, either way
ALERT_AFTER = 2
MAX_NEW_TOKENS = 32768
# Where a server's requests take their sampling defaults from (vLLM's --generation-config): the
# checkpoint's generation_config.json, or vidsight's own.
GENERATION_CONFIGS = ("auto", "vllm")
# Cache slots set aside at prefill for an answer bounded only by the context window: most answers
# fit, and a longer one grows the cache by its own length as it goes (`Answer.make_room`), instead
# of every answer holding room for a whole context's worth of tokens.
OPEN_ANSWER_ROOM = 512
# The text of an answer format (a JSON schema, a regular expression, a grammar): compiled per answer.
MAX_FORMAT_CHARS = 100000
FORMAT_KINDS = ("json_schema", "regex", "grammar")


@dataclasses.dataclass(frozen=True)
class AnswerFormat:
    """The form an answer must take (vLLM's structured outputs): each token is chosen among those
    that keep the answer a prefix of a text of this form (`engine.constrain`), and the answer can
    end only once it is whole.

    Attributes:
        kind: ``json_schema`` (the answer is JSON valid under the schema), ``regex`` (it matches
            the regular expression whole) or ``grammar`` (Lark, or GBNF as llama.cpp and vLLM write it).
        text: The schema (JSON text), the expression or the grammar.
        any_whitespace: Between JSON's tokens any white space is allowed (vLLM's default); False
            writes JSON compactly (vLLM's ``disable_any_whitespace``), which keeps a weak model from
            spending its tokens on white space.
    """

    kind: str
    text: str
    any_whitespace: bool = True

    def __post_init__(self):
        if self.kind not in FORMAT_KINDS:
            raise ConfigError(f"an answer format is one of {', '.join(FORMAT_KINDS)}, not {self.kind!r}")
        if not isinstance(self.text, str) or not self.text.strip() or len(self.text) > MAX_FORMAT_CHARS:
            raise ConfigError(f"the answer's {self.kind} must be a text of 1 to {MAX_FORMAT_CHARS} characters")
        from vidsight.engine.constrain import check_format

        check_format(self)


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How answer tokens are chosen.

    Attributes:
        max_new_tokens: Stop after this many tokens if no end-of-sequence token came; None: once
            prompt and answer fill the model's context window (`VLMAdapter.context_window`), as
            vLLM does when a request gives no ``max_tokens``.
        temperature: 0 for greedy decoding; above 0 samples from the softened distribution.
        top_p: Nucleus sampling mass (only when sampling).
        top_k: Sample among this many likeliest tokens only (0: all; vLLM's -1 is taken as 0 at
            the server).
        min_p: Sample only tokens at least this share of the likeliest token's probability (0: all).
        seed: Seeds sampling, so a sampled answer is reproducible.
        min_tokens: No end token, and no stop string, ends the answer before this many tokens (the
            end tokens' logits are -inf until then, as transformers' ``min_new_tokens``; vLLM's).
        ignore_eos: An end token does not end the answer (it is kept and generation goes on, as
            vLLM's ``ignore_eos`` for benchmarks of a fixed answer length).
        stop: Strings that end the answer when it produces one (OpenAI's ``stop``); the answer's
            text ends before the first of them.
        include_stop_str_in_output: The answer's text runs through the stop string that ended it
            (vLLM's ``include_stop_str_in_output``), instead of ending before it.
        stop_token_ids: Tokens that end the answer when it produces one, beside the model's end
            tokens and whatever ``ignore_eos`` says (vLLM's ``stop_token_ids``); the token is the
            answer's last, its text shown unless it is a special token's.
        repetition_penalty: transformers' (CTRL's): every token of the prompt and of the answer so
            far has its logit divided by it (multiplied, when negative) before a token is chosen;
            1 is none. None takes the checkpoint's own (its ``generation_config.json``:
            Qwen2.5-VL's 1.05), as transformers' ``generate`` and vLLM do.
        frequency_penalty: OpenAI's: each token's logit is lowered by this times its count in the
            answer so far (-2 to 2; 0 is none).
        presence_penalty: OpenAI's: each token already in the answer has its logit lowered by
            this (-2 to 2; 0 is none; Qwen3-VL's card suggests 1.5).
        logprobs: Record each chosen token's log probability and this many of the likeliest
            tokens' at its step (OpenAI's ``top_logprobs``, at most 20); None records none.
        answer_format: The form the answer must take (`AnswerFormat`); None: free text.
        logit_bias: ``(token id, bias)`` pairs (or OpenAI's mapping of ids, as text, to biases):
            each bias, -100 to 100, is added to its token's logit before the penalties and the
            choice (vLLM's order); -100 all but bans a token, 100 all but forces it.
        reasoning_parser: A reasoning model's thinking tags, by vLLM's parser name (`engine.reasoning`):
            the answer is parted into its reasoning and its content, and an answer format holds
            the content only (the thinking before it is free, as vLLM's structured outputs leave it).
    """

    max_new_tokens: int | None = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] = ()
    repetition_penalty: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: int | None = None
    answer_format: AnswerFormat | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    reasoning_parser: str | None = None

    def __post_init__(self):
        from vidsight.engine.reasoning import REASONING_PARSERS

        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(f"unknown reasoning parser {self.reasoning_parser!r}; known: {', '.join(REASONING_PARSERS)}")
        if not (-2 <= self.frequency_penalty <= 2 and -2 <= self.presence_penalty <= 2):
            raise ConfigError(f"frequency_penalty and presence_penalty must be in [-2, 2], got "
                              f"{self.frequency_penalty} and {self.presence_penalty}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ConfigError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty must be positive, got {self.repetition_penalty}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        if len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop):
            raise ConfigError(f"stop takes at most {MAX_STOP_STRINGS} strings of 1 to {MAX_STOP_CHARS} characters")
        stop_ids = tuple(self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stop_ids)
        if len(stop_ids) > MAX_STOP_TOKEN_IDS or not all(isinstance(t, int) and t >= 0 for t in stop_ids):
            raise ConfigError(f"stop_token_ids takes at most {MAX_STOP_TOKEN_IDS} token ids (whole numbers >= 0), "
                              f"got {list(stop_ids)[:8]}")
        if self.max_new_tokens is not None and not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ConfigError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got {self.max_new_tokens}")
        most = MAX_NEW_TOKENS if self.max_new_tokens is None else self.max_new_tokens
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= most:
            raise ConfigError(f"min_tokens must be between 0 and max_new_tokens ({most}), got {self.min_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be a whole number >= 0 (0: all tokens), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ConfigError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.answer_format is not None and (self.min_tokens or self.ignore_eos):
            raise ConfigError("min_tokens and ignore_eos do not combine with an answer format, which decides "
                              "where the answer ends")

    @property
    def answer_room(self) -> int:
        """Cache slots to set aside for the answer when its prompt is prefilled."""
        return OPEN_ANSWER_ROOM if self.max_new_tokens is None else self.max_new_tokens

    def answer_limit(self, context_window: int, prompt_tokens: int) -> int:
        """The most tokens the answer to a prompt of ``prompt_tokens`` may have: ``max_new_tokens``,
        or what is left of a context window of ``context_window`` tokens.

        Raises:
            ConfigError: the answer has no limit of its own and the prompt fills the window.
        """
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        if prompt_tokens >= context_window:
            raise ConfigError(f"the prompt's {prompt_tokens} tokens fill the model's context window of {context_window} "
                              "tokens (its maximum context length), leaving no room for an answer; give max_tokens "
                              "(max_new_tokens), or fewer frames")
        return context_window - prompt_tokens


def _bias_pairs(given) -> tuple[tuple[int, float], ...]:
    """``given`` logit biases as sorted ``(token id, bias)`` pairs, each checked."""
    pairs = given.items() if isinstance(given, dict) else given
    try:
        biases = {int(str(token).strip()): float(bias) for token, bias in pairs}
    except (TypeError, ValueError):
        raise ConfigError("logit_bias maps token ids (whole numbers) to biases (numbers)") from None
    for token, bias in biases.items():
        if token < 0 or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise ConfigError(f"logit_bias: token {token} gets {bias}; ids are >= 0 and biases in "
                              f"[-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]")
    return tuple(sorted(biases.items()))

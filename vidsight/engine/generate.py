"""The decode loop: one answer (`generate`), or several stepped together (`DecodeBatch`); each token is
chosen by `sampling`, within an answer format's mask (`constrain`) when there is one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from vidsight.engine.batch import Chunk, forward_packed
from vidsight.engine.config import GenerationConfig
from vidsight.engine.constrain import FormatMatcher
from vidsight.engine.reasoning import REASONING_PARSERS
from vidsight.engine.sampling import TokenSampler
from vidsight.kv import TokenTable
from vidsight.kv.policies import KVPolicy, Step
from vidsight.kv.store import KVStore
from vidsight.models.base import VLMAdapter


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log probability under the model (its own distribution, before a
    repetition penalty or temperature, as vLLM reports it), with the likeliest tokens' at its step.

    Attributes:
        token_id: The token.
        text: Its text alone.
        logprob: Its natural log probability.
        top: The likeliest tokens at the step, most likely first (their own ``top`` empty).
    """

    token_id: int
    text: str
    logprob: float
    top: tuple["TokenLogprob", ...] = ()

    def to_dict(self, alternatives: bool = True) -> dict:
        """OpenAI's form: ``token``, ``logprob``, ``bytes`` and, for a generated token (not one of
        the ``alternatives`` themselves), ``top_logprobs``."""
        entry = {"token": self.text, "logprob": self.logprob, "bytes": list(self.text.encode())}
        return {**entry, "top_logprobs": [t.to_dict(False) for t in self.top]} if alternatives else entry


@dataclasses.dataclass
class Answer:
    """One answer being generated: its cache, where it stands, and what it produced.

    Attributes:
        cache: The prefilled cache (prompt, and the answer's tokens as they are fed).
        logits: ``(vocab,)`` logits of the next token.
        next_position: Position (all three M-RoPE axes) of the next token fed.
        config: How tokens are chosen and how many at most.
        on_token: Called with the ids so far after each token.
        policy: The cached tokens each generated token attends to (None: all).
        step: An ``answer`` step counting what was attended.
        context: ``(L,)`` the prompt's token ids, which a repetition penalty counts with the
            answer's (transformers counts its input ids; None: the answer's only).
        limit: The most tokens it may have (`GenerationConfig.answer_limit`; None: the config's
            ``max_new_tokens``, which must then be set).
        ids: Generated ids, ending with the end token when one was produced.
        done: No more tokens will come (an end token, a stop string, the limit, or `cancel`).
        stopped: An end token (or one of `stop_token_ids`) or a stop string ended it (not the limit, nor `cancel`).
        cancelled: `cancel` ended it (every id chosen was fed to the cache).
        logprobs: With ``config.logprobs``, per chosen token ``(logprob, top ids, top logprobs)``.
        starts_thinking: With ``config.reasoning_parser``, whether the answer began inside the
            thinking (`ReasoningParser.thinking_at_start` of ``context``); known from the first token.
    """

    cache: KVStore
    logits: torch.Tensor
    next_position: int
    config: GenerationConfig = GenerationConfig()
    on_token: Callable[[list[int]], None] | None = None
    policy: KVPolicy | None = None
    step: Step | None = None
    context: torch.Tensor | None = None
    limit: int | None = None
    ids: list[int] = dataclasses.field(default_factory=list)
    done: bool = False
    stopped: bool = False
    cancelled: bool = False
    logprobs: list[tuple[float, list[int], list[float]]] = dataclasses.field(default_factory=list)
    starts_thinking: bool | None = None

    def __post_init__(self):
        if self.limit is None:
            if self.config.max_new_tokens is None:
                raise ValueError("an answer bounded by the context window needs its limit (answer_limit)")
            self.limit = self.config.max_new_tokens
        self._room = self.config.answer_room   # answer tokens the cache was told to hold
        self._sampler = TokenSampler(self.config, self.logits.device)
        # Tokens whose text holds any stop string that ends in the newest one: every token adds
        # at least a byte (special tokens end the answer anyway).
        self._stop_window = 4 * max((len(end.encode()) for end in self.config.stop), default=0) + 4
        # The penalties' bookkeeping: (vocab,) each token's count in the answer so far; the tokens of
        # the prompt or the answer, and of the answer, as sets and index tensors; answer tokens counted.
        self._counts: torch.Tensor | None = None
        self._seen: set[int] = set()
        self._answered: set[int] = set()
        self._seen_ids = self._answered_ids = None
        self._counted = 0
        self._format: FormatMatcher | None = None   # made at the first token, where the adapter is at hand
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None   # (ids, biases), made at the first token
        self._thinking_ends: int | None = None   # the token that closes the thinking, while the answer is in it

    def choose(self, adapter: VLMAdapter) -> int:
        """Pick the next token from ``logits`` and record it; ends the answer at an end token, a stop
        string or the limit."""
        logits = self._penalised(adapter)
        if len(self.ids) < self.config.min_tokens:
            ends = torch.tensor(sorted({*adapter.eos_token_ids, *self.config.stop_token_ids}), dtype=torch.long,
                                device=logits.device)
            logits = logits.index_fill(0, ends, float("-inf"))
        if self.config.reasoning_parser is not None and self.starts_thinking is None:
            self._begin_reasoning(adapter)
        formatting = self.config.answer_format is not None and self._thinking_ends is None
        if formatting:
            if self._format is None:
                self._format = FormatMatcher(adapter, self.config.answer_format)
            logits = logits.masked_fill(~self._format.allowed(len(logits), logits.device), float("-inf"))
        token = self._sampler(logits)
        self.ids.append(token)
        if formatting:
            self._format.accept(token)
        elif token == self._thinking_ends:
            self._thinking_ends = None   # the answer's content, and its format, start here
        if self.config.logprobs is not None:
            logprobs = torch.log_softmax(self.logits.float(), dim=-1)
            top = torch.topk(logprobs, self.config.logprobs)
            self.logprobs.append((float(logprobs[token]), top.indices.tolist(), top.values.tolist()))
        if self.on_token is not None:
            self.on_token(self.ids)
        ended = (token in adapter.eos_token_ids and not self.config.ignore_eos) or token in self.config.stop_token_ids
        self.stopped = len(self.ids) >= self.config.min_tokens and (ended or self._stop_string(adapter))
        self.done = self.stopped or len(self.ids) == self.limit
        return token

    def make_room(self) -> None:
        """Room in the cache for the newest token, about to be fed. An answer that outgrows the
        room set aside for it takes as much again (up to its limit): growth by the answer's
        length, not the cache's, so a long prompt's memory is not doubled for a long answer."""
        if len(self.ids) > self._room:
            grown = min(self.limit, 2 * self._room)
            self.cache.reserve(grown - len(self.ids) + 1, exact=True)
            self._room = grown
        self.cache.reserve(1)

    def _begin_reasoning(self, adapter: VLMAdapter) -> None:
        parser = REASONING_PARSERS[self.config.reasoning_parser]
        prompt = [] if self.context is None else self.context.tolist()
        self.starts_thinking = parser.thinking_at_start(adapter, prompt)
        if self.starts_thinking:
            self._thinking_ends = parser.tag_ids(adapter)[1]

    def _penalised(self, adapter: VLMAdapter) -> torch.Tensor:
        """``logits`` under the penalties, in float32 as transformers and vLLM apply them: the
        repetition penalty over the prompt's and the answer's tokens, then OpenAI's frequency and
        presence penalties over the answer's. Only the tokens concerned are touched (a few
        thousand of a vocabulary of 150,000)."""
        config = self.config
        repetition = adapter.repetition_penalty if config.repetition_penalty is None else config.repetition_penalty
        if repetition == 1 and not config.frequency_penalty and not config.presence_penalty:
            return self._biased()
        device = self.logits.device
        if self._counts is None:
            self._counts = torch.zeros(len(self.logits), device=device)
            self._seen, self._answered = set() if self.context is None else set(self.context.tolist()), set()
            self._seen_ids = torch.tensor(sorted(self._seen), dtype=torch.long, device=device)
            self._answered_ids = torch.zeros(0, dtype=torch.long, device=device)
        seen, answered = [], []
        for token in self.ids[self._counted:]:
            self._counts[token] += 1
            for known, fresh in ((self._seen, seen), (self._answered, answered)):
                if token not in known:
                    known.add(token)
                    fresh.append(token)
        self._seen_ids = torch.cat([self._seen_ids, torch.tensor(seen, dtype=torch.long, device=device)])
        self._answered_ids = torch.cat([self._answered_ids, torch.tensor(answered, dtype=torch.long, device=device)])
        self._counted = len(self.ids)
        logits = self._biased().to(torch.float32, copy=True)
        if repetition != 1:
            values = logits[self._seen_ids]
            logits[self._seen_ids] = torch.where(values < 0, values * repetition, values / repetition)
        answered = self._answered_ids
        if config.frequency_penalty:
            logits[answered] -= config.frequency_penalty * self._counts[answered]
        if config.presence_penalty:
            logits[answered] -= config.presence_penalty
        return logits

    def _biased(self) -> torch.Tensor:
        """``logits`` with the config's logit biases added (in float32, as vLLM adds them)."""
        if not self.config.logit_bias:
            return self.logits
        if self._bias is None:
            tokens, biases = zip(*self.config.logit_bias)
            self._bias = (torch.tensor(tokens, dtype=torch.long, device=self.logits.device),
                          torch.tensor(biases, dtype=torch.float32, device=self.logits.device))
        return self.logits.float().index_add(0, *self._bias)

    def _stop_string(self, adapter: VLMAdapter) -> bool:
        if not self.config.stop:
            return False
        text = adapter.decode_text(self.ids[-self._stop_window:])
        return any(end in text for end in self.config.stop)

    def cancel(self) -> None:
        """Stop before the next step (a client that went away); its cache is no longer fed."""
        self.done = self.cancelled = True


class DecodeBatch:
    """Generates several answers together: each step feeds one token of every running answer.

    Each answer's tokens are the ones `generate` would choose for it alone (tested): its own
    sampler, positions, policy and end. An answer added between steps joins the next one.

    Args:
        adapter: The model's primitives.
    """

    def __init__(self, adapter: VLMAdapter):
        self.adapter = adapter
        self.running: list[Answer] = []

    def add(self, answer: Answer) -> Answer:
        self.running.append(answer)
        return answer

    @torch.inference_mode()
    def step(self) -> int:
        """Choose every running answer's next token, then feed those that go on, packed.

        Returns:
            Answers still running.
        """
        self._feed(self._choose(), [])
        return len(self.running)

    @torch.inference_mode()
    def step_beside(self, prefills: list[Chunk]) -> list[torch.Tensor]:
        """`step`, with other sequences' prefill chunks packed into the same pass (chunked
        prefill: the answers' tokens ride with the chunks, whose weights are read anyway).

        Returns:
            Per chunk, ``(1, L, hidden)`` hidden states after the last layer (before the final norm).
        """
        return self._feed(self._choose(), prefills)

    def _choose(self) -> list[Answer]:
        for answer in self.running:
            if not answer.done:
                answer.choose(self.adapter)
        self.running = [answer for answer in self.running if not answer.done]
        return self.running

    def _feed(self, answers: list[Answer], others: list[Chunk]) -> list[torch.Tensor]:
        """Feed each answer's last token, packed with ``others``; the others' hidden states."""
        chunks = []
        for answer in answers:
            positions = torch.full((3, 1), answer.next_position, dtype=torch.long)
            answer.make_room()
            chunks.append(Chunk(answer.cache, self.adapter.embed_tokens(torch.tensor([[answer.ids[-1]]])), positions,
                                TokenTable.text(positions), answer.policy, answer.step))
        if not chunks and not others:
            return []
        hidden = forward_packed(self.adapter, chunks + others)
        if answers:
            # One pass of the output head for every answer: on a memory-bound device it reads its
            # weights once instead of once per answer.
            last = torch.cat([h[0, -1:] for h in hidden[:len(answers)]])
            for answer, logits in zip(answers, self.adapter.logits(last)):
                answer.logits = logits
                answer.next_position += 1
        return hidden[len(answers):]

    def run(self) -> None:
        """Step until every answer has ended."""
        while self.step():
            pass


def token_logprobs(adapter: VLMAdapter, answer: Answer, start: int = 0) -> list[TokenLogprob]:
    """``answer``'s recorded log probabilities from its ``start``-th token, each token's text
    alone; an end token, which ends the answer and is no part of its text, is left out."""
    ids = answer.ids[:-1] if answer.ids and answer.ids[-1] in adapter.eos_token_ids else answer.ids
    return [TokenLogprob(token, adapter.decode_text([token]), logprob,
                         tuple(TokenLogprob(t, adapter.decode_text([t]), p) for t, p in zip(top_ids, top_logprobs)))
            for token, (logprob, top_ids, top_logprobs) in zip(ids[start:], answer.logprobs[start:])]


class AnswerInProgress:
    """A prompt that is prefilled and whose answer is being generated.

    ``answer`` is stepped by a `DecodeBatch`, alone (`generate_alone`) or beside other answers on
    a server; once it is done, `finish` gives the workload's result (`AskResult`, `ChatAnswer`).

    Args:
        adapter: The model's primitives.
        answer: The answer to generate.
    """

    def __init__(self, adapter: VLMAdapter, answer: Answer):
        self.adapter, self.answer = adapter, answer

    def finish(self):
        """The result, once ``answer`` is done."""
        raise NotImplementedError

    def abandon(self) -> None:
        """Give the answer up without a result (its generation failed); what it holds is released."""

    def generate_alone(self):
        """Generate the answer by itself, then `finish`."""
        return generate_together([self])[0]


def generate_together(begun: list[AnswerInProgress]) -> list:
    """Generate several prefilled answers in one decode batch (`Asker.begin`, `ChatSession.begin`:
    different videos, sessions and settings alike); each result is what `generate_alone` gives it.

    Returns:
        Each one's `finish`, in order.
    """
    if not begun:
        return []
    batch = DecodeBatch(begun[0].adapter)
    for progress in begun:
        batch.add(progress.answer)
    batch.run()
    return [progress.finish() for progress in begun]


@torch.inference_mode()
def generate(adapter: VLMAdapter, cache: KVStore, logits: torch.Tensor, next_position: int, config: GenerationConfig,
             on_token: Callable[[list[int]], None] | None = None, policy: KVPolicy | None = None,
             step: Step | None = None, context: torch.Tensor | None = None) -> list[int]:
    """Decode one answer from the prefill's last logits until an end token or its limit
    (`GenerationConfig.answer_limit`).

    Args:
        adapter: The model's primitives.
        cache: The prefilled cache; generated tokens are appended to it.
        logits: ``(vocab,)`` logits of the last prompt token.
        next_position: Position index of the first generated token (all three M-RoPE axes).
        config: Selection settings.
        on_token: Called with the ids generated so far after each token (progress bars, streamed text).
        policy: Chooses the cached tokens each generated token attends to (None: all).
        step: An ``answer`` step that counts what the generated tokens attended.
        context: The prompt's token ids, for a repetition penalty.

    Returns:
        Generated ids, ending with the end token when one was produced.
    """
    answer = Answer(cache, logits, next_position, config, on_token, policy, step, context,
                    config.answer_limit(adapter.context_window, cache.length))
    batch = DecodeBatch(adapter)
    batch.add(answer)
    batch.run()
    return answer.ids

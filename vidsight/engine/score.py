"""Scoring given answers instead of generating one: each continuation's log probability after a prompt.

This is what lm-eval's and lmms-eval's ``loglikelihood`` asks of a model (their multiple-choice
tasks rank the choices by it): the sum of the model's log probabilities of a continuation's
tokens after the prompt, and whether greedy decoding would produce those tokens. The prompt is
prefilled once; each continuation is fed after it and cut off again, so N choices cost one
prefill and N short chunks. Under a chat session's retrieval policy a continuation is fed a token
at a time, as an answer is generated: the policy chooses what each token attends to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from vidsight.engine.forward import forward
from vidsight.engine.generate import Answer, AnswerInProgress, TokenLogprob
from vidsight.engine.prefill import Prefilled
from vidsight.engine.stats import AskStats, ChatStats, StageClock
from vidsight.errors import ConfigError
from vidsight.kv import TokenTable
from vidsight.kv.policies import KVPolicy, Step
from vidsight.models.base import VLMAdapter


@dataclasses.dataclass(frozen=True)
class ContinuationScore:
    """How likely the model finds one continuation of the prompt.

    Attributes:
        text: The continuation.
        logprob: The sum of its tokens' natural log probabilities under the model (its own
            distribution: no repetition penalty, no temperature, as lm-eval defines it).
        greedy: Each of its tokens is the likeliest at its step, so greedy decoding begins with it.
        tokens: Each token's log probability, its text alone.
    """

    text: str
    logprob: float
    greedy: bool
    tokens: tuple[TokenLogprob, ...]

    def to_dict(self) -> dict:
        return {"text": self.text, "logprob": self.logprob, "greedy": self.greedy,
                "tokens": [t.to_dict(alternatives=False) for t in self.tokens]}


@dataclasses.dataclass
class ScoreResult:
    """Scores of several continuations of one prompt and what they cost.

    Attributes:
        scores: One per continuation, in the order given.
        stats: The workload's (`AskStats`, `ChatStats`): frames, tokens, stage times (scoring
            counts as ``generate``, the stage it takes the place of).
    """

    scores: list[ContinuationScore]
    stats: AskStats | ChatStats

    @property
    def best(self) -> int:
        """The index of the likeliest continuation (the first of equals)."""
        return max(range(len(self.scores)), key=lambda i: (self.scores[i].logprob, -i))

    def to_dict(self) -> dict:
        return {"best": self.best, "scores": [s.to_dict() for s in self.scores], "stats": self.stats.to_dict()}


class ScoreInProgress(AnswerInProgress):
    """A prompt prefilled for scoring (`Asker.score_steps`): an answer of no tokens, over before it
    begins, so a decode batch hands it back at its next step, where `finish` scores the
    continuations (a server runs them on its model thread, as it generates answers there).
    """

    def __init__(self, adapter: VLMAdapter, state: Prefilled, continuations: Sequence[str], clock: StageClock):
        super().__init__(adapter, Answer(state.cache, state.logits, state.next_position, done=True))
        self.state, self.continuations, self.clock = state, continuations, clock

    def finish(self) -> ScoreResult:
        with self.clock.stage("generate"):
            scores = score_continuations(self.adapter, self.state, self.continuations)
        return ScoreResult(scores, self.clock.finish())


def continuation_ids(adapter: VLMAdapter, continuations: Sequence[str]) -> list[list[int]]:
    """Each continuation's token ids, read as the answer's text is (no special tokens); an empty
    list, or a continuation without tokens, is a `ConfigError`."""
    if isinstance(continuations, str) or not continuations:
        raise ConfigError(f"continuations to score: give a list of one or more strings, got {continuations!r}")
    ids = [adapter.text_ids(text) for text in continuations]
    for text, tokens in zip(continuations, ids):
        if not tokens:
            raise ConfigError(f"continuation {text!r}: it has no tokens to score")
    return ids


@torch.inference_mode()
def score_continuations(adapter: VLMAdapter, state: Prefilled, continuations: Sequence[str],
                        policy: KVPolicy | None = None, step: Step | None = None) -> list[ContinuationScore]:
    """Score each of ``continuations`` after the prompt prefilled in ``state``.

    Each continuation's tokens but the last are fed after the prompt (the last one's own logits
    would score nothing), then cut off, so the cache holds the prompt alone again afterwards.
    With a ``policy`` they are fed one at a time as an ``answer`` ``step``, as `generate` feeds them.
    """
    scores = []
    for text, ids in zip(continuations, continuation_ids(adapter, continuations)):
        logits = _continuation_logits(adapter, state, ids, policy, step)
        logprobs = torch.log_softmax(logits.float(), dim=-1)   # (len(ids), vocab): row i scores ids[i]
        chosen = logprobs[torch.arange(len(ids)), torch.tensor(ids, device=logprobs.device)]
        greedy = bool((logprobs.argmax(dim=-1).cpu() == torch.tensor(ids)).all())
        tokens = tuple(TokenLogprob(token, adapter.decode_text([token]), float(p)) for token, p in zip(ids, chosen))
        scores.append(ContinuationScore(text, float(chosen.double().sum()), greedy, tokens))
    return scores


def _continuation_logits(adapter: VLMAdapter, state: Prefilled, ids: list[int], policy: KVPolicy | None,
                         step: Step | None) -> torch.Tensor:
    """``(len(ids), vocab)`` logits, row ``i`` scoring ``ids[i]``: the prompt's last, then those
    of each fed token."""
    if len(ids) == 1:
        return state.logits[None]
    prompt_end, fed = state.cache.length, torch.tensor([ids[:-1]])
    positions = torch.arange(state.next_position, state.next_position + fed.shape[1])[None].repeat(3, 1)
    # Without a policy every token attends to everything: the chunk is what feeding them one by one computes.
    pieces = [(0, fed.shape[1])] if policy is None else [(k, k + 1) for k in range(fed.shape[1])]
    state.cache.reserve(fed.shape[1])
    try:
        hidden = torch.cat([forward(adapter, state.cache, adapter.embed_tokens(fed[:, a:b]), positions[:, a:b],
                                    TokenTable.text(positions[:, a:b]), policy=policy, step=step)[0]
                            for a, b in pieces])
    finally:
        state.cache.truncate(prompt_end)
    return torch.cat([state.logits[None], adapter.logits(hidden)])

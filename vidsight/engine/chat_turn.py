"""A chat session's question turn: prefilled, then answered (generated or scored), then ended.

`ChatSession.asking` makes a `ChatInProgress` before the question's prefill and hands it out once
the question is in the cache; `finish` ends the turn, keeping it in the session's memory or
dropping it, and counts its cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from vidsight.engine.config import GenerationConfig
from vidsight.engine.generate import Answer, AnswerInProgress
from vidsight.engine.prefill import Prefilled
from vidsight.engine.reasoning import REASONING_PARSERS
from vidsight.engine.score import ScoreResult, score_continuations
from vidsight.engine.stats import ChatStats, StageClock
from vidsight.engine.text_stream import TextStream, answer_text
from vidsight.kv.policies import Step
from vidsight.kv.store import traffic_of

if TYPE_CHECKING:
    from vidsight.engine.chat import ChatSession


@dataclasses.dataclass
class ChatAnswer:
    """An answer, its ids and its cost; ``logits`` are the first answer token's; ``reasoning`` the
    thinking before the answer, with ``GenerationConfig.reasoning_parser`` (as `AskResult`'s)."""

    question: str
    answer: str
    token_ids: list[int]
    stats: ChatStats
    logits: torch.Tensor = dataclasses.field(repr=False)
    reasoning: str | None = None

    def to_dict(self) -> dict:
        reasoning = {} if self.reasoning is None else {"reasoning": self.reasoning}
        return {"time_s": self.stats.time_s, "question": self.question, **reasoning, "answer": self.answer,
                "stats": self.stats.to_dict()}


class ChatInProgress(AnswerInProgress):
    """A session's question that is prefilled and whose answer is being generated (`ChatSession.asking`).

    `finish` ends the turn: the dialogue is kept or dropped from the cache, and the stats are
    counted. The ``generate`` stage runs from the question's prefill to `finish`. The session
    makes it before the question's prefill (whose clock and step it holds) and hands it out after
    `start`, which gives it its ``answer``.
    """

    def __init__(self, session: "ChatSession", question: str, generation: GenerationConfig,
                 on_text: Callable[[str], None] | None):
        super().__init__(session.adapter, None)
        self.session, self.question, self.generation = session, question, generation
        self.stream = (TextStream(session.adapter, on_text, generation.stop, generation.include_stop_str_in_output)
                       if on_text is not None else None)
        self.before = session.cache.length
        self.stats = ChatStats(time_s=session.time_s, frames_seen=session.frames_seen, cached_tokens=self.before)
        self.clock = StageClock(self.stats, session.adapter.device, reset_peak=False)
        self.question_step, self.answer_step = Step("question"), Step("answer")
        self.traffic_before = traffic_of(session.cache)
        self.logits: torch.Tensor | None = None

    def start(self, logits: torch.Tensor, next_position: int, context: torch.Tensor) -> None:
        """The question is prefilled: its last ``(vocab,)`` logits, the first answer token's position
        and the prompt's token ids (a repetition penalty counts them)."""
        self.logits, self.first_position = logits, next_position
        self._question_end = self.session.cache.length
        self.answer = Answer(self.session.cache, logits, next_position, self.generation, on_token=self.stream,
                             policy=self.session.policy, step=self.answer_step, context=context,
                             limit=self.generation.answer_limit(self.session.adapter.context_window,
                                                                self.session.cache.length))
        self._since = self.clock.mark()

    def score(self, continuations: Sequence[str]) -> ScoreResult:
        """Score ``continuations`` as answers (`vidsight.engine.score`) instead of generating one,
        each token attending through the session's policy as an answer's would; then `finish`
        without keeping a turn."""
        try:
            state = Prefilled(self.session.cache, self.logits, self.first_position, self.answer.context)
            scores = score_continuations(self.adapter, state, continuations, self.session.policy, self.answer_step)
        except BaseException:
            self.abandon()
            raise
        self.answer.cancel()   # nothing was generated: no turn to keep
        return ScoreResult(scores, self.finish().stats)

    def abandon(self) -> None:
        """The question and what was generated leave the cache; the session takes frames again."""
        self.session._answering = None
        self.session.cache.truncate(self.before)

    def finish(self) -> ChatAnswer:
        """The answer and its stats; a cancelled answer's turn (its client went away) is not kept."""
        session, stats, ids = self.session, self.stats, self.answer.ids
        session._answering = None
        if self.stream is not None:
            self.stream.finish(ids)
        text = answer_text(self.adapter.decode_text(ids), self.generation.stop,
                           keep_stop=self.generation.include_stop_str_in_output)
        if session.config.keep_dialogue and not self.answer.cancelled:
            context = self.answer.context.tolist()
            if self.answer.stopped and ids[-1] not in self.adapter.eos_token_ids:
                # A stop string ended it: the turn keeps the text shown, as a client sends the answer back.
                session.cache.truncate(self._question_end)
                kept = self.adapter.text_ids(text)
                session._keep_turn(kept, self.first_position, context + kept)
            else:   # the last token, not in the cache yet, at the position after those fed before it
                session._keep_turn(ids[-1:], self.first_position + len(ids) - 1, context + ids)
        self.clock.charge("generate", self._since)
        if not session.config.keep_dialogue or self.answer.cancelled:
            session.cache.truncate(self.before)
        stats.ttft_s = stats.stages_s["prefill"]
        stats.answer_s = self.clock.elapsed()
        stats.attended_tokens = self.question_step.attended / max(self.question_step.layers, 1)
        stats.retrieved_tokens = self.question_step.retrieved / max(self.question_step.layers, 1)
        stats.policy_s = self.question_step.policy_s
        traffic = traffic_of(session.cache)
        stats.tokens_by_tier, stats.bytes_moved = session.cache.tokens_by_tier(), traffic.bytes_moved
        stats.question_bytes_moved = traffic.since(self.traffic_before).bytes_moved
        stats.copy_s = {way: round(seconds, 6) for way, seconds in traffic.copy_seconds.items()}
        stats.read_bytes, stats.whole_read_bytes = traffic.read_bytes, traffic.whole_read_bytes
        reasoning = None
        if self.generation.reasoning_parser is not None:   # the dialogue kept holds the whole answer
            reasoning, text = REASONING_PARSERS[self.generation.reasoning_parser].split(
                text, bool(self.answer.starts_thinking))
        return ChatAnswer(self.question, text, ids, stats, self.logits, reasoning)

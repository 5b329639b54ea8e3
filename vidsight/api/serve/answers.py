"""The answers a server is generating: stepped together, one token of each per pass (`DecodeBatch`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from vidsight.engine.batch import Chunk

if TYPE_CHECKING:
    from vidsight.engine.generate import DecodeBatch


class AnswerTicket:
    """A client's hold on an answer being generated: `cancel` (a client gone) ends it at the next step."""

    def __init__(self):
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclasses.dataclass
class _Generating:
    progress: Any             # an `AnswerInProgress`
    future: Future
    ticket: AnswerTicket
    client: str               # whose line waits until the answer is finished


class RunningAnswers:
    """Every answer being generated, each with the future its client waits on; touched by the
    model's thread only.

    Args:
        decode: The batch that generates them together.
        on_decode_batch: Called with the number of answers fed in each step.
    """

    def __init__(self, decode: DecodeBatch, on_decode_batch: Callable[[int], None] | None = None):
        self._decode, self._on_decode_batch = decode, on_decode_batch
        self._generating: list[_Generating] = []

    @property
    def adapter(self):
        """The model the answers are generated with (a pass without them runs on it too)."""
        return self._decode.adapter

    def __bool__(self) -> bool:
        return bool(self._generating)

    def clients(self) -> set[str]:
        """The clients whose answers are being generated (their lines wait for them)."""
        return {generating.client for generating in self._generating}

    def add(self, progress, future: Future, ticket: AnswerTicket, client: str) -> None:
        """Generate ``progress`` (an `AnswerInProgress`) from the next step on; ``future`` gets its result."""
        self._decode.add(progress.answer)
        self._generating.append(_Generating(progress, future, ticket, client))

    def step(self, beside: list[Chunk] | None = None) -> list[torch.Tensor] | None:
        """One token of every running answer, packed with the prefill chunks ``beside`` if given
        (whose hidden states are returned); answers that ended hand over their results. A failed
        pass fails every answer in it, and is raised for the chunks' prefills."""
        for generating in self._generating:
            if generating.ticket.cancelled:
                generating.progress.answer.cancel()
        fed = sum(not g.progress.answer.done for g in self._generating)
        if self._on_decode_batch is not None and fed:
            self._on_decode_batch(fed)
        hidden = None
        try:
            if beside is None:
                self._decode.step()
            else:
                hidden = self._decode.step_beside(beside)
        except BaseException as exc:   # the pass failed for every answer in it
            for generating in self._generating:
                generating.progress.answer.cancel()
                generating.progress.abandon()
                generating.future.set_exception(exc)
            self._decode.step()   # drops the cancelled answers
            self._generating = []
            if beside is not None:
                raise
            return None
        for generating in [g for g in self._generating if g.progress.answer.done]:
            self._generating.remove(generating)
            try:
                generating.future.set_result(generating.progress.finish())
            except BaseException as exc:
                generating.future.set_exception(exc)
        return hidden

"""One thread runs the model; clients (requests, watches, sessions) take turns on it.

The model is loaded once and its steps are not thread-safe (a watch's window reuses its KV, and a
model on the CPU already uses every core), so every piece of model work goes through one queue.
Each client has its own line and the worker serves the lines in rotation, one piece of work at a
time: a watch's window, one whole request, a session's frame. A long request therefore delays a
watch by at most itself, and a hundred queued requests delay it by one each, not a hundred.

What is batched: watch windows and session frames are stepped work (`engine.steps`): when the
worker takes one, it also takes the stepped work waiting at the head of other clients' lines (up to
``max_batch``), runs each to the point where it needs its new frames encoded, encodes all of them
in one vision call (unpruned ones; the encoder attends within each video, so each gets its own
result), and then runs their new
tokens (new frames and query) through the language model in one pass with the running answers'
decode step, each over its own cache (`stepped_turn.run_stepped`). Answers are generated together:
a completion's prefill is preemptible work in its client's line, run one prefill group per turn,
after which its answer joins the running answers, and between pieces of work the worker feeds one
token of every running answer in one packed pass (`answers.RunningAnswers`). When a completion's
prefill takes its turn, the prefills at the head of other clients' lines take theirs too: each
runs its next group up to the language model, and their chunks go through the model in one pass with the answers' step (chunked prefill: the answers'
tokens ride with the chunks, `DecodeBatch.step_beside`; at most ``max_prefill_tokens`` per turn, a
longer group split there and its rest run in its client's next turn, `Chunk.split`), except where KV
pruning must see a group alone. A chat session's question is an answer too (`ChatSession.asking`):
its chunk goes in such a pass, its answer joins the running ones, and the session's line waits
(its frames would go into the cache the answer reads) until the answer is finished.

Who goes first: streams (watch windows, session frames) and other work before completions'
prefills, in rotation within each class; a completion's prefill resumes where it paused (its next
group, or the rest of one) when no stream work waits. So a watch waits for at most one turn's
prefill tokens (one group where no budget is set) and one decode step, however long the videos
asked about; completions wait while streams keep the model busy
(admission, `Server.admit`, bounds how many wait).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from vidsight.api.serve.answers import AnswerTicket, RunningAnswers
from vidsight.api.serve.config import DEFAULT_MAX_PREFILL_TOKENS
from vidsight.api.serve.media import RequestError
from vidsight.api.serve.stepped_turn import run_stepped
from vidsight.engine.batch import Chunk, forward_packed
from vidsight.engine.steps import EncodeRequest, Stepped

if TYPE_CHECKING:
    from vidsight.engine.generate import DecodeBatch

MAX_VISION_BATCH = 8


@dataclasses.dataclass
class _Work:
    client: str
    work: Any                 # a callable, or stepped work (a generator)
    future: Future
    queued: float | None      # when it was queued (perf_counter); None once its wait was counted
    stepped: bool
    ticket: AnswerTicket | None = None   # the work begins an answer that the decode batch finishes
    begun: bool = False       # an answer's prefill that ran part way (``work`` is then its generator)
    rest: "Chunk | None" = None   # the part of its chunk a later turn runs (the turn's budget was spent)
    parts: list = dataclasses.field(default_factory=list)   # hidden states of the chunk's parts run so far


class Scheduler:
    """Round-robin over clients on one worker thread.

    Args:
        encode: Encodes a list of requests at once (`steps.encode_together` over the model).
        on_queue_time: Called with how long each piece of work waited before it started.
        on_batch: Called with the size of each vision batch of stepped work.
        max_batch: Most stepped pieces encoded together, and most answers' prefills stepped together.
        max_prefill_tokens: Prompt tokens of prefill chunks in one turn; a group longer than
            what is left goes in parts over its client's next turns (0: one whole group per
            turn): a bound on how long stream work waits behind prefills, and on a pass's
            activation memory.
        decode: The batch that generates answers together (needed by `submit_answer`).
        on_decode_batch: Called with the number of answers fed in each decode step.
    """

    def __init__(self, encode: Callable[[list[EncodeRequest]], list] | None = None,
                 on_queue_time: Callable[[float], None] | None = None,
                 on_batch: Callable[[int], None] | None = None, max_batch: int = MAX_VISION_BATCH,
                 max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS["cuda"],
                 decode: DecodeBatch | None = None, on_decode_batch: Callable[[int], None] | None = None):
        self._lines: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._ready = threading.Condition()
        self._closing = False
        self._running = 0
        self._encode, self._on_queue_time, self._on_batch = encode, on_queue_time, on_batch
        self._max_batch, self._max_prefill_tokens = max_batch, max_prefill_tokens
        self._answers = RunningAnswers(decode, on_decode_batch) if decode is not None else None
        self._worker = threading.Thread(target=self._serve, name="vidsight-model", daemon=True)
        self._worker.start()

    @property
    def waiting(self) -> int:
        with self._ready:
            return sum(len(line) for line in self._lines.values())

    @property
    def running(self) -> int:
        return self._running

    def submit(self, client: str, work: Callable[[], Any]) -> Future:
        """Queue ``work`` in ``client``'s line; the future holds its result or its exception."""
        return self._queue(client, work, stepped=False)

    def submit_steps(self, client: str, steps: Stepped) -> Future:
        """Queue stepped work, which may be encoded beside other clients' (needs ``encode``)."""
        if self._encode is None:
            raise TypeError("stepped work needs a scheduler built with encode=")
        return self._queue(client, steps, stepped=True)

    def submit_answer(self, client: str, begin: Callable[[], Any]) -> tuple[Future, AnswerTicket]:
        """Queue ``begin`` in ``client``'s line: called on the worker, it gives the prefill as
        preemptible work (`Asker.begin_steps`, `ChatSession.asking`), run a group per turn, whose
        result (an `AnswerInProgress`) is then generated beside the other answers; ``client``'s
        later work waits for the answer. The future holds its `finish`'s result."""
        if self._answers is None:
            raise TypeError("answers need a scheduler built with decode=")
        ticket = AnswerTicket()
        return self._queue(client, begin, stepped=False, ticket=ticket), ticket

    def close(self, timeout_s: float | None = None) -> None:
        """Finish the work running; what still waits is refused with a clear error."""
        with self._ready:
            self._closing = True
            refused = [item for line in self._lines.values() for item in line]
            self._lines.clear()
            self._ready.notify()
        for item in refused:
            if item.begun:
                item.work.close()   # its decoders stop
            item.future.set_exception(RequestError(503, "the server is shutting down"))
        self._worker.join(timeout_s)

    def _queue(self, client: str, work, stepped: bool, ticket: AnswerTicket | None = None) -> Future:
        future: Future = Future()
        with self._ready:
            if self._closing:
                raise RequestError(503, "the server is shutting down")
            self._lines.setdefault(client, collections.deque()).append(
                _Work(client, work, future, time.perf_counter(), stepped, ticket))
            self._ready.notify()
        return future

    def _take(self, mates_of: _Work | None = None) -> list[_Work]:
        """The next client's head, a stream's before a completion's (with ``mates_of``, the heads
        of the other clients of its kind, stepped work or answers' prefills, up to the batch
        size), each client then moved to the back of the rotation. Called holding the lock."""
        taken = []
        # A client whose answer is being generated waits for it (a session's frames would go into
        # the cache the answer is decoded over).
        busy = self._answers.clients() if self._answers else set()
        streams = any(line[0].ticket is None for client, line in self._lines.items() if client not in busy)
        for client in list(self._lines):
            head = self._lines[client][0]
            if client in busy:
                continue
            if mates_of is not None and (client == mates_of.client or len(taken) >= self._max_batch - 1
                                         or (head.stepped, head.ticket is None) != (mates_of.stepped,
                                                                                    mates_of.ticket is None)):
                continue
            if streams and head.ticket is not None:
                continue
            line = self._lines.pop(client)
            taken.append(line.popleft())
            if line:
                self._lines[client] = line
            if mates_of is None:
                break
        return taken

    def _next(self) -> list[_Work] | None:
        """The next piece of work (with its batch-mates); empty when none waits but answers run;
        None once closed and idle."""
        with self._ready:
            while not self._lines and not self._closing and not self._answers:
                self._ready.wait()
            if not self._lines:
                return [] if self._answers else None
            items = self._take()
            if not items:   # only clients waiting for their answers
                return []
            if items[0].stepped or items[0].ticket is not None:   # batch-mates: other clients' heads of its kind
                items += self._take(mates_of=items[0])
            self._running = len(items)
            return items

    def _serve(self) -> None:
        while (items := self._next()) is not None:
            for item in items:
                if self._on_queue_time is not None and item.queued is not None:   # a prefill's first turn only
                    self._on_queue_time(time.perf_counter() - item.queued)
                item.queued = None
            stepped = False   # whether the running answers already took this turn's step
            if items and items[0].stepped:
                stepped = run_stepped([(item.work, item.future) for item in items], self._encode, self._answers,
                                      self._on_batch)
            elif items and items[0].ticket is not None:
                stepped = self._prefill_answers(items)
            elif items and items[0].future.set_running_or_notify_cancel():
                item = items[0]
                try:
                    item.future.set_result(item.work())
                except BaseException as exc:  # handed to the waiting client, which reports it
                    item.future.set_exception(exc)
            self._running = 0
            if self._answers and not stepped:
                self._answers.step()

    def _prefill_answers(self, items: list[_Work]) -> bool:
        """One group of each answer's prefill, their chunks packed into one pass with a decode
        step of the running answers (within ``max_prefill_tokens``; more chunks, more passes);
        each goes back in its client's line if groups remain, else its answer joins the decode batch.

        Returns:
            Whether the running answers took their step.
        """
        stepped, waiting = False, []   # (item, chunk) waiting for the model
        for item in items:
            room = self._max_prefill_tokens - sum(chunk.length for _, chunk in waiting)
            if waiting and room <= 0:
                self._put_back(item)   # the turn is full: its group waits for a later one
            elif item.rest is not None:
                if self._gone(item):
                    continue
                self._add_chunk(item, item.rest, waiting, room)
            else:
                self._advance(item, lambda work: next(work), waiting, room)
        while waiting:
            packed, tokens = [], 0
            while waiting and (not packed or tokens + waiting[0][1].length <= self._max_prefill_tokens):
                packed.append(waiting.pop(0))
                tokens += packed[-1][1].length
            try:
                hidden = (self._answers.step(beside=[chunk for _, chunk in packed]) if not stepped else
                          forward_packed(self._answers.adapter, [chunk for _, chunk in packed]))
                stepped = True
            except BaseException as exc:   # the pass failed for every prefill in it
                for item, _ in packed:
                    item.work.close()
                    item.future.set_exception(exc)
                continue
            for (item, _), states in zip(packed, hidden):
                if item.rest is not None:   # the rest of its chunk goes in a later turn
                    item.parts.append(states)
                    self._put_back(item)
                    continue
                if item.parts:
                    states, item.parts = torch.cat([*item.parts, states], dim=1), []
                self._advance(item, lambda work, states=states: work.send(states), waiting,
                              self._max_prefill_tokens)
        return stepped

    def _advance(self, item: _Work, resume, waiting: list, room: int) -> None:
        """Run an answer's prefill on (``resume(generator)``) to its next chunk (added to
        ``waiting``, its first ``room`` tokens if it is longer), its next pause (back in its line)
        or its end (into the decode batch)."""
        try:
            if not item.begun:
                if not item.future.set_running_or_notify_cancel():
                    return
                item.work, item.begun = item.work(), True   # the prefill, created on the model's thread
            if item.ticket.cancelled:   # the client went away while it waited
                raise RequestError(499, "the client went away")
            request = resume(item.work)
        except StopIteration as done:
            self._answers.add(done.value, item.future, item.ticket, item.client)
            return
        except BaseException as exc:   # handed to the waiting client, which reports it
            if item.begun:
                item.work.close()
            item.future.set_exception(exc)
            return
        if request is not None:
            self._add_chunk(item, request, waiting, room)
            return
        self._put_back(item)

    @staticmethod
    def _add_chunk(item: _Work, chunk: Chunk, waiting: list, room: int) -> None:
        """Queue ``chunk`` for this turn's pass: whole, or its first ``room`` tokens when it is
        longer and a budget is set (the rest kept for the item's next turn)."""
        item.rest = None
        if 0 < room < chunk.length and chunk.policy is None:
            chunk, item.rest = chunk.split(room)
        waiting.append((item, chunk))

    def _gone(self, item: _Work) -> bool:
        """Whether the client of a prefill paused mid-chunk went away (then the prefill is ended)."""
        if not item.ticket.cancelled:
            return False
        item.work.close()
        item.future.set_exception(RequestError(499, "the client went away"))
        return True

    def _put_back(self, item: _Work) -> None:
        """Requeue an answer's prefill first in its own line (its client's later requests wait for
        it), its client at the back of the rotation; refused if the scheduler is closing."""
        with self._ready:
            if self._closing:
                if item.begun:
                    item.work.close()
                item.future.set_exception(RequestError(503, "the server is shutting down"))
                return
            line = self._lines.pop(item.client, collections.deque())
            line.appendleft(item)
            self._lines[item.client] = line

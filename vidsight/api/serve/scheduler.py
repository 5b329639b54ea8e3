"""One thread runs the model; clients (requests, watches, sessions) take turns on it.

The model is loaded once and its steps are not thread-safe (a watch's window reuses its KV, and a
model on the CPU already uses every core), so every piece of model work goes through one queue.
Each client has its own line and the worker serves the lines in rotation, one piece of work at a
time: a watch's window, one whole request, a session's frame. A long request therefore delays a
watch by at most itself, and a hundred queued requests delay it by one each, not a hundred.

What is batched: watch windows are stepped work (`engine.steps`): when the worker takes one, it
also takes the windows waiting at the head of other clients' lines (up to ``max_batch``), runs
each to the point where it needs its new frames encoded, encodes all of them in one vision call
(unpruned ones; the encoder attends within each video, so each gets its own result), and
finishes each. Requests and chat frames run whole: their prefill is interleaved with decoding.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from vidsight.api.serve.media import RequestError
from vidsight.engine.steps import EncodeRequest, Stepped

MAX_VISION_BATCH = 8


@dataclasses.dataclass
class _Work:
    client: str
    work: Any                 # a callable, or stepped work (a generator)
    future: Future
    queued: float             # when it was queued (perf_counter)
    stepped: bool


class Scheduler:
    """Round-robin over clients on one worker thread.

    Args:
        encode: Encodes a list of requests at once (`steps.encode_together` over the model).
        on_queue_time: Called with how long each piece of work waited before it started.
        on_batch: Called with the size of each vision batch of stepped work.
        max_batch: Most stepped pieces encoded together.
    """

    def __init__(self, encode: Callable[[list[EncodeRequest]], list] | None = None,
                 on_queue_time: Callable[[float], None] | None = None,
                 on_batch: Callable[[int], None] | None = None, max_batch: int = MAX_VISION_BATCH):
        self._lines: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._ready = threading.Condition()
        self._closing = False
        self._running = 0
        self._encode, self._on_queue_time, self._on_batch = encode, on_queue_time, on_batch
        self._max_batch = max_batch
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

    def close(self, timeout_s: float | None = None) -> None:
        """Finish the work running; what still waits is refused with a clear error."""
        with self._ready:
            self._closing = True
            refused = [item.future for line in self._lines.values() for item in line]
            self._lines.clear()
            self._ready.notify()
        for future in refused:
            future.set_exception(RequestError(503, "the server is shutting down"))
        self._worker.join(timeout_s)

    def _queue(self, client: str, work, stepped: bool) -> Future:
        future: Future = Future()
        with self._ready:
            if self._closing:
                raise RequestError(503, "the server is shutting down")
            self._lines.setdefault(client, collections.deque()).append(
                _Work(client, work, future, time.perf_counter(), stepped))
            self._ready.notify()
        return future

    def _take(self, stepped_only: bool = False, after: str | None = None) -> list[_Work]:
        """The next client's head (with ``stepped_only``, the stepped heads of the clients other
        than ``after``, up to the batch size), each client then moved to the back of the rotation.
        Called holding the lock."""
        taken = []
        for client in list(self._lines):
            line = self._lines[client]
            if stepped_only and (client == after or not line[0].stepped or len(taken) >= self._max_batch - 1):
                continue
            taken.append(line.popleft())
            del self._lines[client]
            if line:
                self._lines[client] = line
            if not stepped_only:
                break
        return taken

    def _next(self) -> list[_Work] | None:
        with self._ready:
            while not self._lines and not self._closing:
                self._ready.wait()
            if not self._lines:
                return None
            items = self._take()
            if items[0].stepped:   # its batch-mates are other clients' stepped heads
                items += self._take(stepped_only=True, after=items[0].client)
            self._running = len(items)
            return items

    def _serve(self) -> None:
        while (items := self._next()) is not None:
            for item in items:
                if self._on_queue_time is not None:
                    self._on_queue_time(time.perf_counter() - item.queued)
            if items[0].stepped:
                self._run_stepped(items)
            elif items[0].future.set_running_or_notify_cancel():
                try:
                    items[0].future.set_result(items[0].work())
                except BaseException as exc:  # handed to the waiting client, which reports it
                    items[0].future.set_exception(exc)
            self._running = 0

    def _run_stepped(self, items: list[_Work]) -> None:
        waiting = []   # (steps, future, request) paused at their encoding
        for item in items:
            if not item.future.set_running_or_notify_cancel():
                continue
            try:
                waiting.append((item.work, item.future, next(item.work)))
            except StopIteration as stop:
                item.future.set_result(stop.value)
            except BaseException as exc:
                item.future.set_exception(exc)
        if not waiting:
            return
        if self._on_batch is not None:
            self._on_batch(len(waiting))
        try:
            encoded = self._encode([request for _, _, request in waiting])
        except BaseException as exc:
            for _, future, _ in waiting:
                future.set_exception(exc)
            return
        for (steps, future, _), embeds in zip(waiting, encoded):
            try:
                future.set_result(self._finish(steps, embeds))
            except BaseException as exc:
                future.set_exception(exc)

    def _finish(self, steps: Stepped, embeds):
        """Run stepped work on from ``embeds`` to its result, encoding any further request alone."""
        try:
            request = steps.send(embeds)
            while True:
                request = steps.send(self._encode([request])[0])
        except StopIteration as stop:
            return stop.value

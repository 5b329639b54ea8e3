"""One thread runs the model; clients (requests, watches, sessions) take turns on it.

The model is loaded once and its steps are not thread-safe (a watch's window reuses its KV, and a
model on the CPU already uses every core), so every piece of model work goes through one queue.
Each client has its own line and the worker serves the lines in rotation, one piece of work at a
time: a watch's window, one whole request. A long request therefore delays a watch by at most
itself, and a hundred queued requests delay it by one each, not a hundred. Nothing is batched
across clients yet: their video shapes and prompts differ, and the vision encoder is run per piece.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from vidsight.api.serve.media import RequestError


class Scheduler:
    """Round-robin over clients on one worker thread.

    Args:
        on_queue_time: Called with how long each piece of work waited before it started.
    """

    def __init__(self, on_queue_time: Callable[[float], None] | None = None):
        self._lines: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._ready = threading.Condition()
        self._closing = False
        self._running = 0
        self._on_queue_time = on_queue_time
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
        future: Future = Future()
        with self._ready:
            if self._closing:
                raise RequestError(503, "the server is shutting down")
            self._lines.setdefault(client, collections.deque()).append((work, future, time.perf_counter()))
            self._ready.notify()
        return future

    def close(self, timeout_s: float | None = None) -> None:
        """Finish the work running; what still waits is refused with a clear error."""
        with self._ready:
            self._closing = True
            refused = [future for line in self._lines.values() for _, future, _ in line]
            self._lines.clear()
            self._ready.notify()
        for future in refused:
            future.set_exception(RequestError(503, "the server is shutting down"))
        self._worker.join(timeout_s)

    def _next(self):
        with self._ready:
            while not self._lines and not self._closing:
                self._ready.wait()
            if not self._lines:
                return None
            client, line = next(iter(self._lines.items()))
            item = line.popleft()
            del self._lines[client]
            if line:                      # back of the rotation
                self._lines[client] = line
            self._running = 1
            return item

    def _serve(self) -> None:
        while (item := self._next()) is not None:
            work, future, queued = item
            if self._on_queue_time is not None:
                self._on_queue_time(time.perf_counter() - queued)
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as exc:  # handed to the waiting client, which reports it
                    future.set_exception(exc)
            self._running = 0

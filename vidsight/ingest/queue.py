"""A bounded queue between a source read in its own thread and a consumer that may fall behind.

While a question is answered no frame is pushed; a file can simply wait, but a camera cannot. So
the source is read in a thread into at most ``capacity`` frames: for a file the reader waits when
the queue is full (nothing is lost), for a live source the oldest queued frame is dropped and
counted (questions are about what is happening now, and a live source cannot be paused).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from vidsight.errors import ConfigError

T = TypeVar("T")
DEFAULT_CAPACITY = 256


class FrameQueue(Generic[T]):
    """Iterate ``frames`` through a bounded buffer filled by a reader thread.

    Args:
        frames: The source (e.g. a `StreamSource`); read once, in a daemon thread.
        capacity: Most items held.
        drop_oldest: When full, drop the oldest item and count it in ``dropped`` (live sources);
            otherwise the reader waits (files). A callable is asked each time the queue is full
            (a source known to be live only once opened: `StreamSource.live`).
        after_gap: Applied to the item that follows a dropped one (a frame whose motion was judged
            against a frame the consumer never sees).
        stop_source: Called by `close`, to end a source the reader may be waiting on
            (`StreamSource.close`).
    """

    def __init__(self, frames: Iterable[T], capacity: int = DEFAULT_CAPACITY,
                 drop_oldest: bool | Callable[[], bool] = False, after_gap: Callable[[T], T] | None = None,
                 stop_source: Callable[[], None] | None = None):
        if capacity < 1:
            raise ConfigError(f"queue capacity must be positive, got {capacity}")
        self.capacity, self.after_gap, self._stop_source = capacity, after_gap, stop_source
        self._drops = drop_oldest if callable(drop_oldest) else lambda: drop_oldest
        self.dropped = 0
        self._items: deque[T] = deque()
        self._ready = threading.Condition()
        self._done = self._stop = False
        self._error: BaseException | None = None
        self._reader = threading.Thread(target=self._read, args=(frames,), daemon=True, name="vidsight-frames")
        self._reader.start()

    def _read(self, frames: Iterable[T]) -> None:
        try:
            for item in frames:
                with self._ready:
                    while len(self._items) >= self.capacity and not self._drops() and not self._stop:
                        self._ready.wait()
                    if self._stop:
                        return
                    if len(self._items) >= self.capacity:
                        self._items.popleft()
                        self.dropped += 1
                        if self.after_gap is not None:
                            if self._items:
                                self._items[0] = self.after_gap(self._items[0])
                            else:
                                item = self.after_gap(item)
                    self._items.append(item)
                    self._ready.notify_all()
        except BaseException as exc:  # handed to the consumer, who raises it
            self._error = exc
        finally:
            with self._ready:
                self._done = True
                self._ready.notify_all()

    def __iter__(self) -> Iterator[T]:
        while True:
            with self._ready:
                while not self._items and not self._done:
                    self._ready.wait()
                if self._items:
                    item = self._items.popleft()
                    self._ready.notify_all()
                elif self._error is not None:
                    raise self._error
                else:
                    return
            yield item

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        """Stop reading: the reader ends at the source's next item, or when ``stop_source`` ends
        the source (one waiting inside a source that never gives another ends with the process)."""
        if self._stop_source is not None:
            self._stop_source()
        with self._ready:
            self._stop = True
            self._ready.notify_all()

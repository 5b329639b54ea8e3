"""The bounded frame queue: nothing lost from a file, oldest dropped and counted from a live source."""

import threading
import time

import pytest

from vidsight.errors import ConfigError, VideoError
from vidsight.ingest.queue import FrameQueue


def test_a_file_loses_nothing_however_slow_the_consumer():
    queue = FrameQueue(range(50), capacity=3)
    got = []
    for item in queue:
        got.append(item)
        time.sleep(0.001)
        assert len(queue) <= 3
    assert got == list(range(50)) and queue.dropped == 0


def test_a_live_source_drops_the_oldest_and_counts_them():
    produced = threading.Event()

    def camera():
        yield from range(100)
        produced.set()

    queue = FrameQueue(camera(), capacity=5, drop_oldest=True)
    produced.wait(5)  # the consumer is busy (answering) while all of it arrives
    got = list(queue)
    assert got == list(range(95, 100)) and queue.dropped == 95


@pytest.mark.parametrize("capacity, expected", [(4, [-6, 7, 8, 9]), (1, [-9])])
def test_the_item_after_dropped_ones_is_marked(capacity, expected):
    produced = threading.Event()

    def camera():
        yield from range(10)
        produced.set()

    queue = FrameQueue(camera(), capacity=capacity, drop_oldest=True, after_gap=lambda item: -item)
    produced.wait(5)  # all of it arrives while the consumer is busy
    assert list(queue) == expected and queue.dropped == 10 - capacity


def test_the_readers_error_reaches_the_consumer():
    def broken():
        yield 1
        raise VideoError("cam: stream failed")

    with pytest.raises(VideoError, match="stream failed"):
        list(FrameQueue(broken()))
    with pytest.raises(ConfigError):
        FrameQueue([], capacity=0)


def test_closing_stops_the_source_the_reader_waits_on():
    stopped = threading.Event()

    def camera():   # gives one frame, then waits until it is stopped (a stalled network read)
        yield 0
        stopped.wait(5)
        yield 1

    queue = FrameQueue(camera(), capacity=4, drop_oldest=True, stop_source=stopped.set)
    assert next(iter(queue)) == 0
    queue.close()
    assert stopped.is_set()
    queue._reader.join(5)
    assert not queue._reader.is_alive()

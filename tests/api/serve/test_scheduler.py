"""The model thread serves clients in turn, and refuses what still waits when it closes."""

import threading

import pytest

from vidsight.api.serve.media import RequestError
from vidsight.api.serve.scheduler import Scheduler


def test_clients_take_turns_one_piece_of_work_each():
    scheduler = Scheduler()
    gate, order = threading.Event(), []
    started = threading.Event()
    blocker = scheduler.submit("first", lambda: started.set() or gate.wait())   # holds the worker
    assert started.wait(10)
    futures = [scheduler.submit(client, lambda c=client, k=k: order.append(f"{c}{k}"))
               for client, count in (("a", 3), ("b", 1), ("c", 2)) for k in range(count)]
    assert scheduler.waiting == 6
    gate.set()
    for future in [blocker, *futures]:
        future.result(timeout=10)
    assert order == ["a0", "b0", "c0", "a1", "c1", "a2"]
    scheduler.close()


def test_closing_finishes_the_running_work_and_refuses_the_rest():
    scheduler = Scheduler()
    gate = threading.Event()
    started = threading.Event()
    running = scheduler.submit("a", lambda: (started.set(), gate.wait()) and "finished")
    assert started.wait(10)
    waiting = scheduler.submit("b", lambda: "never")
    closer = threading.Thread(target=scheduler.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert running.result(timeout=10) == "finished"
    with pytest.raises(RequestError, match="shutting down"):
        waiting.result(timeout=10)
    with pytest.raises(RequestError, match="shutting down"):
        scheduler.submit("c", lambda: None)

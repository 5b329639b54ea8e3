"""A turn of stream work: watch windows and session frames (`engine.steps`) run together."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from vidsight.api.serve.answers import RunningAnswers
from vidsight.engine.batch import Chunk, forward_packed
from vidsight.engine.steps import EncodeRequest, Stepped


def run_stepped(work: list[tuple[Stepped, Future]], encode: Callable[[list[EncodeRequest]], list],
                answers: RunningAnswers | None, on_batch: Callable[[int], None] | None = None) -> bool:
    """Stepped work run together: each to the point where it needs its new frames encoded, their
    encodings in one vision call, then their chunks in one language-model pass with the running
    answers' decode step; each future gets its work's result.

    Args:
        work: Each piece's steps and the future its client waits on.
        encode: Encodes a list of requests at once.
        answers: The running answers (None: a scheduler that generates none).
        on_batch: Called with the size of the vision batch.

    Returns:
        Whether the running answers took their step.
    """
    waiting, chunks = [], []   # (steps, future, request) paused at their encoding, at a chunk
    for steps, future in work:
        if not future.set_running_or_notify_cancel():
            continue
        try:
            request = next(steps)
        except StopIteration as stop:
            future.set_result(stop.value)
            continue
        except BaseException as exc:
            future.set_exception(exc)
            continue
        (chunks if isinstance(request, Chunk) else waiting).append((steps, future, request))
    if waiting and on_batch is not None:
        on_batch(len(waiting))
    try:
        encoded = encode([request for _, _, request in waiting]) if waiting else []
    except BaseException as exc:
        for steps, future, _ in waiting:
            steps.close()
            future.set_exception(exc)
        encoded, waiting = [], []
    for (steps, future, _), embeds in zip(waiting, encoded):
        _resume(steps, future, embeds, chunks, encode)
    return _run_chunks(chunks, encode, answers)


def _resume(steps: Stepped, future: Future, sent, chunks: list, encode) -> None:
    """Run stepped work on from ``sent`` to its result, encoding any further request alone,
    or to its next chunk (added to ``chunks``)."""
    try:
        request = steps.send(sent)
        while not isinstance(request, Chunk):
            request = steps.send(encode([request])[0])
    except StopIteration as stop:
        future.set_result(stop.value)
        return
    except BaseException as exc:   # handed to the waiting client, which reports it
        future.set_exception(exc)
        return
    chunks.append((steps, future, request))


def _run_chunks(chunks: list, encode, answers: RunningAnswers | None) -> bool:
    """Every chunk of stepped work in one pass (the first with the running answers' decode step),
    until each has its result; whether the answers took their step."""
    stepped = False
    while chunks:
        try:
            if answers is None:
                raise TypeError("stepped work with chunks needs a scheduler built with decode=")
            packed = [chunk for _, _, chunk in chunks]
            if answers and not stepped:
                hidden, stepped = answers.step(beside=packed), True
            elif len(packed) == 1:   # as when it runs alone, to the bit
                hidden = [packed[0].run(answers.adapter)]
            else:
                hidden = forward_packed(answers.adapter, packed)
        except BaseException as exc:   # the pass failed for every piece of work in it
            for steps, future, _ in chunks:
                steps.close()
                future.set_exception(exc)
            return stepped
        pending, chunks = chunks, []
        for (steps, future, _), states in zip(pending, hidden):
            _resume(steps, future, states, chunks, encode)
    return stepped

"""Answering ``POST /v1/chat/completions``: ``n`` answers to one request, whole or streamed as
OpenAI's chunks (each chunk names its answer's ``index``), and vLLM's structured-output choice.

The ``n`` answers are sampled with seeds ``seed``, ``seed + 1``, ... (so answer ``i`` is what the
request with ``n = 1`` and ``seed + i`` gets) and decoded together in the answer batch. Their
video is prefilled once when the prefix cache is on (`PrefixCache`: the first answer claims the
prefill, the others wait for its prefix and prefill only the conversation after the video); with
KV pruning or without the cache each answer prefills the video itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time

from fastapi.responses import StreamingResponse

from vidsight.api.serve.media import RequestError, public_message, video_file
from vidsight.api.serve.deltas import StreamedAnswer, message_of
from vidsight.api.serve.openai_api import ChatCompletionRequest, chunk, completion, completion_id, usage_of
from vidsight.api.serve.state import Server
from vidsight.api.serve.tenants import Tenant
from vidsight.api.serve.tools import ToolChoice
from vidsight.errors import ConfigError, VidsightError
from vidsight.models.conversation import Conversation


def status_of(exc: VidsightError) -> int:
    if isinstance(exc, RequestError):
        return exc.status
    return 422 if isinstance(exc, ConfigError) else 400


def error_body(status: int, message: str) -> dict:
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 410: "not_found_error",
            413: "request_too_large", 429: "rate_limit_error", 503: "service_unavailable",
            504: "timeout"}.get(status, "invalid_request_error")
    return {"error": {"message": public_message(message), "type": kind, "code": status}}


def sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def complete(server: Server, tenant: Tenant, body: ChatCompletionRequest, video: str | None,
                   conversation: Conversation, sampling, generation, prefill, tools: ToolChoice):
    """Answer one chat completion (``body.n`` answers, which hold ``n`` of the server's places and
    count as ``n`` of ``tenant``'s requests), streamed as OpenAI's chunks or whole; each answer's
    tool calls read as ``tools`` says."""
    from vidsight.engine.generate import token_logprobs

    metrics, name, request_id = server.metrics, server.config.served_name, completion_id()
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()   # (answer index, "text" or "done", payload)
    first: list[float] = []
    # Each answer once prefilled, and how many of its tokens' log probabilities went out: each text
    # piece carries those of the tokens it came from (called on the model thread, after prefill).
    begun: list = [None] * body.n
    sent = [0] * body.n
    tickets: list[list] = [[] for _ in range(body.n)]

    def on_text_of(index: int):
        def on_text(text: str) -> None:
            if not first:
                first.append(time.perf_counter())
            logprobs = None
            if generation.logprobs is not None and begun[index] is not None:
                logprobs = token_logprobs(server.adapter, begun[index].answer, sent[index])
                sent[index] += len(logprobs)
            loop.call_soon_threadsafe(pieces.put_nowait, (index, "text", (text, logprobs)))
        return on_text

    def begin_of(index: int, path):
        settings = dataclasses.replace(generation, seed=generation.seed + index)

        def begin():
            progress = yield from server.asker.begin_steps(path, conversation, sampling=sampling, generation=settings,
                                                           prefill=prefill, on_text=on_text_of(index))
            begun[index] = progress
            return progress
        return begin

    exits = contextlib.AsyncExitStack()
    await exits.__aenter__()
    try:
        exits.enter_context(server.admit(body.n))
        exits.enter_context(server.requests.admit(tenant, body.n - 1))
        path = await exits.enter_async_context(video_file(video, server.config, conversation.still))
        works = []
        for index in range(body.n):
            work = asyncio.ensure_future(server.run_answer(begin_of(index, path), tickets[index].append))
            work.add_done_callback(lambda done, index=index: pieces.put_nowait((index, "done", None)))
            works.append(work)
        # A client that goes away ends its answers at the next decode step.
        exits.callback(lambda: [ticket.cancel() for held, work in zip(tickets, works) if not work.done() for ticket in held])
        if not body.stream:
            results = await asyncio.gather(*works)
            await exits.aclose()
            return completion(request_id, name, [(*message_of(r, tools), r.logprobs) for r in results],
                              account(metrics, results, started, first))
        # The first piece (or a failure) comes before the response starts, so a bad video still
        # gets its HTTP status.
        head = await pieces.get()
        if head[1] == "done":
            works[head[0]].result()   # raises the failure, if any
    except BaseException:
        await exits.aclose()
        metrics.finished("error")
        raise

    # Each answer's text as deltas (made at its first piece, when the answer knows whether it
    # began in a reasoning model's thinking).
    streamed: list[StreamedAnswer | None] = [None] * body.n

    def deltas(index: int, text: str, final: bool = False) -> dict:
        if streamed[index] is None:
            streamed[index] = StreamedAnswer(tools, generation.reasoning_parser,
                                             bool(begun[index].answer.starts_thinking))
        return streamed[index].feed(text, final)

    async def events():
        try:
            for index in range(body.n):
                yield sse(chunk(request_id, name, {"role": "assistant", "content": ""}, index=index))
            pending, finished = [head], 0
            while finished < body.n:
                index, kind, piece = pending.pop() if pending else await pieces.get()
                if kind == "text":
                    text, logprobs = piece
                    delta = deltas(index, text)
                    if delta or logprobs:
                        yield sse(chunk(request_id, name, delta, logprobs=logprobs, index=index))
                    continue
                result = await works[index]
                # What was held back (a tag's start), then the last tokens' log probabilities (text
                # held back, then a stop string or nothing).
                held = deltas(index, "", final=True)
                if held:
                    yield sse(chunk(request_id, name, held, index=index))
                rest = None if result.logprobs is None else result.logprobs[sent[index]:]
                yield sse(chunk(request_id, name, {}, streamed[index].finish_reason(result.finish_reason),
                                logprobs=rest, index=index))
                finished += 1
            usage = account(metrics, [work.result() for work in works], started, first)
            if (body.stream_options or {}).get("include_usage"):
                yield sse(chunk(request_id, name, {}, usage=usage))
        except VidsightError as exc:
            yield sse({"error": error_body(status_of(exc), str(exc))["error"]})
        finally:
            await exits.aclose()
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def choose(server: Server, body: ChatCompletionRequest, video: str | None, conversation: Conversation, sampling,
                 prefill, choices: list[str]):
    """Answer with the likeliest of ``choices`` (vLLM's structured-output choice): each scored after
    one prefill of the video and conversation (`Asker.score_steps`: the prefill preemptible as a
    completion's, the scoring in the decode batch), the reply whole or as one piece."""
    name, request_id, started = server.config.served_name, completion_id(), time.perf_counter()
    try:
        with server.admit():
            async with video_file(video, server.config, conversation.still) as path:
                def begin():
                    return (yield from server.asker.score_steps(path, conversation, choices, sampling=sampling,
                                                                prefill=prefill))

                result = await server.run_answer(begin)
    except BaseException:
        server.metrics.finished("error")
        raise
    best = result.scores[result.best]
    usage = account(server.metrics, [result], started, [])
    usage.update(completion_tokens=len(best.tokens), total_tokens=usage["prompt_tokens"] + len(best.tokens))
    if not body.stream:
        return completion(request_id, name, [({"role": "assistant", "content": best.text}, "stop", None)], usage)

    async def events():
        yield sse(chunk(request_id, name, {"role": "assistant", "content": ""}))
        yield sse(chunk(request_id, name, {"content": best.text}))
        yield sse(chunk(request_id, name, {}, "stop"))
        if (body.stream_options or {}).get("include_usage"):
            yield sse(chunk(request_id, name, {}, usage=usage))
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def account(metrics, results: list, started: float, first: list[float]) -> dict:
    """Count a request's answers in the metrics (the model work of each); its ``usage``: the prompt
    once, as OpenAI counts it, and every answer's tokens."""
    metrics.e2e_latency.observe(time.perf_counter() - started)
    metrics.time_to_first_token.observe((first[0] if first else time.perf_counter()) - started)
    for stats in (result.stats for result in results):
        metrics.prompt_tokens.inc(stats.prompt_tokens)
        metrics.generation_tokens.inc(stats.generated_tokens)
        metrics.visual_tokens.inc(stats.visual_tokens)
        metrics.visual_tokens_pruned.inc(stats.visual_tokens - stats.kept_visual_tokens)
        metrics.frames_decoded.inc(stats.frames)
    metrics.finished("stop")
    usage = usage_of(results[0].stats)
    completion_tokens = sum(result.stats.generated_tokens for result in results)
    usage.update(completion_tokens=completion_tokens, total_tokens=usage["prompt_tokens"] + completion_tokens)
    return usage

"""The HTTP API: OpenAI-compatible chat completions over video, watches with Server-Sent Events,
Prometheus metrics and a dashboard."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from importlib import resources
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from vidsight.api.serve.config import ServeConfig
from vidsight.api.serve.media import RequestError, video_file
from vidsight.api.serve.openai_api import (ChatCompletionRequest, chunk, completion, completion_id,
                                           usage_of)
from vidsight.api.serve.session_routes import add_session_routes
from vidsight.api.serve.state import Server
from vidsight.api.serve.tenants import OPEN, Tenant, identify
from vidsight.api.serve.watch_routes import add_watch_routes
from vidsight.api.settings import ask_configs
from vidsight.errors import ConfigError, VidsightError
from vidsight.models.conversation import Conversation

if TYPE_CHECKING:
    from vidsight.models.base import VLMAdapter


def create_app(config: ServeConfig, adapter: VLMAdapter | None = None, owner: str | None = None) -> FastAPI:
    """The server's ASGI app; the model loads (unless ``adapter`` is given) when the app starts.

    ``owner`` names the server among several sharing one store (`Server`).
    """
    server = Server(config, adapter, owner)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.start()
        try:
            yield
        finally:
            server.stop()

    app = FastAPI(title="vidsight", version="0.1.0", lifespan=lifespan)
    app.state.server = server
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    _add_error_handlers(app)

    def authorised(request: Request) -> Tenant:
        return check_api_key(config, request.headers.get("authorization", ""))

    async def admitted(tenant: Tenant = Depends(authorised)):
        with server.requests.admit(tenant):
            yield tenant

    guarded = [Depends(admitted)]

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        server.metrics.running.set(server.scheduler.running)
        server.metrics.waiting.set(server.scheduler.waiting)
        for tier, nbytes in server.sessions.kv_bytes_by_tier().items():
            server.metrics.kv_tier(tier).set(nbytes)
        return Response(server.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def dashboard():
        return resources.files("vidsight.api.serve").joinpath("static/index.html").read_text()

    @app.get("/v1/models", dependencies=guarded)
    async def models():
        return {"object": "list", "data": [{"id": config.served_name, "object": "model", "created": 0,
                                            "owned_by": "vidsight"}]}

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(body: ChatCompletionRequest):
        if body.model is not None and body.model != config.served_name:
            raise RequestError(404, f"the model {body.model!r} does not exist here; this server serves "
                                    f"{config.served_name!r}")
        video, conversation = body.video_and_conversation()
        sampling, generation, prefill = ask_configs(body.ask_options())
        choices = body.choices()
        if choices is not None:
            return await _choose(server, body, video, conversation, sampling, prefill, choices)
        return await _complete(server, body, video, conversation, sampling, generation, prefill)

    add_watch_routes(app, server, admitted, authorised)
    add_session_routes(app, server, admitted)
    return app


def check_api_key(config: ServeConfig, authorization: str) -> Tenant:
    """The tenant whose key the ``Authorization`` header carries (the open tenant on a server
    without keys); 401 for a missing or wrong key."""
    keys = config.keys
    if not keys:
        return OPEN
    tenant = identify(keys, authorization)
    if tenant is None:
        raise RequestError(401, "a missing or wrong API key (send Authorization: Bearer KEY)")
    return tenant


async def _complete(server: Server, body: ChatCompletionRequest, video: str, conversation: Conversation, sampling,
                    generation, prefill):
    """Answer one chat completion, streamed as OpenAI's chunks or whole."""
    from vidsight.engine.generate import token_logprobs

    metrics, name, request_id = server.metrics, server.config.served_name, completion_id()
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()
    first = []
    # The answer once prefilled, and how many of its tokens' log probabilities went out: each text
    # piece carries those of the tokens it came from (called on the model thread, after prefill).
    begun, sent = [], [0]

    def on_text(text: str) -> None:
        if not first:
            first.append(time.perf_counter())
        logprobs = None
        if generation.logprobs is not None and begun:
            logprobs = token_logprobs(server.adapter, begun[0].answer, sent[0])
            sent[0] += len(logprobs)
        loop.call_soon_threadsafe(pieces.put_nowait, ("text", (text, logprobs)))

    def begin():
        progress = yield from server.asker.begin_steps(path, conversation, sampling=sampling, generation=generation,
                                                       prefill=prefill, on_text=on_text)
        begun.append(progress)
        return progress

    exits = contextlib.AsyncExitStack()
    await exits.__aenter__()
    try:
        exits.enter_context(server.admit())
        path = await exits.enter_async_context(video_file(video, server.config))
        tickets = []
        work = asyncio.ensure_future(server.run_answer(begin, tickets.append))
        work.add_done_callback(lambda done: pieces.put_nowait(("done", None)))
        # A client that goes away ends its answer at the next decode step.
        exits.callback(lambda: tickets and not work.done() and tickets[0].cancel())
        if not body.stream:
            result = await work
            await exits.aclose()
            return completion(request_id, name, result.answer, result.finish_reason,
                              _account(metrics, result, started, first), result.logprobs)
        # The answer's first piece (or its failure) comes before the response starts, so a bad
        # video still gets its HTTP status.
        head = await pieces.get()
        if head[0] == "done":
            work.result()   # raises the failure, if any
    except BaseException:
        await exits.aclose()
        metrics.finished("error")
        raise

    async def events():
        try:
            yield _sse(chunk(request_id, name, {"role": "assistant", "content": ""}))
            pending = [head]
            while True:
                kind, piece = pending.pop() if pending else await pieces.get()
                if kind == "done":
                    break
                text, logprobs = piece
                yield _sse(chunk(request_id, name, {"content": text}, logprobs=logprobs))
            result = await work
            usage = _account(metrics, result, started, first)
            # The last tokens' log probabilities (text held back, then a stop string or nothing).
            rest = None if result.logprobs is None else result.logprobs[sent[0]:]
            yield _sse(chunk(request_id, name, {}, result.finish_reason, logprobs=rest))
            if (body.stream_options or {}).get("include_usage"):
                yield _sse(chunk(request_id, name, {}, usage=usage))
        except VidsightError as exc:
            yield _sse({"error": _error_body(_status(exc), str(exc))["error"]})
        finally:
            await exits.aclose()
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def _choose(server: Server, body: ChatCompletionRequest, video: str, conversation: Conversation, sampling,
                  prefill, choices: list[str]):
    """Answer with the likeliest of ``choices`` (vLLM's structured-output choice): each scored after
    one prefill of the video and conversation (`Asker.score_steps`: the prefill preemptible as a
    completion's, the scoring in the decode batch), the reply whole or as one piece."""
    name, request_id, started = server.config.served_name, completion_id(), time.perf_counter()
    try:
        with server.admit():
            async with video_file(video, server.config) as path:
                def begin():
                    return (yield from server.asker.score_steps(path, conversation, choices, sampling=sampling,
                                                                prefill=prefill))

                result = await server.run_answer(begin)
    except BaseException:
        server.metrics.finished("error")
        raise
    best = result.scores[result.best]
    usage = _account(server.metrics, result, started, [])
    usage.update(completion_tokens=len(best.tokens), total_tokens=usage["prompt_tokens"] + len(best.tokens))
    if not body.stream:
        return completion(request_id, name, best.text, "stop", usage)

    async def events():
        yield _sse(chunk(request_id, name, {"role": "assistant", "content": ""}))
        yield _sse(chunk(request_id, name, {"content": best.text}))
        yield _sse(chunk(request_id, name, {}, "stop"))
        if (body.stream_options or {}).get("include_usage"):
            yield _sse(chunk(request_id, name, {}, usage=usage))
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _account(metrics, result, started: float, first: list[float]) -> dict:
    stats = result.stats
    metrics.e2e_latency.observe(time.perf_counter() - started)
    metrics.time_to_first_token.observe((first[0] if first else time.perf_counter()) - started)
    metrics.prompt_tokens.inc(stats.prompt_tokens)
    metrics.generation_tokens.inc(stats.generated_tokens)
    metrics.visual_tokens.inc(stats.visual_tokens)
    metrics.visual_tokens_pruned.inc(stats.visual_tokens - stats.kept_visual_tokens)
    metrics.frames_decoded.inc(stats.frames)
    metrics.finished("stop")
    return usage_of(stats)


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _status(exc: VidsightError) -> int:
    if isinstance(exc, RequestError):
        return exc.status
    return 422 if isinstance(exc, ConfigError) else 400


def _error_body(status: int, message: str) -> dict:
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 410: "not_found_error",
            413: "request_too_large", 429: "rate_limit_error", 503: "service_unavailable",
            504: "timeout"}.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "code": status}}


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(VidsightError)
    async def refused(request: Request, exc: VidsightError):
        status = _status(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(_error_body(status, str(exc)), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
                             for e in exc.errors())
        return JSONResponse(_error_body(422, f"malformed request: {problems}"), status_code=422)


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Refuses a request body over ``limit`` bytes with 413, whether or not it declares its length."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, receive, send)
        received, started = 0, False

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _TooLarge
            return message

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _TooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send):
        body = _error_body(413, f"the request body is over the {self.limit}-byte cap")
        await JSONResponse(body, status_code=413)(scope, receive, send)

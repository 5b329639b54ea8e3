"""The HTTP API: OpenAI-compatible chat completions over video, watches with Server-Sent Events,
Prometheus metrics and a dashboard."""

from __future__ import annotations

import contextlib
from importlib import resources
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from vidsight.api.serve.completions import choose, complete, error_body, status_of
from vidsight.api.serve.config import ServeConfig
from vidsight.api.serve.media import RequestError
from vidsight.api.serve.openai_api import ChatCompletionRequest
from vidsight.api.serve.session_routes import add_session_routes
from vidsight.api.serve.state import Server
from vidsight.api.serve.tenants import OPEN, Tenant, identify
from vidsight.api.serve.tools import tool_choice
from vidsight.api.serve.watch_routes import add_watch_routes
from vidsight.api.settings import ask_configs
from vidsight.errors import VidsightError

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
                                            "owned_by": "vidsight", "max_model_len": server.adapter.context_window}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, tenant: Tenant = Depends(admitted)):
        if body.model is not None and body.model != config.served_name:
            raise RequestError(404, f"the model {body.model!r} does not exist here; this server serves "
                                    f"{config.served_name!r}")
        video, conversation = body.video_and_conversation(config.default_chat_template_kwargs)
        if conversation.still and server.adapter.still_vision is None:
            raise RequestError(400, f"{config.served_name}: vidsight does not show a {server.adapter.family} model an "
                                    "image (its image processor tiles pictures its own way); send it as a video_url")
        tools = tool_choice(body.tools, body.tool_choice, config.tool_call_parser, body.parallel_tool_calls)
        sampling, generation, prefill = ask_configs({**server.sampling_defaults, **body.ask_options(tools),
                                                     "reasoning_parser": config.reasoning_parser}, until_context=True)
        choices = body.choices()
        if choices is not None:
            if tools.mode != "none":
                raise RequestError(400, "choice answers with one of the answers given, not with tool calls")
            return await choose(server, body, video, conversation, sampling, prefill, choices)
        return await complete(server, tenant, body, video, conversation, sampling, generation, prefill, tools)

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


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(VidsightError)
    async def refused(request: Request, exc: VidsightError):
        status = status_of(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(error_body(status, str(exc)), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
                             for e in exc.errors())
        return JSONResponse(error_body(422, f"malformed request: {problems}"), status_code=422)


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
        body = error_body(413, f"the request body is over the {self.limit}-byte cap")
        await JSONResponse(body, status_code=413)(scope, receive, send)

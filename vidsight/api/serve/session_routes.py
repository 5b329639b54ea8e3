"""``/v1/sessions``: chat over a stream; each answer comes as Server-Sent Events."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from vidsight.api.serve.deltas import StreamedAnswer
from vidsight.api.serve.formats import format_settings
from vidsight.api.serve.media import RequestError
from vidsight.api.serve.sampling_fields import SamplingFields
from vidsight.api.serve.tenants import Tenant
from vidsight.api.serve.tools import ToolChoice


class SessionRequest(BaseModel):
    """``POST /v1/sessions``; defaults as `vidsight chat`'s."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1)
    policy: str = "full"
    settings: dict[str, Any] = Field(default_factory=dict, description="the policy's settings by field, "
                                                                       "e.g. {'top_frames': 16}")
    fps: float = Field(default=1.0, gt=0)
    batch_patches: int = Field(default=1, ge=1)
    system: str | None = Field(default=None, description="a system message before the stream (default: the "
                                                         "chat template's own)")
    realtime: bool = False
    kv_device_budget: int | None = Field(default=None, ge=1, description="cached tokens (summed over layers) the "
                                         "device keeps; the rest moves to host memory (`vidsight chat`'s flag)")
    kv_host_budget: int | None = Field(default=None, ge=1, description="cached tokens host memory keeps; the rest "
                                       "moves to the server's --kv-disk, or is evicted")


class MessageRequest(SamplingFields):
    """``POST /v1/sessions/{id}/messages``: a question, its answer's length, sampling and format
    (the chat completion's fields by the same names)."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1)
    max_tokens: int = Field(default=64, ge=1, le=32768)
    stream: bool = True
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None

    def generation(self, defaults: dict):
        """The answer's `GenerationConfig`, its sampling ``defaults`` the server's (`Server.sampling_defaults`)."""
        from vidsight.api.settings import generation_config

        if "choice" in (self.structured_outputs or {}):
            raise RequestError(400, "a session's answer is generated; structured_outputs.choice is not supported here")
        given = {"max_new_tokens": self.max_tokens, **self.sampling_options()}
        return generation_config({**defaults, **{name: value for name, value in given.items() if value is not None},
                                  **format_settings(self.response_format, self.structured_outputs, {}, False)})


def add_session_routes(app: FastAPI, server, admitted) -> None:
    """The session routes; ``admitted`` gives a request's tenant (counted among its requests)."""

    @app.post("/v1/sessions", status_code=201)
    async def open_session(body: SessionRequest, tenant: Tenant = Depends(admitted)):
        if tenant.max_sessions is not None:
            open_now = sum(s.get("tenant") == tenant.name for s in server.sessions.all())
            if open_now >= tenant.max_sessions:
                raise RequestError(429, f"tenant {tenant.name}: {open_now} sessions open, its limit "
                                        f"(sessions={tenant.max_sessions})")
        return await asyncio.to_thread(server.sessions.open, {**body.model_dump(), "tenant": tenant.name})

    @app.get("/v1/sessions")
    async def list_sessions(tenant: Tenant = Depends(admitted)):
        return {"object": "list", "data": [s for s in server.sessions.all() if tenant.sees(s)]}

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str, tenant: Tenant = Depends(admitted)):
        return _visible(server, session_id, tenant).record()

    @app.delete("/v1/sessions/{session_id}")
    async def close_session(session_id: str, tenant: Tenant = Depends(admitted)):
        _visible(server, session_id, tenant)
        return await asyncio.to_thread(server.sessions.close, session_id)

    @app.post("/v1/sessions/{session_id}/messages")
    async def message(session_id: str, body: MessageRequest, tenant: Tenant = Depends(admitted)):
        session = _visible(server, session_id, tenant)
        generation = dataclasses.replace(body.generation(server.sampling_defaults),
                                         reasoning_parser=server.config.reasoning_parser)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()   # each piece's text event, as {"content"} or {"reasoning"}
        tickets, begun, parted = [], [], []

        def begin(on_text):
            progress = yield from session.chat.asking(body.question, generation, on_text=on_text)
            begun.append(progress)
            return progress

        def deltas(text: str, final: bool = False) -> list[dict]:
            """A piece of the answer's text as text events (a reasoning model's thinking apart)."""
            if not parted:   # at the first piece, when the answer knows whether it began thinking
                parted.append(StreamedAnswer(ToolChoice("none"), generation.reasoning_parser,
                                             bool(begun[0].answer.starts_thinking)))
            delta = parted[0].feed(text, final)
            return [{key: delta[key]} for key in ("reasoning", "content") if key in delta]

        async def answer(on_text=None):
            # Prefilled and generated beside other answers; the session takes no frames meanwhile.
            result = await server.run_answer(lambda: begin(on_text), tickets.append, client=session.id)
            record = result.to_dict()
            record["stats"]["frames_dropped"] = session.frames.dropped
            return record

        def give_up(work) -> None:
            """A client gone before its answer: the answer ends at the next decode step, its turn not kept."""
            if tickets and (not work.done() or work.cancelled()):
                tickets[0].cancel()

        if not body.stream:
            work = asyncio.ensure_future(answer())
            try:
                return await work
            finally:
                give_up(work)
        work = asyncio.ensure_future(answer(lambda text: loop.call_soon_threadsafe(pieces.put_nowait, text)))
        work.add_done_callback(lambda done: pieces.put_nowait(None))
        # Wait for the first piece (or the refusal) so a refused question gets its HTTP status.
        first = await pieces.get()
        if first is None:
            work.result()

        async def events():
            try:
                text = first
                while text is not None:
                    for event in deltas(text):
                        yield f"event: text\ndata: {json.dumps(event)}\n\n"
                    text = await pieces.get()
                record = await work
                for event in deltas("", final=True) if begun else ():
                    yield f"event: text\ndata: {json.dumps(event)}\n\n"
                yield f"event: answer\ndata: {json.dumps(record)}\n\n"
            finally:
                give_up(work)

        return StreamingResponse(events(), media_type="text/event-stream")


def _visible(server, session_id: str, tenant: Tenant):
    """The session if ``tenant`` may see it; 404 otherwise, as for a session that is not there."""
    session = server.sessions.get(session_id)
    if not tenant.sees(session.spec):
        raise RequestError(404, f"no chat session {session_id!r} (sessions end with the server process)")
    return session

"""``/v1/sessions``: chat over a stream; each answer comes as Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field


class SessionRequest(BaseModel):
    """``POST /v1/sessions``; defaults as `vidsight chat`'s."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1)
    policy: str = "full"
    settings: dict[str, Any] = Field(default_factory=dict, description="the policy's settings by field, "
                                                                       "e.g. {'top_frames': 16}")
    fps: float = Field(default=1.0, gt=0)
    batch_patches: int = Field(default=1, ge=1)
    realtime: bool = False


class MessageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1)
    max_tokens: int = Field(default=64, ge=1, le=32768)
    stream: bool = True


def add_session_routes(app: FastAPI, server, guarded) -> None:
    @app.post("/v1/sessions", dependencies=guarded, status_code=201)
    async def open_session(body: SessionRequest):
        return await asyncio.to_thread(server.sessions.open, body.model_dump())

    @app.get("/v1/sessions", dependencies=guarded)
    async def list_sessions():
        return {"object": "list", "data": server.sessions.all()}

    @app.get("/v1/sessions/{session_id}", dependencies=guarded)
    async def get_session(session_id: str):
        return server.sessions.get(session_id).record()

    @app.delete("/v1/sessions/{session_id}", dependencies=guarded)
    async def close_session(session_id: str):
        return await asyncio.to_thread(server.sessions.close, session_id)

    @app.post("/v1/sessions/{session_id}/messages", dependencies=guarded)
    async def message(session_id: str, body: MessageRequest):
        from vidsight.engine.config import GenerationConfig

        session = server.sessions.get(session_id)
        generation = GenerationConfig(max_new_tokens=body.max_tokens)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()

        def answer(on_text=None):
            result = session.chat.ask(body.question, generation, on_text=on_text)
            record = result.to_dict()
            record["stats"]["frames_dropped"] = session.frames.dropped
            return record

        if not body.stream:
            return await server.run_model(answer, client=session.id)
        work = asyncio.ensure_future(server.run_model(
            lambda: answer(lambda text: loop.call_soon_threadsafe(pieces.put_nowait, text)), client=session.id))
        work.add_done_callback(lambda done: pieces.put_nowait(None))
        # Wait for the first piece (or the refusal) so a refused question gets its HTTP status.
        first = await pieces.get()
        if first is None:
            work.result()

        async def events():
            text = first
            while text is not None:
                yield f"event: text\ndata: {json.dumps({'content': text})}\n\n"
                text = await pieces.get()
            yield f"event: answer\ndata: {json.dumps(await work)}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

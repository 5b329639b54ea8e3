"""``/v1/watches``: standing queries over streams, their verdicts as Server-Sent Events."""

from __future__ import annotations

import asyncio
import io
import json

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from vidsight.api.serve.media import RequestError
from vidsight.api.serve.store import RUNNING
from vidsight.api.serve.tenants import Tenant

# How often an events stream looks for new events in the store (shared by every replica).
POLL_S = 0.2
FINAL_EVENTS = ("end", "error")


class WatchRequest(BaseModel):
    """``POST /v1/watches``; defaults are CodecSight's, as in `vidsight watch`."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1)
    query: str = Field(min_length=1)
    window_s: float = Field(default=40.0, gt=0)
    stride: float = Field(default=0.2, gt=0, le=1)
    fps: float = Field(default=2.0, gt=0)
    align_windows: bool | None = None       # None: the config's default, as for the two below
    refresh: str = "full-comp"
    refresh_share: float | None = Field(default=None, gt=0, le=1)
    prune_tau: float | None = Field(default=None, ge=0)
    prune_alpha: float | None = Field(default=None, ge=0)
    prune_rule: str | None = None
    motion_source: str | None = None
    alert_after: int = Field(default=2, ge=1)
    catch_up: bool | None = None            # None: the config's default (a live watch keeps up)
    webhook_url: str | None = Field(default=None, pattern=r"^https?://")
    realtime: bool = False


def add_watch_routes(app: FastAPI, server, admitted, authorised) -> None:
    """The watch routes; ``admitted`` gives a request's tenant and counts it among its requests in
    progress, ``authorised`` only gives it (event streams, long-lived, are not counted)."""

    @app.post("/v1/watches", status_code=201)
    async def start_watch(body: WatchRequest, tenant: Tenant = Depends(admitted)):
        if tenant.max_watches is not None:
            running = sum(w["state"] == RUNNING and w.get("tenant") == tenant.name for w in server.store.watches())
            if running >= tenant.max_watches:
                raise RequestError(429, f"tenant {tenant.name}: {running} watches running, its limit "
                                        f"(watches={tenant.max_watches})")
        watch_id = await asyncio.to_thread(server.watches.start, {**body.model_dump(), "tenant": tenant.name})
        return server.store.watch(watch_id)

    @app.get("/v1/watches")
    async def list_watches(tenant: Tenant = Depends(admitted)):
        return {"object": "list", "data": [w for w in server.store.watches() if tenant.sees(w)]}

    @app.get("/v1/watches/{watch_id}")
    async def get_watch(watch_id: str, tenant: Tenant = Depends(admitted)):
        return _found(server, watch_id, tenant)

    @app.delete("/v1/watches/{watch_id}")
    async def stop_watch(watch_id: str, tenant: Tenant = Depends(admitted)):
        _found(server, watch_id, tenant)
        await asyncio.to_thread(server.watches.stop, watch_id, 30.0)
        return server.store.watch(watch_id)

    @app.get("/v1/watches/{watch_id}/verdicts")
    async def verdicts(watch_id: str, tenant: Tenant = Depends(admitted)):
        _found(server, watch_id, tenant)
        return {"object": "list", "data": server.store.verdicts(watch_id)}

    @app.get("/v1/watches/{watch_id}/frame.jpg")
    async def latest_frame(watch_id: str, tenant: Tenant = Depends(admitted)):
        _found(server, watch_id, tenant)
        frame = server.watches.latest_frame(watch_id)
        if frame is None:
            raise RequestError(404, f"watch {watch_id} has judged no window in this server's life yet")
        return Response(_jpeg(frame), media_type="image/jpeg")

    @app.get("/v1/watches/{watch_id}/events")
    async def events(watch_id: str, request: Request, last_event_id: int | None = None,
                     tenant: Tenant = Depends(authorised)):
        _found(server, watch_id, tenant)
        header = request.headers.get("last-event-id", "")
        after = int(header) if header.isdigit() else (last_event_id or 0)
        return StreamingResponse(_events(server, watch_id, after, request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})


def _found(server, watch_id: str, tenant: Tenant) -> dict:
    """The watch's record if ``tenant`` may see it; 404 otherwise, as for a watch that is not there."""
    record = server.store.watch(watch_id)
    if record is None or not tenant.sees(record):
        raise RequestError(404, f"no watch {watch_id!r}")
    return record


async def _events(server, watch_id: str, after: int, request: Request):
    """Every stored event after ``after``, then new ones as they are stored, until the watch ends."""
    while True:
        batch = await asyncio.to_thread(server.store.events, watch_id, after)
        for event in batch:
            after = event["id"]
            yield f"id: {event['id']}\nevent: {event['event']}\ndata: {json.dumps(event['data'])}\n\n"
            if event["event"] in FINAL_EVENTS:
                return
        if not batch:
            record = server.store.watch(watch_id)
            if record is None or record["state"] != RUNNING:
                if not await asyncio.to_thread(server.store.events, watch_id, after):
                    return
            if await request.is_disconnected():
                return
            await asyncio.sleep(POLL_S)


def _jpeg(rgb) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(rgb.numpy()).save(out, format="JPEG", quality=80)
    return out.getvalue()

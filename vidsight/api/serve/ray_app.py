"""`vidsight serve --ray`: the same HTTP API as a Ray Serve application over many replicas.

Two deployments:

- ``Replica`` (N of them, or autoscaled): each loads the model once and runs the whole
  single-server app (`create_app`) in its process, named by its Ray Serve replica id; it serves
  requests the gateway hands it and beats a heartbeat into the shared store.
- ``Gateway`` (the FastAPI ingress, light): forwards every request to a replica, chosen by
  `ray_router.StreamRouter`: watches and chat sessions stay on the replica that holds them, new
  ones go to the least loaded replica, the rest are balanced. It also supervises: a running watch
  whose owner stopped beating is handed to a live replica, which resumes it from its last stored
  window (the store ignores a window stored twice, so nothing is lost or duplicated).

Chat sessions keep their KV in their replica: when it dies, their clients get 410 Gone.
"""


import asyncio
import json
import logging
import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.config import RequestRouterConfig

from vidsight.api.serve.app import check_api_key, create_app
from vidsight.api.serve.completions import error_body
from vidsight.api.serve.config import RayConfig, ServeConfig
from vidsight.api.serve.media import RequestError
from vidsight.api.serve.metrics import merge_expositions
from vidsight.api.serve.ray_router import ROUTER_CLASS
from vidsight.api.serve.store import RUNNING, Store

log = logging.getLogger(__name__)
HEARTBEAT_S = 1.0
# Requests a replica or the gateway holds at once (event streams stay open for a watch's life);
# the replica's own admission (`--max-concurrent`, 429) bounds the model work.
MAX_ONGOING_REQUESTS = 1000
GRACEFUL_SHUTDOWN_S = 60.0
REPLICA_HEADER = "x-vidsight-replica"


def route_of(method: str, path: str, store: Store, timeout_s: float) -> dict:
    """Where a request goes: ``{}`` (any replica), ``{"pin": id}``, ``{"loads": {...}}`` (a new
    stream, least loaded first), ``{"fan_out": [ids]}`` (every live replica), or ``{"gone": message}``."""
    parts = path.strip("/").split("/")
    if path == "/metrics":
        return {"fan_out": sorted(store.live_replicas(timeout_s))}
    if parts[:2] not in (["v1", "watches"], ["v1", "sessions"]):
        return {}
    if len(parts) == 2:
        if method == "POST":
            return {"loads": store.live_replicas(timeout_s)}
        return {"fan_out": sorted(store.live_replicas(timeout_s))} if parts[1] == "sessions" else {}
    if parts[1] == "watches":
        owner = store.owner(parts[2])
        return {"pin": owner} if owner is not None and owner in store.live_replicas(timeout_s) else {}
    if "-" not in parts[2]:
        return {}   # not a session id this deployment gave: the replica says so
    owner = parts[2].split("-")[0]
    if owner not in store.live_replicas(timeout_s):
        return {"gone": f"chat session {parts[2]!r} is gone: the replica holding its KV cache stopped"}
    return {"pin": owner}


def _refusal(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


@serve.deployment(max_ongoing_requests=MAX_ONGOING_REQUESTS, graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
                  request_router_config=RequestRouterConfig(request_router_class=ROUTER_CLASS))
class Replica:
    """One model and everything it runs: requests, watches, chat sessions."""

    def __init__(self, config: ServeConfig):
        self.id = serve.get_replica_context().replica_id.unique_id
        self.app = create_app(config, owner=self.id)
        self.server = self.app.state.server
        self.server.start()
        self.server.store.beat(self.id, 0)
        self._stopping = threading.Event()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            try:
                self.server.store.beat(self.id, self.server.streams)
            except Exception:   # the database is away for a moment: the next beat tries again
                log.exception("replica %s: heartbeat", self.id)

    async def http(self, request: dict, pin: str | None = None, loads: dict | None = None):
        """Serve one HTTP request through the app: yields ``(status, headers)``, then body pieces.

        ``pin`` and ``loads`` are for the router (`ray_router`), not for the replica.
        """
        messages: asyncio.Queue = asyncio.Queue()
        delivered = asyncio.Event()

        async def receive():
            if not delivered.is_set():
                delivered.set()
                return {"type": "http.request", "body": request["body"], "more_body": False}
            await asyncio.Event().wait()   # the client never leaves on its own: cancellation ends the call

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
                 "method": request["method"], "path": request["path"], "raw_path": request["path"].encode(),
                 "query_string": request["query_string"], "root_path": "", "headers": request["headers"],
                 "client": tuple(request["client"]) if request["client"] else None, "server": None,
                 "app": self.app}
        task = asyncio.ensure_future(self.app(scope, receive, messages.put))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        try:
            while (message := await messages.get()) is not None:
                if message["type"] == "http.response.start":
                    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
                    yield message["status"], [*headers, (REPLICA_HEADER, self.id)]
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield message["body"]
                    if not message.get("more_body"):
                        break
            if loads is not None:   # a stream was placed here: say so before the next placement
                await asyncio.to_thread(self.server.store.beat, self.id, self.server.streams)
        finally:
            if not task.done():
                task.cancel()

    def adopt(self, watch_id: str, previous: str | None, loads: dict | None = None) -> bool:
        """Take over a watch whose replica stopped; whether this replica won it."""
        won = self.server.watches.adopt(watch_id, previous)
        self.server.store.beat(self.id, self.server.streams)
        return won

    def __del__(self):
        self._stopping.set()
        self.server.stop()   # watches stop at a window boundary, recorded as running: the gateway moves them
        self.server.store.forget_replica(self.id)


GATEWAY = FastAPI(title="vidsight (Ray Serve)")


@serve.deployment(max_ongoing_requests=MAX_ONGOING_REQUESTS, ray_actor_options={"num_cpus": 0})
@serve.ingress(GATEWAY)
class Gateway:
    """The HTTP ingress: forwards each request to the replica it belongs on; moves orphaned watches."""

    def __init__(self, replicas, config: ServeConfig, ray_config: RayConfig):
        self.replicas, self.config, self.timeout_s = replicas, config, ray_config.replica_timeout_s
        self.store = Store(config.db)
        self._placing = asyncio.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()

    @GATEWAY.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def forward(self, request: Request, path: str):
        path = f"/{path}"   # the app's own path, under whatever route prefix Ray Serve mounts it at
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > self.config.max_body_bytes:
                return _refusal(413, f"the request body is over the {self.config.max_body_bytes}-byte cap")
        route = await asyncio.to_thread(route_of, request.method, path, self.store, self.timeout_s)
        if "gone" in route:
            try:
                check_api_key(self.config, request.headers.get("authorization", ""))
            except RequestError as exc:
                return _refusal(exc.status, str(exc))
            return _refusal(410, route["gone"])
        call = {"method": request.method, "path": path, "query_string": request.url.query.encode(),
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()],
                "body": bytes(body), "client": list(request.client) if request.client else None}
        if "fan_out" in route:
            return await self._gather(call, route["fan_out"])
        if "loads" in route:
            # New streams are placed one at a time, each on loads that count the one placed before.
            async with self._placing:
                route = await asyncio.to_thread(route_of, request.method, path, self.store, self.timeout_s)
                status, headers, content = await self._answer(call, route)
            return Response(content, status_code=status, headers=dict(headers))
        return await self._relay(call, route)

    async def _relay(self, call: dict, route: dict):
        try:
            status, headers, pieces = await self._start(call, route)
        except Exception as exc:   # the replica died under the request
            log.warning("%s %s: %s", call["method"], call["path"], exc)
            return _refusal(503, "the replica serving this request stopped; try again")
        return StreamingResponse(pieces, status_code=status, headers=dict(headers))

    async def _answer(self, call: dict, route: dict) -> tuple[int, list, bytes]:
        """A replica's whole answer: status, headers, body."""
        status, headers, pieces = await self._start(call, route)
        return status, headers, b"".join([piece async for piece in pieces])

    async def _start(self, call: dict, route: dict):
        """Hand ``call`` to the replica ``route`` names: its status, headers and the body to come."""
        pieces = self.replicas.options(stream=True).http.remote(call, **route)
        status, headers = await pieces.__anext__()
        return status, headers, pieces

    async def _gather(self, call: dict, replicas: list[str]):
        """A request every live replica answers, the answers joined: ``GET /v1/sessions`` lists
        each one's sessions, ``GET /metrics`` sums their metrics."""
        answers = []
        for replica in replicas:
            try:
                status, headers, content = await self._answer(call, {"pin": replica})
            except Exception as exc:   # it stopped since its last beat: what it held is gone
                log.info("%s on replica %s: %s", call["path"], replica, exc)
                continue
            if status != 200:
                return Response(content, status_code=status, headers=dict(headers))
            answers.append(content.decode())
        if call["path"] == "/metrics":
            return Response(merge_expositions(answers), media_type="text/plain; version=0.0.4; charset=utf-8")
        return {"object": "list", "data": [s for text in answers for s in json.loads(text)["data"]]}

    def _supervise(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            try:
                live = self.store.live_replicas(self.timeout_s)
                for watch in self.store.watches(RUNNING):
                    if watch["owner"] not in live:
                        won = self.replicas.adopt.remote(watch["id"], watch["owner"],
                                                         loads=self.store.live_replicas(self.timeout_s)).result()
                        log.warning("watch %s: replica %s stopped; %s", watch["id"], watch["owner"],
                                    "moved" if won else "already moved")
            except Exception:
                log.exception("supervisor")

    def __del__(self):
        self._closed.set()


def build_app(config: ServeConfig, ray_config: RayConfig):
    """The Ray Serve application: ``serve.run(build_app(...))`` deploys it."""
    replicas = Replica.options(**ray_config.deployment_options()).bind(config)
    return Gateway.bind(replicas, config, ray_config)

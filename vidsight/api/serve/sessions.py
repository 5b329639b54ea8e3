"""Chat sessions the server keeps: each reads its stream in a thread of its own and prefills
every frame through the scheduler; questions are answered from what was seen so far, in the
session's turn, while the stream goes on queuing (a live source drops its oldest frames)."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import TYPE_CHECKING

from vidsight.api.serve.media import RequestError, stream_source
from vidsight.errors import VidsightError

if TYPE_CHECKING:
    from vidsight.models.base import VLMAdapter

log = logging.getLogger(__name__)
READING, ENDED, FAILED, CLOSED = "reading", "ended", "failed", "closed"


class _Session:
    def __init__(self, session_id: str, spec: dict, chat, frames):
        self.id, self.spec, self.chat, self.frames = session_id, spec, chat, frames
        self.state, self.error = READING, None
        self.stop = threading.Event()

    def record(self) -> dict:
        chat = self.chat
        return {"id": self.id, **self.spec, "state": self.state, "error": self.error,
                "frames_seen": chat.frames_seen, "time_s": chat.time_s, "cached_tokens": chat.cache.length,
                "frames_dropped": self.frames.dropped, "tokens_by_tier": chat.cache.tokens_by_tier()}


class SessionManager:
    """Opens, feeds and closes chat sessions; they live as long as this process (their KV is here).

    Args:
        adapter: The loaded model.
        scheduler: Runs each frame's prefill and each answer, in the session's turn.
        serve_config: The allow-list for local sources.
        owner: This process's name among several (a Ray Serve replica's id): session ids start with
            it and a dash, so a router finds the replica holding a session's KV from its id alone.
    """

    def __init__(self, adapter: VLMAdapter, scheduler, serve_config, owner: str | None = None):
        self.adapter, self.scheduler, self.serve_config = adapter, scheduler, serve_config
        self._prefix = f"{owner}-" if owner else ""
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def open(self, spec: dict) -> dict:
        """Start a session over ``spec['source']`` with the settings of ``POST /v1/sessions``."""
        from vidsight.api.settings import chat_configs
        from vidsight.engine.chat import ChatSession
        from vidsight.ingest.queue import FrameQueue
        from vidsight.ingest.stream import StreamSource
        from vidsight.kv.policies.registry import make_policy

        source, options = stream_source(spec["source"], self.serve_config)
        policy = make_policy(spec["policy"], **spec.get("settings", {}))
        # A client sets budgets; where the disk tier lives is the server's choice alone.
        budgets = {name: spec.get(name) for name in ("kv_device_budget", "kv_host_budget")}
        disk = self.serve_config.kv_disk if any(v is not None for v in budgets.values()) else None
        config, tiers = chat_configs({"fps": spec["fps"], "batch_patches": spec["batch_patches"],
                                      "system": spec.get("system"), **budgets, "kv_disk": disk})
        stream = StreamSource(source, fps=spec["fps"], realtime=spec["realtime"], ffmpeg_options=options,
                              reconnect_tries=self.serve_config.source_retries,
                              reconnect_window_s=self.serve_config.source_retry_window_s)
        chat = ChatSession(self.adapter, policy, config, tiers)
        frames = FrameQueue(stream, drop_oldest=lambda: stream.live, stop_source=stream.close)
        session = _Session(self._prefix + uuid.uuid4().hex[:16], spec, chat, frames)
        with self._lock:
            self._sessions[session.id] = session
        threading.Thread(target=self._feed, args=(session,), name=f"session-{session.id}", daemon=True).start()
        return session.record()

    def get(self, session_id: str) -> _Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise RequestError(404, f"no chat session {session_id!r} (sessions end with the server process)")
        return session

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def all(self) -> list[dict]:
        with self._lock:
            return [s.record() for s in self._sessions.values()]

    def kv_bytes_by_tier(self) -> dict[str, int]:
        """KV bytes every open session holds, per tier."""
        adapter = self.adapter
        per_token = 2 * adapter.num_kv_heads * adapter.head_dim * adapter.dtype.itemsize   # a key and a value
        totals = {"device": 0, "host": 0, "disk": 0}
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            for tier, tokens in session.chat.cache.tokens_by_tier().items():
                totals[tier] += tokens * per_token
        return totals

    def close(self, session_id: str) -> dict:
        session = self.get(session_id)
        session.stop.set()
        session.frames.close()
        self.scheduler.submit(session.id, session.chat.close).result()
        session.state = CLOSED
        with self._lock:
            self._sessions.pop(session_id, None)
        return session.record()

    def close_all(self) -> None:
        for session_id in [s["id"] for s in self.all()]:
            try:
                self.close(session_id)
            except VidsightError:
                pass

    def _feed(self, session: _Session) -> None:
        try:
            for frame in session.frames:
                if session.stop.is_set():
                    return
                # Stepped: encoded and prefilled beside other streams' frames and the running answers.
                self.scheduler.submit_steps(session.id, session.chat.pushing([frame])).result()
            session.state = ENDED
        except VidsightError as exc:
            if not session.stop.is_set():
                log.warning("session %s: %s", session.id, exc)
                session.state, session.error = FAILED, str(exc)
        except Exception as exc:  # a bug, not bad input: the session says so instead of reading forever
            log.exception("session %s failed", session.id)
            session.state, session.error = FAILED, f"internal error: {type(exc).__name__}: {exc}"

"""What one server process holds: the model, its scheduler, the store, the watches, the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from vidsight.api.serve.config import ServeConfig
from vidsight.api.serve.media import RequestError
from vidsight.api.serve.metrics import Metrics
from vidsight.api.serve.scheduler import Scheduler
from vidsight.api.serve.sessions import SessionManager
from vidsight.api.serve.store import Store
from vidsight.api.serve.tenants import RequestCounter
from vidsight.api.serve.watches import WatchManager
from vidsight.engine.steps import encode_together, run_to_end

if TYPE_CHECKING:
    from vidsight.models.base import VLMAdapter

log = logging.getLogger(__name__)


class Server:
    """The server's parts, started and stopped with the app.

    Args:
        config: The server's settings.
        adapter: An already loaded model, served as it is (default: load ``config.model`` at start,
            its weights packed where ``config.packed_weights`` says so).
        owner: This server's name when several share the store (a Ray Serve replica's id); such a
            server resumes no watch by itself: the replicas' supervisor hands them out.
    """

    def __init__(self, config: ServeConfig, adapter: VLMAdapter | None = None, owner: str | None = None):
        self.config, self.adapter, self.owner = config, adapter, owner
        self.metrics = Metrics(config.served_name)
        self.scheduler: Scheduler | None = None
        self.store: Store | None = None
        self.watches: WatchManager | None = None
        self.sessions: SessionManager | None = None
        self.asker = None
        self._places = threading.BoundedSemaphore(config.max_concurrent)
        self.requests = RequestCounter()   # per tenant, for its max_requests

    def load(self) -> None:
        """Load the model (unless it was given) and check it fits the settings: `start` does, and
        the command line does first, so a bad model or setting ends it with its message, not a
        traceback from inside the web server's start."""
        from vidsight.engine.reasoning import REASONING_PARSERS
        from vidsight.models import load_model

        if self.adapter is None:
            self.adapter = load_model(self.config.model, device=self.config.device,
                                      packed_weights=self.config.packed_weights, chat_template=self.config.chat_template,
                                      max_model_len=self.config.max_model_len)
        if self.config.reasoning_parser is not None:   # a model without its tags is refused at the start
            REASONING_PARSERS[self.config.reasoning_parser].tag_ids(self.adapter)

    @property
    def sampling_defaults(self) -> dict:
        """Settings a request takes unless it gives its own (`ServeConfig.generation_config`)."""
        return dict(self.adapter.sampling_defaults) if self.config.generation_config == "auto" else {}

    def start(self) -> None:
        from vidsight.engine import Asker
        from vidsight.engine.generate import DecodeBatch
        from vidsight.engine.prefix_cache import PrefixCache
        from vidsight.engine.stats import peak_memory_bytes

        self.load()
        if self.sampling_defaults:
            log.warning("requests' sampling defaults from %s's generation_config.json: %s (--generation-config vllm "
                        "for vidsight's own)", self.adapter.name,
                        ", ".join(f"{name} {value}" for name, value in self.sampling_defaults.items()))
        device = self.adapter.device
        prefix_cache = (PrefixCache(self.config.prefix_cache_bytes, self.config.prefix_host_budget(device.type), device)
                        if self.config.prefix_cache_bytes else None)
        self.asker = Asker(self.adapter, prefix_cache=prefix_cache)
        if prefix_cache is not None:
            self.metrics.follow_prefix_cache(prefix_cache.stats)
        self.metrics.follow("peak_memory_bytes", "Peak memory since the start: the device's allocations on CUDA, "
                            "else the process's resident set.", lambda: peak_memory_bytes(self.adapter.device))
        self.store = Store(self.config.db)
        adapter = self.adapter
        self.scheduler = Scheduler(encode=lambda requests: encode_together(adapter, requests),
                                   on_queue_time=self.metrics.queue_time.observe,
                                   on_batch=self.metrics.vision_batch_size.observe,
                                   decode=DecodeBatch(adapter), on_decode_batch=self.metrics.decode_batch_size.observe,
                                   max_prefill_tokens=self.config.prefill_budget(adapter.device.type))
        self.watches = WatchManager(self.adapter, self.store, self.scheduler, self.metrics, self.config, self.owner)
        if self.owner is None:
            self.watches.resume()
        self.sessions = SessionManager(self.adapter, self.scheduler, self.config, self.owner)

    @property
    def streams(self) -> int:
        """Watches running and chat sessions open here."""
        return self.watches.running + self.sessions.open_count

    def stop(self) -> None:
        """Streams stop at a window boundary (and resume at the next start); waiting work is refused."""
        self.watches.close()
        self.sessions.close_all()
        self.scheduler.close(timeout_s=60)
        self.store.close()

    async def run_model(self, work: Callable[[], Any], client: str | None = None) -> Any:
        """Run ``work`` on the model's thread in ``client``'s turn (a request is a client of its own)."""
        future = self.scheduler.submit(client or uuid.uuid4().hex, work)
        return await asyncio.wrap_future(future)

    async def run_answer(self, begin: Callable[[], Any], started: Callable[[Any], None] = lambda ticket: None,
                         client: str | None = None) -> Any:
        """Prefill with ``begin()`` (preemptible work giving an `AnswerInProgress`:
        `Asker.begin_steps`, `ChatSession.asking`) on the model's thread, a group per turn, then
        generate its answer beside the other running answers; its result. ``started`` gets the
        answer's ticket at once: cancelling it (a client gone) ends the prefill or the answer at
        its next step. ``client``'s line (a session's) waits for the answer (default: a line of its own)."""
        if not self.config.batch_answers:
            return await self.run_model(lambda: run_to_end(begin(), self.adapter).generate_alone(), client)
        future, ticket = self.scheduler.submit_answer(client or uuid.uuid4().hex, begin)
        started(ticket)
        return await asyncio.wrap_future(future)

    @contextlib.contextmanager
    def admit(self, places: int = 1) -> Iterator[None]:
        """Hold ``places`` of the server's ``max_concurrent`` places for a request's life (a
        completion's ``n`` answers hold ``n``; 429 when they are not free)."""
        held = 0
        while held < places and self._places.acquire(blocking=False):
            held += 1
        try:
            if held < places:
                raise RequestError(429, f"{self.config.max_concurrent} requests are already in progress"
                                        f"{f' ({places} wanted for n={places})' if places > 1 else ''}; "
                                        "try again later")
            yield
        finally:
            for _ in range(held):
                self._places.release()

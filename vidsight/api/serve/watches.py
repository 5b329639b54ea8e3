"""Standing queries the server runs: one thread per watch reads its stream; its windows' model
work goes through the scheduler; every verdict and alert is stored before it is announced."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING

import httpx

from vidsight.api.serve.egress import EgressRefused, EgressRules, send_checked
from vidsight.api.serve.media import RequestError, stream_source
from vidsight.api.serve.store import DONE, FAILED, RUNNING, STOPPED, Store
from vidsight.api.settings import watch_config
from vidsight.api.watch import end_record, verdict_records
from vidsight.errors import VidsightError

if TYPE_CHECKING:
    from vidsight.models.base import VLMAdapter

log = logging.getLogger(__name__)
# Webhook deliveries: tries and the first back-off (doubling), as common webhook senders do.
WEBHOOK_TRIES = 5
WEBHOOK_BACKOFF_S = 0.5
WEBHOOK_TIMEOUT_S = 10.0


class WatchManager:
    """Starts, resumes and stops the server's watches.

    Args:
        adapter: The loaded model.
        store: Where watches and their events are kept.
        scheduler: Runs each window's model work.
        metrics: Counts windows, tokens and alerts.
        serve_config: The allow-list for local sources.
        owner: This process's name among several sharing the store (a Ray Serve replica's id); a
            watch it no longer owns stops at its next window. None: the only server.
    """

    def __init__(self, adapter: VLMAdapter, store: Store, scheduler, metrics, serve_config, owner: str | None = None):
        self.adapter, self.store, self.scheduler, self.metrics = adapter, store, scheduler, metrics
        self.serve_config, self.owner = serve_config, owner
        self._threads: dict[str, threading.Thread] = {}
        self._stop: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._latest: dict[str, object] = {}   # watch id -> (H, W, 3) uint8 of its last judged frame

    def latest_frame(self, watch_id: str):
        """``(H, W, 3)`` uint8 of the last frame the watch judged in this process, or None."""
        return self._latest.get(watch_id)

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._threads)

    def start(self, spec: dict) -> str:
        """Validate ``spec`` (the settings of ``POST /v1/watches``), record it, start it; its id."""
        self._check(spec)
        watch_id = uuid.uuid4().hex[:16]
        self.store.add_watch(watch_id, spec, self.owner)
        self._launch(watch_id, spec)
        return watch_id

    def resume(self) -> list[str]:
        """Start again the watches a previous server left running."""
        resumed = []
        for record in self.store.watches(RUNNING):
            self._launch(record["id"], _spec(record))
            resumed.append(record["id"])
        return resumed

    def adopt(self, watch_id: str, previous: str | None) -> bool:
        """Take over a running watch from ``previous`` (a replica that stopped); whether this one won it."""
        if not self.store.claim(watch_id, previous, self.owner):
            return False
        self._launch(watch_id, _spec(self.store.watch(watch_id)))
        return True

    def stop(self, watch_id: str, wait_s: float | None = None) -> None:
        """Stop a watch at its next window boundary and record it as stopped."""
        with self._lock:
            stop, thread = self._stop.get(watch_id), self._threads.get(watch_id)
        if stop is not None:
            stop.set()
        if thread is not None and wait_s:
            thread.join(wait_s)
        record = self.store.watch(watch_id)
        if record is not None and record["state"] == RUNNING:
            self.store.set_state(watch_id, STOPPED)

    def close(self, wait_s: float = 30.0) -> None:
        """Stop every watch at a window boundary; they stay recorded as running, so they resume."""
        with self._lock:
            self._closing = True
            threads = list(self._threads.values())
            for stop in self._stop.values():
                stop.set()
        deadline = time.monotonic() + wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _check(self, spec: dict) -> None:
        stream_source(spec["source"], self.serve_config)   # refuses a path outside the allow-list, a private host
        if spec.get("webhook_url"):
            try:
                self.serve_config.egress("webhook").resolve(spec["webhook_url"])
            except EgressRefused as exc:
                raise RequestError(403, str(exc)) from None
        config = watch_config(spec)
        from vidsight.engine.watch import Watcher

        Watcher(self.adapter, spec["query"], config)   # refuses a bad query or stride now, not in the thread

    def _launch(self, watch_id: str, spec: dict) -> None:
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(watch_id, spec, stop), name=f"watch-{watch_id}", daemon=True)
        with self._lock:
            if self._closing:
                raise RequestError(503, "the server is shutting down")
            self._stop[watch_id], self._threads[watch_id] = stop, thread
        thread.start()

    def _run(self, watch_id: str, spec: dict, stop: threading.Event) -> None:
        from vidsight.engine.watch import Watcher

        try:
            config = watch_config(spec)
            url, options = stream_source(spec["source"], self.serve_config)
            source = config.open(url, realtime=spec.get("realtime", False), ffmpeg_options=options,
                                 reconnect_tries=self.serve_config.source_retries,
                                 reconnect_window_s=self.serve_config.source_retry_window_s)
            # A file or a recording is read again from its start and its judged windows passed
            # over; an endless stream goes on from now, its windows numbered after the stored ones.
            first, streak = self.store.resume_point(watch_id)
            watcher = Watcher(self.adapter, spec["query"], config)
            decoded = 0
            verdicts = watcher.watch(
                source, first_window=first, streak=streak,
                run=lambda steps: self.scheduler.submit_steps(watch_id, steps).result())
            for verdict in verdicts:
                if self.owner is not None and self.store.owner(watch_id) != self.owner:
                    return   # another replica took the watch over (this one was taken for dead)
                self._latest[watch_id] = watcher.latest.rgb
                self._record(watch_id, spec, verdict)
                self.metrics.frames_decoded.inc(source.frames_decoded - decoded)
                decoded = source.frames_decoded
                if stop.is_set():
                    break
            else:
                self.metrics.frames_decoded.inc(source.frames_decoded - decoded)
                self.store.append(watch_id, "end", None, end_record(source, watcher))
                self.store.set_state(watch_id, DONE)
        except VidsightError as exc:
            if stop.is_set():   # the server shut down while the window waited for the model
                return
            log.warning("watch %s: %s", watch_id, exc)
            self._fail(watch_id, str(exc))
        except Exception as exc:  # a bug, not bad input: the watch ends visibly instead of hanging
            log.exception("watch %s failed", watch_id)
            self._fail(watch_id, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._threads.pop(watch_id, None)
                self._stop.pop(watch_id, None)

    def _fail(self, watch_id: str, message: str) -> None:
        self.store.append(watch_id, "error", None, {"type": "error", "message": message})
        self.store.set_state(watch_id, FAILED, message)

    def _record(self, watch_id: str, spec: dict, verdict) -> None:
        metrics = self.metrics
        metrics.windows_judged.inc()
        metrics.windows_skipped.inc(verdict.windows_skipped)
        metrics.watch_lag.observe(verdict.lag_s)
        metrics.visual_tokens.inc(verdict.visual_tokens)
        metrics.visual_tokens_pruned.inc(verdict.visual_tokens - verdict.kept_tokens)
        metrics.visual_tokens_reused.inc(verdict.reused_tokens)
        for record in verdict_records(verdict, spec["query"]):
            stored = self.store.append(watch_id, record["type"], verdict.window, record)
            if record["type"] == "alert" and stored is not None:
                metrics.alerts.inc()
                if spec.get("webhook_url"):
                    threading.Thread(target=deliver_webhook, args=(spec["webhook_url"], {"watch_id": watch_id, **record},
                                                                   self.serve_config.egress("webhook")),
                                     daemon=True, name=f"webhook-{watch_id}").start()


def _spec(record: dict) -> dict:
    """A stored watch's settings, as ``POST /v1/watches`` gave them."""
    return {k: record[k] for k in record if k not in ("id", "state", "error", "created", "owner")}


def deliver_webhook(url: str, payload: dict, rules: EgressRules, tries: int = WEBHOOK_TRIES,
                    backoff_s: float = WEBHOOK_BACKOFF_S) -> bool:
    """POST ``payload`` to ``url`` at addresses ``rules`` allow (checked at every try), retrying
    failures with doubling back-off; whether it was delivered."""
    for attempt in range(tries):
        try:
            response = asyncio.run(_post_checked(url, payload, rules))
            if response.status_code < 500 and response.status_code != 429:
                return response.is_success
        except EgressRefused as exc:
            log.warning("webhook %s", exc)
            return False
        except httpx.HTTPError as exc:
            log.info("webhook %s: %s (try %d of %d)", url, exc, attempt + 1, tries)
        if attempt + 1 < tries:
            time.sleep(backoff_s * 2 ** attempt)
    log.warning("webhook %s: not delivered after %d tries", url, tries)
    return False


async def _post_checked(url: str, payload: dict, rules: EgressRules) -> httpx.Response:
    async with httpx.AsyncClient(follow_redirects=False, timeout=WEBHOOK_TIMEOUT_S) as client:
        response = await send_checked(client, "POST", url, rules, json=payload)
        await response.aclose()
        return response

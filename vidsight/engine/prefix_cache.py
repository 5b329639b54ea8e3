"""The video prefix cache: a video's KV prefilled once, continued by every later question about it.

The engines people serve language models with keep a prompt's KV for the next request that
starts the same way (vLLM's automatic prefix caching, SGLang's radix cache). A video question's
prompt is the video followed by the question, so the same video asked about again has the same
prefix: its decoding, vision encoding and prefill are all skipped, and only the question's text
is prefilled (`prefill_question`).

A prefix is reused only when everything that shapes its KV is the same: the text before the video
(the chat template's system turn, or a conversation's own system message and earlier turns), the
file's bytes (a content hash, not its name), the sampling, the prefill settings (motion pruning, patch dedup, groups) and
the decoder's resizing. Past the device's budget, prefixes wait in host memory (vLLM's swap space,
LMCache's CPU backend) and come back up on a hit. KV pruning makes the last group's KV depend on the
question (it is pruned with the question in the group), so pruned requests are not cached.

Requests about the same video often come together (several clients, one clip): the first to miss
claims the prefill (`PrefixCache.get_or_claim`) and the others wait for its prefix rather than
prefilling the same video beside it, so a video is prefilled once however many ask at once.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from pathlib import Path

import torch

from vidsight.engine.prefill import PrefillConfig, VideoPrefix
from vidsight.errors import ConfigError, VideoError
from vidsight.ingest import SamplingConfig
from vidsight.ingest.feed import FeedConfig


@dataclasses.dataclass(frozen=True)
class PrefixKey:
    """What a video prefix's KV depends on (the model is the cache owner's)."""

    content: str
    sampling: SamplingConfig
    prefill: PrefillConfig
    resize_in_decoder: bool
    before_video: tuple[int, ...]   # the prompt's token ids before the video (system turn, earlier turns)
    still: bool = False             # the file shown as a still image (`Conversation.still`), not a video


def content_hash(path: str | Path) -> str:
    """BLAKE2b of the file's bytes: the same video under another name or URL is the same prefix."""
    digest = hashlib.blake2b(digest_size=20)
    try:
        with open(path, "rb") as file:
            while block := file.read(1 << 20):
                digest.update(block)
    except OSError as exc:
        raise VideoError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    return digest.hexdigest()


def prefix_key(path: str | Path, sampling: SamplingConfig, prefill: PrefillConfig, feed: FeedConfig,
               before_video: torch.Tensor, still: bool = False) -> PrefixKey | None:
    """The key of ``path``'s prefix under these settings after the prompt's ``before_video`` ids,
    shown as a video or as a still image; None when the prefix would depend on the question."""
    if prefill.prune.active:
        return None
    return PrefixKey(content_hash(path), sampling, prefill, feed.resize_in_decoder, tuple(before_video.tolist()),
                     still)


@dataclasses.dataclass
class PrefixCacheStats:
    """Counters since the cache began, and what it holds now on the device and in host memory.

    Attributes:
        hits: Lookups that found a prefix (on the device or in host memory), including those that
            waited for another request's prefill of it.
        misses: Lookups that did not (and prefilled it).
        waited: Of the hits, those that waited for another request's prefill of the same prefix.
        host_hits: Of the hits, those brought back up from host memory.
        offloads: Prefixes moved to host memory for the device budget.
        evictions: Prefixes dropped for the budgets.
        entries: Prefixes on the device now.
        bytes: Their KV bytes.
        host_entries: Prefixes in host memory now.
        host_bytes: Their KV bytes.
    """

    hits: int = 0
    misses: int = 0
    waited: int = 0
    host_hits: int = 0
    offloads: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    host_entries: int = 0
    host_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else float("nan")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "hit_rate": self.hit_rate}


class PrefixCache:
    """Video prefixes, least recently used first out, within a byte budget on the device and one in
    host memory below it.

    A prefix pushed out of the device's budget moves to host memory (pinned when the device is
    CUDA: `KVStore.clone` onto the CPU) while the host budget holds, and a hit there brings it
    back up (one copy, milliseconds, against a prefill of seconds); past both budgets the least
    recently used prefix is dropped. Each hit hands out the stored prefix; callers continue a copy
    of its cache (`prefill_question`), so entries are never changed and concurrent questions share one.

    Args:
        max_bytes: Most KV bytes held on the device; a prefix larger than this is not kept.
        host_bytes: Most KV bytes held in host memory (0: none; an evicted prefix is dropped).
        device: Where prefixes are used (the model's device), which a host hit brings them back to.
    """

    def __init__(self, max_bytes: int, host_bytes: int = 0, device: torch.device | str = "cpu"):
        if max_bytes <= 0:
            raise ConfigError(f"the prefix cache's budget must be positive, got {max_bytes} bytes")
        if host_bytes < 0:
            raise ConfigError(f"the prefix cache's host budget must be 0 (none) or more, got {host_bytes} bytes")
        self.max_bytes, self.host_bytes, self.device = max_bytes, host_bytes, torch.device(device)
        self._entries: collections.OrderedDict[PrefixKey, VideoPrefix] = collections.OrderedDict()
        self._host: collections.OrderedDict[PrefixKey, VideoPrefix] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._stats = PrefixCacheStats()
        # Prefixes being prefilled now: the claiming thread, and an event set when it is done.
        self._filling: dict[PrefixKey, tuple[int, threading.Event]] = {}

    def get_or_claim(self, key: PrefixKey, waited: bool = False) -> VideoPrefix | PrefixClaim | None:
        """The prefix stored under ``key`` (a hit); else, unless another request is prefilling it,
        a `PrefixClaim` to prefill it (a miss). While another request prefills it: on another
        thread, waits for it; on this thread (a scheduler interleaving requests), None: the caller
        pauses and asks again (``waited`` True), when that request may have finished."""
        while True:
            with self._lock:
                prefix = self._find(key)
                if prefix is not None:
                    self._stats.waited += waited
                    return prefix
                filler = self._filling.get(key)
                if filler is None:
                    self._stats.misses += 1
                    self._filling[key] = (threading.get_ident(), threading.Event())
                    return PrefixClaim(self, key)
                if filler[0] == threading.get_ident():
                    return None
            filler[1].wait()
            waited = True

    def put(self, key: PrefixKey, prefix: VideoPrefix) -> None:
        """Keep ``prefix`` on the device, moving the least recently used ones down until the budget holds."""
        if prefix.nbytes > self.max_bytes:
            return
        with self._lock:
            self._keep(key, prefix)

    def _release(self, key: PrefixKey) -> None:
        """End a claim on ``key`` (its prefix kept or not): the requests waiting for it look again."""
        with self._lock:
            filler = self._filling.pop(key, None)
        if filler is not None:
            filler[1].set()

    def _find(self, key: PrefixKey) -> VideoPrefix | None:
        """The prefix under ``key``, on the device, counted as a hit; None when it is not held. Called holding the lock."""
        prefix = self._entries.get(key)
        if prefix is not None:
            self._entries.move_to_end(key)
        else:
            held = self._host.pop(key, None)
            if held is None:
                return None
            self._stats.host_hits += 1
            prefix = _moved(held, self.device)
            self._keep(key, prefix)
        self._stats.hits += 1
        return prefix

    def _keep(self, key: PrefixKey, prefix: VideoPrefix) -> None:
        self._entries[key] = prefix
        self._entries.move_to_end(key)
        while _total(self._entries) > self.max_bytes:
            self._offload(*self._entries.popitem(last=False))

    def _offload(self, key: PrefixKey, prefix: VideoPrefix) -> None:
        if prefix.nbytes > self.host_bytes:
            self._drop(prefix)
            return
        self._host[key] = _moved(prefix, torch.device("cpu"))
        self._stats.offloads += 1
        while _total(self._host) > self.host_bytes:
            self._drop(self._host.popitem(last=False)[1])

    def _drop(self, prefix: VideoPrefix) -> None:
        prefix.cache.close()
        self._stats.evictions += 1

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return dataclasses.replace(self._stats, entries=len(self._entries), bytes=_total(self._entries),
                                       host_entries=len(self._host), host_bytes=_total(self._host))

    def clear(self) -> None:
        with self._lock:
            for prefix in (*self._entries.values(), *self._host.values()):
                prefix.cache.close()
            self._entries.clear()
            self._host.clear()


class PrefixClaim:
    """The right to prefill one video's prefix, held by the request that missed it first; other
    requests for it wait (`PrefixCache.get_or_claim`). Used as a context manager: leaving it,
    whether the prefill finished, failed or was abandoned, lets the waiting requests look again
    (one of them claims it when no prefix was kept)."""

    def __init__(self, cache: PrefixCache, key: PrefixKey):
        self._cache, self._key = cache, key

    def fill(self, prefix: VideoPrefix) -> None:
        """Keep the prefilled ``prefix`` (`PrefixCache.put`) and end the claim."""
        self._cache.put(self._key, prefix)
        self._cache._release(self._key)

    def __enter__(self) -> PrefixClaim:
        return self

    def __exit__(self, *exc) -> None:
        self._cache._release(self._key)


def _moved(prefix: VideoPrefix, device: torch.device) -> VideoPrefix:
    """``prefix`` with its KV copied onto ``device``, the original closed (a caller still cloning it
    keeps its tensors alive until it is done)."""
    moved = dataclasses.replace(prefix, cache=prefix.cache.clone(device=device))
    prefix.cache.close()
    return moved


def _total(entries: collections.OrderedDict[PrefixKey, VideoPrefix]) -> int:
    return sum(prefix.nbytes for prefix in entries.values())

"""The video prefix cache: a video's KV prefilled once, continued by every later question about it.

The engines people serve language models with keep a prompt's KV for the next request that
starts the same way (vLLM's automatic prefix caching, SGLang's radix cache). A video question's
prompt is the video followed by the question, so the same video asked about again has the same
prefix: its decoding, vision encoding and prefill are all skipped, and only the question's text
is prefilled (`prefill_question`).

A prefix is reused only when everything that shapes its KV is the same: the file's bytes (a
content hash, not its name), the sampling, the prefill settings (motion pruning, patch dedup,
groups) and the decoder's resizing. KV pruning makes the last group's KV depend on the question
(it is pruned with the question in the group), so pruned requests are not cached.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from pathlib import Path

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


def prefix_key(path: str | Path, sampling: SamplingConfig, prefill: PrefillConfig, feed: FeedConfig
               ) -> PrefixKey | None:
    """The key of ``path``'s prefix under these settings; None when the prefix would depend on the question."""
    if prefill.prune.active:
        return None
    return PrefixKey(content_hash(path), sampling, prefill, feed.resize_in_decoder)


@dataclasses.dataclass
class PrefixCacheStats:
    """Counters since the cache began, and what it holds now."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else float("nan")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "hit_rate": self.hit_rate}


class PrefixCache:
    """Video prefixes, least recently used first out, within a byte budget of KV.

    Each hit hands out the stored prefix; callers continue a copy of its cache
    (`prefill_question`), so entries are never changed and concurrent questions share one.

    Args:
        max_bytes: Most KV bytes held; a prefix larger than this is not kept.
    """

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ConfigError(f"the prefix cache's budget must be positive, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[PrefixKey, VideoPrefix] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._stats = PrefixCacheStats()

    def get(self, key: PrefixKey) -> VideoPrefix | None:
        """The prefix stored under ``key`` (now the most recently used), counted as a hit or a miss."""
        with self._lock:
            prefix = self._entries.get(key)
            if prefix is None:
                self._stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self._stats.hits += 1
            return prefix

    def put(self, key: PrefixKey, prefix: VideoPrefix) -> None:
        """Keep ``prefix``, evicting the least recently used ones until the budget holds."""
        if prefix.nbytes > self.max_bytes:
            return
        with self._lock:
            self._entries[key] = prefix
            self._entries.move_to_end(key)
            while sum(p.nbytes for p in self._entries.values()) > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                evicted.cache.close()
                self._stats.evictions += 1

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return dataclasses.replace(self._stats, entries=len(self._entries),
                                       bytes=sum(p.nbytes for p in self._entries.values()))

    def clear(self) -> None:
        with self._lock:
            for prefix in self._entries.values():
                prefix.cache.close()
            self._entries.clear()

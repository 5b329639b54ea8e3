"""Sampled frames handed to prefill as they are decoded: the feed's settings and the feed itself."""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.ingest.feed.config": ("FeedConfig",),
    "vidsight.ingest.feed.frames": ("FrameFeed",),
})

"""Containers and codecs: probing, frame sampling, decoding with codec signals, synthetic videos."""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.ingest.decode": ("DecodeConfig", "decode_frames"),
    "vidsight.ingest.dynamic": ("MotionPruneConfig",),
    "vidsight.ingest.feed.config": ("FeedConfig",),
    "vidsight.ingest.feed.frames": ("FrameFeed",),
    "vidsight.ingest.parallel": ("decode_parallel",),
    "vidsight.ingest.probe": ("is_still_image", "probe"),
    "vidsight.ingest.sampling": ("SamplingConfig", "sample_frames"),
    "vidsight.ingest.synthetic": ("SyntheticSpec", "make_video"),
    "vidsight.ingest.types": ("CodecInfo", "FrameBatch", "VideoInfo"),
})

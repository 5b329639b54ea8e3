"""vidsight: an inference engine that makes vision-language models understand video fast and cheaply.

The public API::

    import vidsight
    result = vidsight.ask("clip.mp4", "What happens?", model="Qwen/Qwen2.5-VL-7B-Instruct")
    print(result.answer, result.stats.stages_s)

Names load their modules on first use, so ``import vidsight`` alone does not load torch.
"""

from vidsight._lazy import lazy_exports

_EXPORTS = {
    "AskResult": "vidsight.engine",
    "AskStats": "vidsight.engine",
    "Asker": "vidsight.engine",
    "FeedConfig": "vidsight.engine",
    "GenerationConfig": "vidsight.engine",
    "PrefillConfig": "vidsight.engine",
    "PruneConfig": "vidsight.engine",
    "ask": "vidsight.engine",
    "ConfigError": "vidsight.errors",
    "ModelError": "vidsight.errors",
    "VideoError": "vidsight.errors",
    "VidsightError": "vidsight.errors",
    "CodecInfo": "vidsight.ingest",
    "DecodeConfig": "vidsight.ingest",
    "FrameBatch": "vidsight.ingest",
    "SamplingConfig": "vidsight.ingest",
    "SyntheticSpec": "vidsight.ingest",
    "VideoInfo": "vidsight.ingest",
    "decode_frames": "vidsight.ingest",
    "decode_parallel": "vidsight.ingest",
    "make_video": "vidsight.ingest",
    "probe": "vidsight.ingest",
    "sample_frames": "vidsight.ingest",
    "load_model": "vidsight.models",
    "write_tiny_model": "vidsight.models",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""vidsight: an inference engine that makes vision-language models understand video fast and cheaply.

The public API::

    import vidsight
    result = vidsight.ask("clip.mp4", "What happens?", model="Qwen/Qwen2.5-VL-7B-Instruct")
    print(result.answer, result.stats.stages_s)

Names load their modules on first use, so ``import vidsight`` alone does not load torch.
"""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.engine": ("AnswerFormat", "AskResult", "AskStats", "Asker", "ChatAnswer", "ChatConfig", "ChatSession", "ContinuationScore",
                        "GenerationConfig", "PrefillConfig", "PruneConfig", "ScoreResult", "WatchConfig", "Watcher",
                        "WindowStats", "WindowVerdict", "ask", "generate_together"),
    "vidsight.errors": ("ConfigError", "ModelError", "VideoError", "VidsightError"),
    "vidsight.ingest": ("CodecInfo", "DecodeConfig", "FeedConfig", "FrameBatch", "MotionPruneConfig", "SamplingConfig",
                        "SyntheticSpec", "VideoInfo", "decode_frames", "decode_parallel", "make_video", "probe",
                        "sample_frames"),
    "vidsight.models": ("Conversation", "Message", "VIDEO_PART", "load_model", "write_tiny_model"),
})

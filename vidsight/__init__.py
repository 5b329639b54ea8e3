"""vidsight: an inference engine that makes vision-language models understand video fast and cheaply.

The public API::

    import vidsight
    result = vidsight.ask("clip.mp4", "What happens?", model="Qwen/Qwen2.5-VL-7B-Instruct")
    print(result.answer, result.stats.stages_s)
"""

from vidsight.engine import AskResult, AskStats, Asker, FeedConfig, GenerationConfig, PrefillConfig, PruneConfig, ask
from vidsight.errors import ConfigError, ModelError, VideoError, VidsightError
from vidsight.ingest import (
    CodecInfo,
    DecodeConfig,
    FrameBatch,
    SamplingConfig,
    SyntheticSpec,
    VideoInfo,
    decode_frames,
    decode_parallel,
    make_video,
    probe,
    sample_frames,
)
from vidsight.models import load_model, write_tiny_model

__all__ = [
    "AskResult", "AskStats", "Asker", "CodecInfo", "ConfigError", "DecodeConfig", "FeedConfig", "FrameBatch",
    "GenerationConfig", "ModelError", "PrefillConfig", "PruneConfig", "SamplingConfig", "SyntheticSpec",
    "VideoError", "VideoInfo", "VidsightError", "ask", "decode_frames", "decode_parallel", "load_model",
    "make_video", "probe",
    "sample_frames", "write_tiny_model",
]

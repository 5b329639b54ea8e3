"""Containers and codecs: probing, frame sampling, decoding with codec signals, synthetic videos."""

from vidsight.ingest.decode import DecodeConfig, decode_frames
from vidsight.ingest.parallel import decode_parallel
from vidsight.ingest.probe import probe
from vidsight.ingest.sampling import SamplingConfig, sample_frames
from vidsight.ingest.synthetic import SyntheticSpec, make_video
from vidsight.ingest.types import CodecInfo, FrameBatch, VideoInfo

__all__ = [
    "CodecInfo",
    "DecodeConfig",
    "FrameBatch",
    "SamplingConfig",
    "SyntheticSpec",
    "VideoInfo",
    "decode_frames",
    "decode_parallel",
    "make_video",
    "probe",
    "sample_frames",
]

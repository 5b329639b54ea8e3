"""Containers and codecs: probing, frame sampling, decoding with codec signals, synthetic videos."""

from vidsight._lazy import lazy_exports

_EXPORTS = {
    "DecodeConfig": "vidsight.ingest.decode",
    "decode_frames": "vidsight.ingest.decode",
    "decode_parallel": "vidsight.ingest.parallel",
    "probe": "vidsight.ingest.probe",
    "SamplingConfig": "vidsight.ingest.sampling",
    "sample_frames": "vidsight.ingest.sampling",
    "SyntheticSpec": "vidsight.ingest.synthetic",
    "make_video": "vidsight.ingest.synthetic",
    "CodecInfo": "vidsight.ingest.types",
    "FrameBatch": "vidsight.ingest.types",
    "VideoInfo": "vidsight.ingest.types",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""vidsight's video writer: frames with exact presentation times, exact GOPs, B-frames on or off."""

from __future__ import annotations

import os
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vidsight.errors import ConfigError

TIME_BASE = Fraction(1, 90000)
# Codecs whose time base is any rational; the others count whole frames at a standard rate.
FREE_TIME_BASE = frozenset({"h264", "hevc", "vp9"})
# FFmpeg encoder and its options per codec; the container comes from the file's suffix.
ENCODERS = {
    "h264": "libx264",
    "hevc": "libx265",
    "mpeg2video": "mpeg2video",
    "mpeg4": "mpeg4",
    "mjpeg": "mjpeg",
    "vp9": "libvpx-vp9",
    "av1": "libsvtav1",
}


# Codecs coded field by field when asked to (`write_video`'s ``interlaced``), as broadcast and DVDs
# are: the options added to `_encoder_options`' (MPEG-2's flags keep its closed GOPs).
INTERLACED_CODECS = {"h264": {"x264-params": "interlaced=1:tff=1"},
                     "mpeg2video": {"flags": "+cgop+ilme+ildct", "top": "1"}}


def weave(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """An interlaced frame of two pictures taken a field apart: the top field (even rows) from
    ``first``, the bottom field (odd rows) from ``second``."""
    frame = first.copy()
    frame[1::2] = second[1::2]
    return frame


def _encoder_options(codec: str, gop: int, bframes: bool, crf: int, preset: str | None) -> dict[str, str]:
    if codec == "h264":
        return {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0",
                "bf": "2" if bframes else "0", "preset": preset or "veryfast", "crf": str(crf)}
    if codec == "hevc":
        return {"x265-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={2 if bframes else 0}:log-level=error",
                "preset": preset or "ultrafast", "crf": str(crf)}
    if codec == "vp9":
        return {"g": str(gop), "crf": str(crf + 12), "b": "0", "deadline": "realtime", "cpu-used": "8"}
    if codec == "av1":
        # SVT-AV1 prints its configuration on stderr unless its log level says errors only.
        os.environ.setdefault("SVT_LOG", "1")
        # SVT-AV1's CRF scale runs to 63; +12 lands near x264's quality at the same CRF, as for VP9.
        return {"g": str(gop), "crf": str(crf + 12), "preset": "11", "svtav1-params": "scd=0:enable-tf=0"}
    if codec == "mjpeg":
        return {"qscale": "4"}
    # MPEG-2 and MPEG-4 part 2: fixed quantiser, closed GOPs (which FFmpeg allows only without
    # scene-cut keyframes).
    return {"g": str(gop), "qscale": "4", "flags": "+cgop", "sc_threshold": "1000000000",
            "bf": "2" if bframes else "0"}


def write_video(path: str | Path, frames: Iterable[np.ndarray], times_s: Iterable[float], fps: float,
                gop: int = 16, bframes: bool = False, crf: int = 18, codec: str = "h264",
                preset: str | None = None, interlaced: bool = False) -> Path:
    """Encode RGB frames to a video file; the container follows ``path``'s suffix (.mp4, .mkv, .ts, ...).

    Args:
        path: Output file.
        frames: ``(H, W, 3)`` uint8 frames, H and W even.
        times_s: Presentation time of each frame in seconds (whole frames at ``fps`` for codecs
            outside `FREE_TIME_BASE`).
        fps: Nominal frame rate recorded in the stream.
        gop: Keyframe interval in frames; scene-cut keyframes are disabled so GOPs are exact.
        bframes: Allow up to two B-frames between references (codecs that have them).
        crf: x264 quality (lower is better; 18 is visually lossless); other codecs use a fixed quality.
        codec: One of `ENCODERS`' keys.
        preset: x264/x265 speed preset (default: veryfast for H.264, ultrafast for HEVC, quick to
            write; ``"medium"`` is x264's own default, what a camera-like encode with several
            reference frames and sub-pixel motion search gives).
        interlaced: Code each frame as two fields, top first (`weave` makes such frames), as
            broadcasts and DVDs are; H.264 and MPEG-2 (`INTERLACED_CODECS`).
    """
    if codec not in ENCODERS:
        raise ConfigError(f"codec must be one of {', '.join(ENCODERS)}, got {codec!r}")
    if interlaced and codec not in INTERLACED_CODECS:
        raise ConfigError(f"interlaced coding is written for {', '.join(INTERLACED_CODECS)}, not {codec!r}")
    path = Path(path)
    with av.open(str(path), mode="w") as out:
        rate = Fraction(fps).limit_denominator(1001)
        time_base = TIME_BASE if codec in FREE_TIME_BASE else 1 / rate
        stream = out.add_stream(ENCODERS[codec], rate=rate)
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        stream.time_base = time_base
        stream.codec_context.time_base = time_base
        stream.options = _encoder_options(codec, gop, bframes, crf, preset) | (
            INTERLACED_CODECS[codec] if interlaced else {})
        for image, t in zip(frames, times_s):
            if (stream.height, stream.width) != image.shape[:2]:  # a 640-wide frame matches the default width
                stream.width, stream.height = image.shape[1], image.shape[0]
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = round(t / time_base)
            frame.time_base = time_base
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path

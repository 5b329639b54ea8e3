"""vidsight's H.264 writer: frames with exact presentation times, exact GOPs, B-frames on or off."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

TIME_BASE = Fraction(1, 90000)


def write_video(path: str | Path, frames: Iterable[np.ndarray], times_s: Iterable[float], fps: float,
                gop: int = 16, bframes: bool = False, crf: int = 18) -> Path:
    """Encode RGB frames to an H.264 MP4.

    Args:
        path: Output file.
        frames: ``(H, W, 3)`` uint8 frames, H and W even.
        times_s: Presentation time of each frame in seconds.
        fps: Nominal frame rate recorded in the stream.
        gop: Keyframe interval in frames; scene-cut keyframes are disabled so GOPs are exact.
        bframes: Allow up to two B-frames between references.
        crf: x264 quality (lower is better; 18 is visually lossless).
    """
    path = Path(path)
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.pix_fmt = "yuv420p"
        stream.time_base = TIME_BASE
        stream.codec_context.time_base = TIME_BASE
        stream.options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0",
                          "bf": "2" if bframes else "0", "preset": "veryfast", "crf": str(crf)}
        for image, t in zip(frames, times_s):
            if stream.width != image.shape[1]:
                stream.width, stream.height = image.shape[1], image.shape[0]
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = round(t / TIME_BASE)
            frame.time_base = TIME_BASE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path

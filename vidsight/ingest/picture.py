"""A decoded frame as the picture a player shows: SDR colours, whole (not interlaced), at a size.

Interlaced video (a broadcast's 1080i or 576i, a DVD's, a DV or HDV camcorder's) stores two
fields per frame, taken a field period apart (1/50 s or 1/60 s): where anything moves, rows
alternate between the two times and every moving edge is combed, which players hide by
deinterlacing. A frame flagged interlaced is shown by its top field, every row of the other
interpolated from the rows above and below (a bob of one field). A motion-adaptive deinterlacer
(FFmpeg's yadif, bwdif) would keep more detail where nothing moves, but it reads the frames
beside each one, which a sampled decoder never decodes: every path must show a frame the same.
"""

from __future__ import annotations

import av
import numpy as np

from vidsight.ingest.colour import mapping_of, to_sdr

# How much larger than the model's input a mapped frame is kept for the model's own resize.
MAPPED_OVERSAMPLING = 2


def to_rgb(frame: av.VideoFrame, size: tuple[int, int] | None = None) -> np.ndarray:
    """``frame`` as 8-bit BT.709 SDR RGB ``(H, W, 3)``, scaled to ``size`` ``(height, width)`` by
    FFmpeg's bicubic scaler, else as stored; an HDR or wide-gamut frame mapped (`colour.to_sdr`),
    an interlaced one shown by its top field (`top_field`) before it is scaled."""
    if frame.interlaced_frame:
        whole = top_field(_converted(frame, None))
        if size is None or size == whole.shape[:2]:
            return whole
        return av.VideoFrame.from_ndarray(whole, format="rgb24").to_ndarray(
            format="rgb24", height=size[0], width=size[1], interpolation="BICUBIC")
    return _converted(frame, size)


def to_rgb_to_resize(frame: av.VideoFrame, size: tuple[int, int]) -> np.ndarray:
    """``frame`` as `to_rgb` gives it, for a resize to ``size`` ``(height, width)`` that follows: at
    its stored size; but a frame whose colours are mapped (HDR, wide gamut) and that is over twice
    ``size`` both ways is first scaled by FFmpeg to twice ``size``. Mapping is per pixel and costs
    at 4K twelve times what it does there (`docs/benchmarks.md`, "HDR video"), for final pixels
    0.2-0.35 intensity levels apart on average."""
    if mapping_of(frame) is not None and not frame.interlaced_frame:
        between = (MAPPED_OVERSAMPLING * size[0], MAPPED_OVERSAMPLING * size[1])
        if between[0] < frame.height and between[1] < frame.width:
            return _converted(frame, between)
    return to_rgb(frame)


def _converted(frame: av.VideoFrame, size: tuple[int, int] | None) -> np.ndarray:
    scale = {} if size is None else {"height": size[0], "width": size[1], "interpolation": "BICUBIC"}
    mapping = mapping_of(frame)
    if mapping is None:
        return frame.to_ndarray(format="rgb24", **scale)
    return to_sdr(frame.to_ndarray(format="rgb48le", **scale), mapping)


def top_field(rgb: np.ndarray) -> np.ndarray:
    """``rgb`` ``(H, W, 3)`` uint8 with its odd rows (the bottom field) replaced, in place, by the
    mean of the rows above and below them (rounded up); a last odd row, with none below, repeats
    the row above. Returns ``rgb``."""
    between = np.add(rgb[0:-2:2], rgb[2::2], dtype=np.uint16)
    between += 1
    between >>= 1
    rgb[1:-1:2] = between
    if len(rgb) % 2 == 0:
        rgb[-1] = rgb[-2]
    return rgb

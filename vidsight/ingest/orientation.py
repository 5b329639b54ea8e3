"""Frames shaped the way they are meant to be seen: turned, and stretched to square pixels.

A phone records a portrait video as landscape frames and a display matrix saying how to turn them
(FFmpeg's tools turn them; PyAV gives them as stored). A DVD, an HDV camcorder or a broadcast
stores a wide picture in fewer columns of wider pixels (720x480 shown 853 wide, 1440x1080 shown
1920 wide: the sample aspect ratio, which players apply). The model should see what a person sees,
so every decoded frame is turned by its own display rotation and scaled to its displayed width
(as it is scaled to the model's size anyway); every map of its blocks (motion, intra, dynamic),
which the codec and the motion rule compute on the stored frame, is turned with it and maps onto
the frame's patches by proportion, which the stretch keeps.
"""

from __future__ import annotations

import dataclasses
import logging
from fractions import Fraction

import av
import numpy as np

from vidsight.ingest.types import CodecInfo

log = logging.getLogger(__name__)

# Sample aspect ratios that cameras, discs and broadcasts write lie between 8:9 (NTSC DV's 4:3)
# and 2:1 (an anamorphic lens on square cells); one far outside is a damaged header, shown square.
PIXEL_ASPECT_RANGE = (Fraction(1, 4), Fraction(4))


def pixel_aspect(stream: av.video.stream.VideoStream, source: object = None) -> Fraction:
    """The displayed width of one of ``stream``'s stored pixels over its height: the sample aspect
    ratio the container declares, else the codec's, as FFmpeg's players take it; 1 where none is
    declared, or where it is implausible (`PIXEL_ASPECT_RANGE`; said once, naming ``source``)."""
    for declared in (stream.sample_aspect_ratio, stream.codec_context.sample_aspect_ratio):
        if declared and declared > 0:
            low, high = PIXEL_ASPECT_RANGE
            if low <= declared <= high:
                return Fraction(declared)
            if source is not None:
                log.warning("%s: declares pixels %s as wide as high, which no camera writes; shown square",
                            source, declared)
            return Fraction(1)
    return Fraction(1)


def displayed_width(width: int, aspect: Fraction) -> int:
    """The width ``width`` stored pixels of `pixel_aspect` ``aspect`` are shown at (their rows kept)."""
    return max(1, round(width * aspect))


def quarter_turns(frame: av.VideoFrame) -> int:
    """Counter-clockwise quarter turns (0-3) that show ``frame`` upright; 0 for an angle that is
    not a quarter turn (no camera writes one), which is shown as stored."""
    turns, rest = divmod(round(frame.rotation or 0), 90)
    return 0 if rest else turns % 4


def stored_size(height: int, width: int, turns: int) -> tuple[int, int]:
    """The stored frame's ``(height, width)`` that ``turns`` quarter turns show as ``height x width``."""
    return (width, height) if turns % 2 else (height, width)


def upright(pixels: np.ndarray, turns: int) -> np.ndarray:
    """``(H, W, ...)`` pixels turned ``turns`` quarter turns counter-clockwise (contiguous)."""
    return np.ascontiguousarray(np.rot90(pixels, turns)) if turns else pixels


def upright_codec(info: CodecInfo, turns: int) -> CodecInfo:
    """``info``'s block maps turned as its frame is (`upright`)."""
    if not turns:
        return info

    def turn(blocks: np.ndarray | None) -> np.ndarray | None:
        return None if blocks is None else np.ascontiguousarray(np.rot90(blocks, turns, axes=(-2, -1)))

    return dataclasses.replace(info, motion=turn(info.motion), intra=turn(info.intra), dynamic=turn(info.dynamic))

"""Frames turned the way they are meant to be seen.

A phone records a portrait video as landscape frames and a display matrix saying how to turn them
(FFmpeg's tools turn them; PyAV gives them as stored). The model should see what a person sees,
so every decoded frame is turned by its own display rotation, and so is every map of its blocks
(motion, intra, dynamic), which the codec and the motion rule compute on the stored frame.
"""

from __future__ import annotations

import dataclasses

import av
import numpy as np

from vidsight.ingest.types import CodecInfo


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

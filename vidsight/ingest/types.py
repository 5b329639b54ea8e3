"""Plain data produced by the ingest layer."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from vidsight.ingest.dynamic import MotionPruneConfig


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    """What one demux pass learns about a file's video stream.

    Attributes:
        path: The file probed.
        codec: FFmpeg decoder name, e.g. ``"h264"``.
        width: Frame width in square pixels as displayed (the coded width stretched by
            `pixel_aspect`; the coded height when `rotation` turns it).
        height: Frame height in pixels as displayed.
        average_fps: Frames per second averaged over the stream (the declared rate, else the
            frames over the duration).
        declared_fps: The rate the stream declares, else FFmpeg's guess; 0 when neither (what a
            live source knows of a stream: judging by pixels takes its pace from it, `frame_step`).
        time_base: Stream time base as ``(numerator, denominator)``.
        start_time_s: Presentation time of the first frame, in seconds.
        duration_s: From the first frame's start to the last frame's end, in seconds.
        frame_count: Frames in the stream (one per packet with a timestamp, leaving out those an
            MP4 edit list starts after: a trimmed video's GOP before its cut, decoded but not shown).
        has_b_frames: Whether any frame is presented before a frame decoded earlier.
        pts_s: Presentation time of every frame in presentation order, in seconds.
        keyframe_indices: Frame indices (presentation order) of the keyframes (of an
            `intra_only` stream, where every frame is one, the first of each group of
            `probe.INTRA_ONLY_GOP` frames).
        gop_sizes: Frames from each keyframe up to the next one (or the end).
        decode_pts: Every counted packet's pts (`frame_count`) in stream time-base ticks, in decode order,
            as demuxing from the start gives them: after a seek, MPEG-PS (and any container
            that leaves some packets without a timestamp) interpolates them differently.
        timed: Whether the packets' own timestamps place every frame. A raw elementary stream
            (``.h264``, ``.265``, as many cameras dump) carries none: its frames are timed by their
            order at the declared rate, its packets taken as frames (keyframes at their place in
            decode order). One whose timestamps go back (MPEG-TS segments joined) is timed on past
            each jump. Either is decoded from its start in one pass (nothing to seek by), its
            frames stamped in the order they come out.
        rotation: Degrees counter-clockwise the stored frames are turned to be seen (a phone's
            portrait video: 90 or 270), as every decoded frame is (`vidsight.ingest.orientation`).
        intra_only: Whether the codec codes every frame alone (MJPEG, ProRes, DNxHD): its frames
            are grouped into GOPs for the motion rule (`probe.INTRA_ONLY_GOP`), and a decoder
            needs no frame but those it shows.
        pixel_aspect: The stored pixels' displayed width over height, ``(numerator, denominator)``
            (a DVD's 720x480 16:9 picture: ``(32, 27)``); every decoded frame is scaled to square
            pixels, its rows kept.
        dynamic_range: ``"pq"`` or ``"hlg"`` for an HDR stream (its first frame's transfer),
            else ``"sdr"``; every decoded HDR frame is mapped to SDR (`vidsight.ingest.colour`).
        wide_gamut: Whether the first frame's primaries are BT.2020's (mapped to BT.709's).
        interlaced: Whether the first frame holds two fields (broadcast, DVD, DV): every frame
            flagged so is shown by its top field (`vidsight.ingest.picture`).
    """

    path: Path
    codec: str
    width: int
    height: int
    average_fps: float
    declared_fps: float
    time_base: tuple[int, int]
    start_time_s: float
    duration_s: float
    frame_count: int
    has_b_frames: bool
    pts_s: np.ndarray
    keyframe_indices: np.ndarray
    gop_sizes: np.ndarray
    decode_pts: np.ndarray
    timed: bool = True
    rotation: int = 0
    pixel_aspect: tuple[int, int] = (1, 1)
    intra_only: bool = False
    dynamic_range: str = "sdr"
    wide_gamut: bool = False
    interlaced: bool = False

    @functools.cached_property
    def decode_position(self) -> np.ndarray:
        """Each frame's position (presentation order in, decode order out) among the packets."""
        return np.argsort(self.decode_pts, kind="stable")

    def frame_at(self, time_s: float) -> int:
        """Presentation index of the frame presented at ``time_s`` (a decoded frame's or packet's pts)."""
        return int(np.searchsorted(self.pts_s, time_s - 1e-9))

    def shown_at(self, time_s: float) -> int | None:
        """`frame_at`, or None where no frame of the table is presented at ``time_s`` (a packet the
        probe left out: before the first keyframe, or before an edit list's start)."""
        index = self.frame_at(time_s)
        return index if index < len(self.pts_s) and abs(self.pts_s[index] - time_s) < 1e-6 else None

    @property
    def keyframe_times_s(self) -> np.ndarray:
        return self.pts_s[self.keyframe_indices]

    def gop_index_of(self, frame_indices: np.ndarray) -> np.ndarray:
        """GOP number (0-based) of each frame index."""
        return np.searchsorted(self.keyframe_indices, frame_indices, side="right") - 1

    def to_dict(self) -> dict:
        return {
            "path": str(self.path),
            "codec": self.codec,
            "width": self.width,
            "height": self.height,
            "average_fps": self.average_fps,
            "declared_fps": self.declared_fps,
            "time_base": f"{self.time_base[0]}/{self.time_base[1]}",
            "start_time_s": self.start_time_s,
            "duration_s": self.duration_s,
            "frame_count": self.frame_count,
            "has_b_frames": self.has_b_frames,
            "timed": self.timed,
            "rotation": self.rotation,
            "pixel_aspect": f"{self.pixel_aspect[0]}:{self.pixel_aspect[1]}",
            "intra_only": self.intra_only,
            "dynamic_range": self.dynamic_range,
            "wide_gamut": self.wide_gamut,
            "interlaced": self.interlaced,
            "keyframe_times_s": [round(float(t), 6) for t in self.keyframe_times_s],
            "gop_sizes": [int(g) for g in self.gop_sizes],
        }


@dataclasses.dataclass
class CodecInfo:
    """What the codec knows about one decoded frame.

    Attributes:
        frame_type: ``"I"``, ``"P"`` or ``"B"`` (``"?"`` when the decoder does not say).
        gop_index: Which GOP (counted from 0 in presentation order) holds the frame.
        motion: Motion-vector magnitude in pixels per 4x4 block, shape ``(2, ceil(H/4), ceil(W/4))``:
            channel 0 from past references, channel 1 from future ones (B-frames), each block
            holding the largest magnitude of any vector whose destination covers it. ``None``
            when the frame was not judged by the codec's own vectors (none exported, none asked
            for, or motion estimated from pixels: estimates are the rule's input, not the codec's).
        intra: ``(ceil(H/4), ceil(W/4))`` bool, blocks of an inter frame that no vector predicts
            (intra-coded: new content); ``None`` for I-frames, without vectors, or when the motion
            rule does not read them (only ``max`` does).
        dynamic: ``(ceil(H/4), ceil(W/4))`` bool, blocks a motion rule (`MotionPruneConfig`)
            judged dynamic; ``None`` for I-frames or when no rule was applied.
    """

    frame_type: str
    gop_index: int
    motion: np.ndarray | None = None
    intra: np.ndarray | None = None
    dynamic: np.ndarray | None = None


@dataclasses.dataclass
class FrameBatch:
    """Decoded frames in presentation order.

    Attributes:
        data: ``uint8`` tensor of shape ``(T, H, W, 3)``, RGB.
        pts_s: Presentation time of each frame in seconds, shape ``(T,)``, float64.
        indices: Frame index of each frame in the stream's presentation order, shape ``(T,)``.
        codec: Per-frame codec information, same length as ``data`` (empty if not asked for).
        frames_lost: Requested frames the decoder could not produce (corrupt data).
        strategy: How the frames were decoded: ``"sequential"``, ``"intervals"`` or ``"seek"``.
        motion: The rule ``codec``'s dynamic blocks were judged by (None: not judged).
    """

    data: torch.Tensor
    pts_s: torch.Tensor
    indices: torch.Tensor
    codec: list[CodecInfo] = dataclasses.field(default_factory=list)
    frames_lost: int = 0
    strategy: str = "sequential"
    motion: MotionPruneConfig | None = None

    def __len__(self) -> int:
        return self.data.shape[0]

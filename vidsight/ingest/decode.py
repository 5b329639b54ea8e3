"""Sequential single-pass decoding of chosen frames, with the codec's own signals alongside."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import torch

from vidsight.errors import ConfigError, VideoError
from vidsight.ingest.container import open_video
from vidsight.ingest.motion import motion_map
from vidsight.ingest.probe import probe
from vidsight.ingest.types import CodecInfo, FrameBatch, VideoInfo

log = logging.getLogger(__name__)

_FRAME_TYPES = {1: "I", 2: "P", 3: "B"}
# Codecs whose FFmpeg decoder honours export_mvs.
MOTION_VECTOR_CODECS = frozenset({"h264"})
MAX_DECODE_SIDE = 8192


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How frames are decoded.

    Attributes:
        size: Output ``(height, width)``, resized by FFmpeg's swscale (bicubic); ``None`` keeps the
            coded size.
        with_codec_info: Return per-frame frame types, GOP indices and (H.264) motion vectors.
            Vectors need FFmpeg's export_mvs with slice threading or none: frame threading returns
            wrong, run-to-run different B-frame vectors.
    """

    size: tuple[int, int] | None = None
    with_codec_info: bool = False

    def __post_init__(self):
        if self.size is not None:
            h, w = self.size
            if not (0 < h <= MAX_DECODE_SIDE and 0 < w <= MAX_DECODE_SIDE):
                raise ConfigError(f"decode size {self.size} must be between 1 and {MAX_DECODE_SIDE} per side")


def _configure_decoder(stream: av.video.stream.VideoStream, with_motion: bool) -> None:
    if with_motion:
        stream.codec_context.options = {"flags2": "+export_mvs"}
        stream.thread_type = "SLICE"
    else:
        stream.thread_type = "AUTO"


def decode_frames(
    path: str | Path,
    indices: np.ndarray | None = None,
    config: DecodeConfig = DecodeConfig(),
    info: VideoInfo | None = None,
    on_frame: Callable[[int], None] | None = None,
) -> FrameBatch:
    """Decode the frames at ``indices`` (presentation order) in one pass over the file.

    Decoding stops after the last wanted frame. Damaged packets are skipped; frames the decoder
    could not produce are left out of the batch and counted in ``frames_lost``.

    Args:
        path: Video file.
        indices: Frame indices to keep, as from `sample_frames`; ``None`` keeps every frame.
        config: Output size and whether to collect codec information.
        info: The file's `probe` result, if already known.
        on_frame: Called with the number of wanted frames produced so far (progress bars).

    Raises:
        VideoError: unreadable file, indices out of range, or no wanted frame could be decoded.
    """
    info = info or probe(path)
    wanted = np.arange(info.frame_count) if indices is None else np.unique(np.asarray(indices, dtype=np.int64))
    if len(wanted) == 0:
        raise ConfigError(f"{path}: no frames requested")
    if wanted[0] < 0 or wanted[-1] >= info.frame_count:
        raise VideoError(f"{path}: frame index out of range 0..{info.frame_count - 1}")
    height, width = config.size or (info.height, info.width)
    slot_of = {int(i): k for k, i in enumerate(wanted)}
    data = torch.empty((len(wanted), height, width, 3), dtype=torch.uint8)
    got = np.zeros(len(wanted), dtype=bool)
    codec: list[CodecInfo | None] = [None] * len(wanted)
    with_motion = config.with_codec_info and info.codec in MOTION_VECTOR_CODECS
    last_wanted = int(wanted[-1])
    bad_packets = 0

    with open_video(path) as (container, stream):
        _configure_decoder(stream, with_motion)
        time_base = float(stream.time_base)

        def take(frame: av.VideoFrame) -> bool:
            """Store ``frame`` if wanted; True once the last wanted frame is in."""
            if frame.pts is None:
                return False
            index = int(np.searchsorted(info.pts_s, frame.pts * time_base - 1e-9))
            slot = slot_of.get(index)
            if slot is None or got[slot]:
                return index >= last_wanted
            rgb = frame.to_ndarray(format="rgb24", width=width, height=height, interpolation="BICUBIC")
            data[slot] = torch.from_numpy(rgb)
            got[slot] = True
            if config.with_codec_info:
                vectors = None
                if with_motion:
                    side = frame.side_data.get("MOTION_VECTORS")
                    vectors = side.to_ndarray() if side is not None else None
                codec[slot] = CodecInfo(
                    frame_type=_FRAME_TYPES.get(int(frame.pict_type), "?"),
                    gop_index=int(info.gop_index_of(np.array([index]))[0]),
                    motion=motion_map(vectors, info.height, info.width) if with_motion else None,
                )
            if on_frame is not None:
                on_frame(int(got.sum()))
            return index >= last_wanted

        done = False
        for packet in _packets(container, stream):
            try:
                frames = packet.decode()
            except av.error.FFmpegError:
                bad_packets += 1
                continue
            if any([take(f) for f in frames]):
                done = True
                break
        if not done:
            try:
                for frame in stream.codec_context.decode(None):
                    if take(frame):
                        break
            except av.error.FFmpegError:
                bad_packets += 1

    lost = int((~got).sum())
    if lost == len(wanted):
        raise VideoError(f"{path}: none of the {len(wanted)} requested frames could be decoded (corrupt data)")
    if lost:
        log.warning("%s: %d of %d requested frames could not be decoded (%d damaged packets)",
                    path, lost, len(wanted), bad_packets)
    keep = torch.from_numpy(got)
    return FrameBatch(
        data=data[keep] if lost else data,
        pts_s=torch.from_numpy(info.pts_s[wanted[got]]),
        indices=torch.from_numpy(wanted[got]),
        codec=[c for c, ok in zip(codec, got) if ok] if config.with_codec_info else [],
        frames_lost=lost,
    )


def _packets(container: av.container.InputContainer, stream: av.video.stream.VideoStream):
    """Demux ``stream``'s packets, ending quietly where the container itself is damaged."""
    demux = container.demux(stream)
    while True:
        try:
            packet = next(demux)
        except StopIteration:
            return
        except av.error.FFmpegError as exc:
            log.warning("%s: container damaged, stopping demux (%s)", container.name, exc)
            return
        if packet.size:
            yield packet

"""Reading a stream's packets from a chosen keyframe, for every container FFmpeg reads.

FFmpeg seeks exactly in indexed containers (MP4, MKV) but only approximately in those without an
index (MPEG-TS, MPEG-PS), where a backward seek can land just past the keyframe asked for and
silently lose its GOP. So a seek is never trusted: the packets after it are checked by their
timestamps, a landing past the keyframe is retried from earlier keyframes, and the packets before
the keyframe are skipped without decoding.

Nor are the timestamps after a seek: MPEG-PS gives a timestamp only to the first frame of each
PES packet, and the demuxer interpolates the others from where it started reading, so after a
seek small frames come out one frame off. The packets from the keyframe on are stamped with the
timestamps the probe read demuxing from the start, by their position in decode order.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import av
import numpy as np

from vidsight.ingest.types import VideoInfo

log = logging.getLogger(__name__)

# What demuxing a damaged container raises: FFmpeg's errors, and PyAV's IndexError for a packet
# of a stream that appeared mid-file (damaged bytes read as a new stream).
DEMUX_ERRORS = (av.error.FFmpegError, IndexError)


def demux_packets(container: av.container.InputContainer, stream: av.video.stream.VideoStream
                  ) -> Iterator[av.Packet]:
    """Demux ``stream``'s non-empty packets, ending quietly where the container itself is damaged."""
    demux = container.demux(stream)
    while True:
        try:
            packet = next(demux)
        except StopIteration:
            return
        except DEMUX_ERRORS as exc:
            log.warning("%s: container damaged, stopping demux (%s)", container.name, exc)
            return
        if packet.size:
            yield packet


def shown(packet: av.Packet) -> bool:
    """Whether ``packet`` is a frame of the probe's table: timestamped, and not one an MP4 edit list
    starts after (a phone's trimmed video keeps the GOP before its cut, flagged to be decoded as a
    reference and dropped, which the decoder does)."""
    return packet.pts is not None and not packet.is_discard


def _stamped(packets: Iterator[av.Packet], decode_pts: np.ndarray, position: int) -> Iterator[av.Packet]:
    """``packets`` with the probe's timestamps, the first being the one at decode ``position``."""
    for packet in packets:
        if shown(packet):  # the probe counted only these
            if position < len(decode_pts):
                packet.pts = int(decode_pts[position])
            position += 1
        yield packet


def packets_from_keyframe(container: av.container.InputContainer, stream: av.video.stream.VideoStream,
                          info: VideoInfo, first: int) -> Iterator[av.Packet] | None:
    """The stream's packets from the keyframe at presentation index ``first`` on.

    Seeks to that keyframe, then to 1, 2, 4, ... keyframes before it while a seek lands past it,
    and finally to the stream's start.

    Returns:
        The packets, the first being the keyframe's; ``None`` when no seek reaches it (the
        container refuses to seek, or the keyframe's packet is not where the probe saw it), so
        the caller decodes from the start instead.
    """
    time_base = float(stream.time_base)
    rank = int(np.searchsorted(info.keyframe_indices, first))
    back = 0
    while True:
        target = int(info.keyframe_indices[max(rank - back, 0)])
        try:
            container.seek(int(round(info.pts_s[target] / time_base)), stream=stream, backward=True)
        except av.error.FFmpegError as exc:
            log.info("%s: cannot seek (%s)", container.name, exc)
            return None
        packets = demux_packets(container, stream)
        for packet in packets:
            if not shown(packet):
                continue
            index = info.frame_at(packet.pts * time_base)
            if index == first and packet.is_keyframe:
                return _stamped(itertools.chain([packet], packets), info.decode_pts,
                                int(info.decode_position[first]))
            if index > first:
                break  # landed past the keyframe: nothing before it in this GOP was seen
        if rank - back <= 0:
            return None
        back = max(1, 2 * back)

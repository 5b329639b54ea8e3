"""`probe`: everything about a video stream that one demux pass can tell, decoding only its first
frame (for its display rotation)."""

from __future__ import annotations

import collections
import itertools
import logging
from pathlib import Path

import av
import numpy as np

from vidsight.errors import VideoError
from vidsight.ingest.colour import mapping_of
from vidsight.ingest.container import codec_name, open_video, video_streams
from vidsight.ingest.orientation import displayed_width, pixel_aspect, quarter_turns, stored_size
from vidsight.ingest.seek import DEMUX_ERRORS
from vidsight.ingest.types import VideoInfo

log = logging.getLogger(__name__)

# How long a lone frame lasts when the stream declares no rate; also the shortest duration, so
# every video has a positive one.
ONE_FRAME_S = 0.04
# Frames come out of a decoder in presentation order, and packets in decode order reorder a few
# frames at most: a timestamp this far behind the latest is a discontinuity (MPEG-TS segments
# joined, a camera's clock restarted), which FFmpeg's tools time on past.
BACKWARD_JUMP_S = 1.0
# Frames a decoder holds back at most to reorder them (H.264's and HEVC's largest picture buffer):
# a timestamp at or below all of the last this many is a discontinuity, not a B-frame sent late.
REORDER_DEPTH = 16
# An intra-only codec (MJPEG, as many IP cameras and webcams send; ProRes and DNxHD, as editors
# write) makes every frame an I-frame: no GOP holds frames for the motion rule to gather signals
# over, and every sample is kept whole. Judged by its pixels (`--motion-source pixels`; `auto`
# leaves such a stream whole, since its coding noise differs from frame to frame and the pixel
# path, tuned on inter codecs, lost 11-24 % of a crossing object's groups on noisy generated
# scenes), its frames are grouped as an encoder would group them, this many to a group (x264's
# default keyframe interval): the first is the group's I-frame (kept whole, where the rule starts
# over and decoders start), the others are judged as P-frames.
INTRA_ONLY_GOP = 250
# Packets the probe decodes, at most, for the first frame's display rotation (a decoder holding
# frames back for B-frames gives its first within a few).
PROBE_DECODE_PACKETS = 16
# FFmpeg's AVFieldOrder values of interlaced streams (TT, BB, TB, BT), which parameter sets declare.
INTERLACED_FIELD_ORDERS = frozenset({2, 3, 4, 5})


# FFmpeg's codecs of picture formats: a file whose video is one frame in one of them is a photo, a
# screenshot or a drawing (a still image), not a video.
STILL_CODECS = frozenset({"png", "apng", "mjpeg", "jpeg2000", "jpegls", "webp", "bmp", "tiff", "gif", "qoi", "ppm",
                          "pgm", "pbm", "pam", "targa", "sgi", "dpx", "exr", "hdr", "jpegxl"})
# The brands of HEIF files holding pictures, whose codecs are video codecs' (a phone's HEIC photo
# is HEVC, an AVIF image AV1).
STILL_BRANDS = frozenset({"avif", "heic", "heix", "heim", "heis", "mif1"})


def is_still_image(path: str | Path) -> bool:
    """Whether ``path`` is a picture: its video one frame in a picture format (`STILL_CODECS`,
    or a HEIF file's `STILL_BRANDS`), found without reading a video's packets past its second. A
    file that cannot be opened is not one (what is wrong with it is said when it is probed)."""
    try:
        with open_video(path) as (container, stream):
            if (codec_name(stream) not in STILL_CODECS
                    and container.metadata.get("major_brand", "").strip() not in STILL_BRANDS):
                return False
            frames = (packet for packet in container.demux(stream) if packet.size)
            return len(list(itertools.islice(frames, 2))) == 1
    except (VideoError, *DEMUX_ERRORS):
        return False


def probe(path: str | Path) -> VideoInfo:
    """Read a file's video stream layout from its packets, and its display rotation from its first frame.

    Args:
        path: A video file.

    Returns:
        The stream's codec, size, rates, timestamp table, keyframes and GOP sizes.

    Raises:
        VideoError: unreadable file, no video stream, or no timestamped video packets.
    """
    with open_video(path) as (container, stream):
        if (streams := len(video_streams(container))) > 1:
            log.warning("%s: holds %d video streams; vidsight reads stream #%d (%s, %dx%d), the one FFmpeg's "
                        "players pick", path, streams, stream.index, codec_name(stream), stream.codec_context.width,
                        stream.codec_context.height)
        pts, keyframe, unstamped = [], [], []
        keyed, lead = False, {True: 0, False: 0}   # a keyframe seen yet; packets before it, by whether stamped
        first = _FirstFrame(stream)
        try:
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue
                first.read(packet)
                keyed = keyed or packet.is_keyframe
                if packet.is_discard:   # before an edit list's start: decoded as a reference, never shown
                    continue
                lead[packet.pts is not None] += not keyed
                if packet.pts is None:
                    unstamped.append(packet.is_keyframe)
                    continue
                pts.append(packet.pts)
                keyframe.append(packet.is_keyframe)
        except DEMUX_ERRORS as exc:
            if not pts:
                raise VideoError(f"{path}: cannot read video packets ({getattr(exc, 'strerror', None) or exc})") from exc
            # A damaged container: keep the packets read so far, and say the rest is not read.
            log.warning("%s: container damaged after %d video packets; the rest of the file is not read (%s)",
                        path, len(pts), exc)
        stamped = bool(pts)
        if keyed and (before := lead[stamped]):
            # A capture cut mid-GOP (a recording of a live stream, a camera's segment): no decoder
            # shows the frames before the first keyframe, whose references are not in the file.
            log.info("%s: starts %d frames before its first keyframe, which no decoder shows; they are left out",
                     path, before)
            if stamped:
                pts, keyframe = pts[before:], keyframe[before:]
            else:
                unstamped = unstamped[before:]
        if not stamped and unstamped:   # a raw elementary stream: every packet a frame, timed by its order
            pts, keyframe = _order_times(stream, len(unstamped)), unstamped
            log.info("%s: its packets carry no timestamps; frames timed by their order at %g fps",
                     path, untimed_fps(stream))
        ticks_per_s = 1 / float(stream.time_base)   # whole ticks: each jump's gap is one too
        frame_ticks = max(1, round(ticks_per_s / nominal_fps(stream)))
        continued = Continuation(round(BACKWARD_JUMP_S * ticks_per_s), frame_ticks)
        pts = [continued(value) for value in pts]
        if jumps := continued.jumps:
            log.warning("%s: its timestamps go back %d time(s) (segments joined, a clock restarted); the frames "
                        "after each jump are timed on from the latest time before it", path, jumps)
        timed = stamped and not jumps
        if not pts:
            raise VideoError(f"{path}: the video stream holds no frames")
        if not (stream.codec_context.width and stream.codec_context.height):
            raise VideoError(f"{path}: the video stream declares no frame size (its parameter sets are missing "
                             "or cut off)")
        decode_order_pts = np.asarray(pts, dtype=np.int64)
        order = np.argsort(decode_order_pts, kind="stable")
        pts_sorted = decode_order_pts[order]
        is_key = np.asarray(keyframe, dtype=bool)[order]
        intra_only = bool(stream.codec_context.codec.intra_only)
        if intra_only:
            is_key = np.arange(len(is_key)) % INTRA_ONLY_GOP == 0
        if not is_key[0]:
            # Streams cut from the middle may start on a non-key frame; decoding starts there anyway.
            is_key[0] = True
        time_base = stream.time_base
        pts_s = pts_sorted.astype(np.float64) * float(time_base)
        keyframe_indices = np.flatnonzero(is_key)
        gop_sizes = np.diff(np.append(keyframe_indices, len(pts_s)))
        rate = declared_fps(stream) if stamped else untimed_fps(stream)
        if len(pts_s) > 1:
            frame_step = float(np.median(np.diff(pts_s)))
        else:  # one frame (a still image, a one-frame clip): it lasts one frame at the declared rate
            frame_step = 1.0 / rate if rate > 0 else ONE_FRAME_S
        duration = max(float(pts_s[-1] - pts_s[0]) + frame_step, ONE_FRAME_S)
        average_fps = rate or len(pts_s) / duration
        aspect = pixel_aspect(stream, path)
        # A stream's parameter sets declare its colours too, for when no frame came out in time.
        colour = first.colour if first.decoded else mapping_of(stream.codec_context)
        interlaced = first.interlaced if first.decoded else stream.codec_context.field_order in INTERLACED_FIELD_ORDERS
        height, width = stored_size(stream.codec_context.height, displayed_width(stream.codec_context.width, aspect),
                                    first.turns)
        return VideoInfo(
            path=Path(path),
            codec=codec_name(stream),
            width=width,
            height=height,
            average_fps=average_fps,
            declared_fps=rate,
            time_base=(time_base.numerator, time_base.denominator),
            start_time_s=float(pts_s[0]),
            duration_s=duration,
            frame_count=len(pts_s),
            has_b_frames=(bool(np.any(np.diff(decode_order_pts) < 0)) if stamped
                          else bool(stream.codec_context.has_b_frames)),   # the order stamps say nothing
            pts_s=pts_s,
            keyframe_indices=keyframe_indices,
            gop_sizes=gop_sizes,
            decode_pts=decode_order_pts,
            timed=timed,
            rotation=90 * first.turns,
            pixel_aspect=(aspect.numerator, aspect.denominator),
            intra_only=intra_only,
            dynamic_range=colour.transfer if colour else "sdr",
            wide_gamut=bool(colour and colour.wide_gamut),
            interlaced=interlaced,
        )


class _FirstFrame:
    """The display rotation of a stream's first frame (`quarter_turns`), how its colours are
    mapped to SDR (`colour.mapping_of`) and whether it is interlaced, read by decoding packets
    during the probe's demux pass until one frame comes out (a phone's portrait video is stored
    landscape, its HDR is HLG); 0, None and False, not ``decoded``, where none does within
    `PROBE_DECODE_PACKETS` or the decoder fails."""

    def __init__(self, stream: av.video.stream.VideoStream):
        self.turns, self.colour, self.interlaced, self.decoded, self._tries = 0, None, False, False, PROBE_DECODE_PACKETS
        stream.codec_context.thread_count = 1   # frame threads would hold the first frame back

    def read(self, packet: av.Packet) -> None:
        if not self._tries:
            return
        self._tries -= 1
        try:
            frames = packet.decode()
        except av.error.FFmpegError:
            self._tries = 0
            return
        if frames:
            self.turns, self.colour, self.decoded = quarter_turns(frames[0]), mapping_of(frames[0]), True
            self.interlaced = bool(frames[0].interlaced_frame)
            self._tries = 0


class Continuation:
    """Timestamps continued past each jump back of over ``jump`` from the latest so far: the value
    after a jump lands ``step`` after that latest, and every later one moves with it. A value above
    any of the last `REORDER_DEPTH` is not a jump, however far back: packets come in decode order,
    and a B-frame shown before a gap in the recording (a camera that records on motion) is sent
    after the frame that follows the gap. The probe's ticks and the live source's seconds go
    through the same rule.

    Attributes:
        jumps: Jumps continued so far.
        shift: What every value is moved by now (from ``shift``, the one it starts with).
    """

    def __init__(self, jump: float, step: float, shift: float = 0):
        self.jump, self.step, self.jumps = jump, step, 0
        self.shift, self._latest = shift, None
        self._recent: collections.deque = collections.deque(maxlen=REORDER_DEPTH)

    def __call__(self, value: float) -> float:
        value += self.shift
        if self._latest is not None and value < self._latest - self.jump and value <= min(self._recent):
            gap = self._latest + self.step - value
            self.shift, value, self.jumps = self.shift + gap, value + gap, self.jumps + 1
        self._latest = value if self._latest is None else max(self._latest, value)
        self._recent.append(value)
        return value


def nominal_fps(stream: av.video.stream.VideoStream) -> float:
    """The rate a frame's length is taken at: the declared one, else FFmpeg's guess, else 25."""
    return declared_fps(stream) or untimed_fps(stream)


def untimed_fps(stream: av.video.stream.VideoStream) -> float:
    """The rate a stream without timestamps is timed at: FFmpeg's guess (the codec's own timing,
    H.264's or HEVC's VUI, where it is plausible), else what the raw demuxer declares (25 fps
    unless told), else 25."""
    return float(stream.guessed_rate or stream.average_rate or 0) or 1 / ONE_FRAME_S


def _order_times(stream: av.video.stream.VideoStream, frames: int) -> list[int]:
    """Timestamps (stream ticks) of ``frames`` untimed frames, one per frame at `untimed_fps`."""
    return [int(t) for t in np.rint(np.arange(frames) / (untimed_fps(stream) * float(stream.time_base)))]


def declared_fps(stream: av.video.stream.VideoStream) -> float:
    """The frame rate a video stream declares (its average rate, else FFmpeg's guess); 0 if none."""
    return float(stream.average_rate or stream.guessed_rate or 0)

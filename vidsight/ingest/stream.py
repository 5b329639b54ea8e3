"""Live sources for the watch and chat workloads: every frame decoded once and sampled (`windows`
cuts the samples into watch's sliding windows).

A source is a video file (replayed as fast as possible or at its real rate, or followed while it
grows, as a recorder writes MPEG-TS), a pipe read as it comes (a shell pipeline's standard input,
a named pipe), or a network stream FFmpeg can open (RTSP, HTTP, ...), reopened with exponential
back-off when it drops. Reopening resumes after the last frame seen (a live RTSP camera, whose
clock starts over with each connection, goes on from it). Frames are
sampled at a fixed rate by presentation time; a sampled frame carries the codec signals of every
frame decoded since the previous sample (CodecSight section 3.3): the largest motion, the
intra-coded blocks, and the blocks the motion rule (`MotionPruneConfig`) found dynamic.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np
import torch

from vidsight.errors import ConfigError, VideoError
from vidsight.ingest.container import (NETWORK_SCHEMES, READ_OPTIONS, check_readable, codec_name, open_error,
                                       video_stream)
from vidsight.ingest.decode import configure_decoder
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.judge import NO_SIGNALS, FrameJudge, SampleSignals, frame_kind, grouped, motion_source
from vidsight.ingest.orientation import displayed_width, pixel_aspect, quarter_turns, stored_size, upright, upright_codec
from vidsight.ingest.picture import to_rgb
from vidsight.ingest.probe import BACKWARD_JUMP_S, Continuation, declared_fps, nominal_fps, untimed_fps
from vidsight.ingest.seek import DEMUX_ERRORS
from vidsight.ingest.types import CodecInfo, FrameBatch

log = logging.getLogger(__name__)


# FFmpeg opens further resources from inside a stream (an HLS playlist's segments and keys, RTSP's
# transports): a network source may use only its own scheme's protocols, so a playlist cannot make
# FFmpeg read `file:`, `concat:`, `subfile:`, a pipe or any other protocol.
PROTOCOL_WHITELIST = {"rtsp": "rtsp,rtp,srtp,udp,tcp,tls", "rtmp": "rtmp,rtmps,rtmpt,rtmpts,tcp,tls",
                      "http": "http,https,httpproxy,tcp,tls,crypto", "https": "http,https,httpproxy,tcp,tls,crypto",
                      "udp": "udp,rtp",
                      "tcp": "tcp", "srt": "srt,udp"}


@dataclasses.dataclass
class SampledFrame:
    """One sampled frame with the codec signals of the frames decoded since the previous sample."""

    index: int            # sample number in the stream, from 0
    frame_index: int      # decoded-frame number in the stream
    pts_s: float
    rgb: torch.Tensor     # (H, W, 3) uint8
    # Type, GOP; motion (max), intra and dynamic blocks (union) since the last sample. None when the
    # samples before it were dropped (`FrameQueue`): what changed since the last one seen is unknown.
    codec: CodecInfo | None
    gop_start: bool = False  # the first sampled frame at or after a keyframe (the I-frame itself when sampled)
    received: float = 0.0    # time.monotonic() when it arrived (`StreamSource._arrival`)


class StreamSource:
    """Decodes a file or network stream once and yields frames sampled at ``fps``.

    Args:
        source: A file path, a stream URL, or a binary file object read once from its current
            position (a pipe: `sys.stdin.buffer`, an opened FIFO), in a format FFmpeg can read
            without seeking unless the object can seek (MPEG-TS, Matroska, fragmented MP4, a raw
            H.264 or HEVC stream; not an MP4 or MOV with its index at the end).
        fps: Sampling rate.
        realtime: Pace a file at its own frame rate, as a camera would deliver it.
        motion: Collect H.264 motion vectors and judge each frame's blocks by this rule (for
            motion-guided pruning); None decodes without vectors.
        reconnect_tries: Reopen a network stream this many times in a row after it drops or fails
            to open (0 for files); a frame decoded starts the count again.
        reconnect_window_s: Give up on a network stream failing without a frame for this long,
            whatever the count. A source that opens but holds no video (FFmpeg finds no media in
            it, or no video stream) fails at once.
        follow_idle_s: Keep reading a file that grows; stop once it has not grown for this long
            (None: read it once). A followed file may start empty or with an incomplete header,
            as a recorder has just created it.
        ffmpeg_options: Options for FFmpeg's open (e.g. ``http_proxy``); a network source also
            gets its scheme's protocol whitelist.
    """

    def __init__(self, source: str | Path | BinaryIO, fps: float, realtime: bool = False, motion: MotionPruneConfig | None = None,
                 reconnect_tries: int = 5, follow_idle_s: float | None = None, ffmpeg_options: dict | None = None,
                 reconnect_window_s: float = 60.0):
        self.pipe = None if isinstance(source, (str, Path)) else source
        self.source = str(source) if self.pipe is None else _pipe_name(source)
        self.ffmpeg_options = dict(ffmpeg_options or {})
        self.network = self.pipe is None and self.source.startswith(NETWORK_SCHEMES)
        if follow_idle_s is not None and not follow_idle_s > 0:
            raise ConfigError(f"follow idle time must be positive seconds, got {follow_idle_s}")
        if follow_idle_s is not None and self.pipe is not None:
            raise ConfigError(f"{self.source}: a pipe is read as it comes and ends when its writer closes it; "
                              "following is for a file a recorder is still writing")
        if not self.network and self.pipe is None:
            check_readable(self.source, allow_empty=follow_idle_s is not None)
        self.fps, self.realtime, self.motion = fps, realtime, motion
        self.reconnect_tries = reconnect_tries if self.network else 0
        self.reconnect_window_s = reconnect_window_s
        self.follow_idle_s = None if self.network else follow_idle_s
        self.frames_decoded = 0   # every decoded frame, counted once
        self.damaged_packets = 0  # packets the decoder rejected, skipped (`_frames`)
        self._last_frame_at: float | None = None   # when the last frame was decoded (`time.monotonic`)
        self._paced_at: float | None = None   # realtime: when a frame is due (`time.monotonic`), less its time
        self._carried_shift = 0.0   # a live stream's jumps back continued so far, for its next connection
        self._endless = False        # a network stream that declared no duration when opened
        self._closing = threading.Event()   # `close`d: read no further, reconnect no more, wait no longer
        self.codec: str | None = None   # the video stream's codec, once opened
        self.frame_rate = 0.0           # and the frame rate it declares
        self.pixel_aspect = Fraction(1)  # and its pixels' displayed width over height (`pixel_aspect`)
        self.intra_only = False         # and whether its codec codes every frame alone
        self._first_coded: tuple[int, int] | None = None   # the first frame's stored size
        self._resized = False           # a frame of another size was scaled (said once)

    @property
    def motion_source(self) -> str | None:
        """Where the judged motion comes from (`judge.motion_source`): ``codec`` or ``pixels``; None
        before the stream is open or when motion is not judged."""
        return motion_source(self.motion, self.codec, self.intra_only) if self.codec is not None else None

    def __iter__(self) -> Iterator[SampledFrame]:
        attempt, sampled, resume_after, since = 0, 0, -math.inf, SampleSignals()
        due = 0        # the sample grid's next time, in samples from the first frame's
        origin = None  # the first frame's time: streams rarely start at 0
        failing_since = None   # when the current run of failures began
        shown = None   # the first sampled frame's (height, width) as displayed, every frame's size
        while True:
            size = self._size()  # before reading: growth while decoding counts as growth
            decoded_before = self.frames_decoded
            try:
                for (frame, index, pts_s, kind, gop), step in self._judged(self._decoded(resume_after), since):
                    if self._closing.is_set():
                        return
                    attempt, failing_since = 0, None
                    since.add(kind, step)
                    resume_after = pts_s
                    origin = pts_s if origin is None else origin
                    if pts_s - origin < due / self.fps - 1e-6:
                        continue
                    # Grid times a gap in the recording passed (a camera that records on motion)
                    # are skipped, not made up by every frame after it.
                    due = max(due + 1, math.floor((pts_s - origin) * self.fps + 1e-6) + 1)
                    turns = quarter_turns(frame)
                    shown = shown or stored_size(frame.height, displayed_width(frame.width, self.pixel_aspect), turns)
                    rgb = torch.from_numpy(upright(self._rgb(frame, stored_size(*shown, turns)), turns))
                    signals, keyframe = since.take()
                    yield SampledFrame(sampled, index, pts_s, rgb, upright_codec(CodecInfo(kind, gop, *signals), turns),
                                       keyframe, self._arrival(pts_s))
                    sampled += 1
                if self._closing.is_set():
                    return
                if not self._grew(size):
                    if self.frames_decoded == 0:
                        raise VideoError(f"{self.source}: no frame of its video stream could be decoded")
                    return
            except (VideoError, OSError, *DEMUX_ERRORS) as exc:
                # A followed file's growing edge (too short to open yet, a packet half written):
                # read on once the recorder has written more.
                if self.follow_idle_s is not None and self._grew(size):
                    continue
                if isinstance(exc, VideoError):
                    raise
                if self._closing.is_set():
                    return
                if isinstance(exc, av.error.InvalidDataError) and self.frames_decoded == decoded_before:
                    raise self._unreadable(exc) from exc
                failing_since = time.monotonic() if failing_since is None else failing_since
                if attempt >= self.reconnect_tries or time.monotonic() - failing_since > self.reconnect_window_s:
                    raise VideoError(f"{self.source}: stream failed {attempt + 1} times in a row "
                                     f"over {time.monotonic() - failing_since:.0f} s ({exc})") from exc
                wait = min(30.0, 2.0 ** attempt)
                log.warning("%s: stream dropped (%s); reconnecting in %.0f s", self.source, exc, wait)
                if self._pause(wait):
                    return
                attempt += 1

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` unless `close` comes first; whether it came."""
        return self._closing.wait(seconds)

    def close(self) -> None:
        """Stop reading, from any thread: the frames end at the next one decoded, and a stream
        that drops is not reopened, and a real-time replay waiting for its next frame's time stops
        waiting (a watch or a session stopped while its reader waits on it)."""
        self._closing.set()

    @property
    def endless(self) -> bool:
        """Whether this is a network stream that declared no duration (a camera, a live HLS
        playlist), which cannot be read again from its start; one with a duration is a recording
        served over the network. False until it is opened."""
        return self._endless

    @property
    def live(self) -> bool:
        """Whether frames come at the source's pace, not the reader's: an `endless` stream, or a
        replay in real time."""
        return self.realtime or self._endless

    def _size(self) -> int:
        return 0 if self.network or self.pipe is not None else Path(self.source).stat().st_size

    def _rgb(self, frame: av.VideoFrame, stored: tuple[int, int]) -> np.ndarray:
        """``frame`` as SDR RGB (`colour.to_rgb`) at ``stored``, the ``(height, width)`` the stream's first frame is shown at
        before it is turned (its width stretched by `pixel_aspect`): a stream whose size changes (an
        adaptive HLS rendition, a camera reconfigured) is scaled back to it, as `ask` scales every
        frame to the probe's size, so a window or a session sees one size."""
        coded = (frame.height, frame.width)
        self._first_coded = self._first_coded or coded
        if coded != self._first_coded and not self._resized:
            self._resized = True
            log.warning("%s: frame size changed mid-stream from %dx%d to %dx%d; later frames are scaled to the first's",
                        self.source, self._first_coded[1], self._first_coded[0], frame.width, frame.height)
        return to_rgb(frame, None if coded == stored else stored)

    def _unreadable(self, exc: av.error.InvalidDataError) -> VideoError:
        """The error for a source whose first frames FFmpeg found no video stream in."""
        if self.pipe is None:
            return VideoError(f"{self.source}: not a video stream ({exc})")
        # An MP4 or MOV is read by seeking to each frame's offset, which a pipe cannot do.
        return VideoError(f"{self.source}: not a video stream FFmpeg can read from a pipe (an MP4 or MOV needs "
                          "seeking: give it as a file, or pipe MPEG-TS, Matroska, fragmented MP4 or a raw H.264 "
                          "or HEVC stream)")

    def _grew(self, size: int) -> bool:
        """For a followed file: whether it is, or within ``follow_idle_s`` becomes, larger than ``size`` bytes."""
        if self.follow_idle_s is None:
            return False
        deadline = time.monotonic() + self.follow_idle_s
        while True:
            if self._size() != size:
                return True
            if time.monotonic() >= deadline or self._pause(min(0.1, self.follow_idle_s)):
                return False

    def _judged(self, decoded, since: SampleSignals):
        """``(decoded item, signals)`` of each decoded frame, in presentation order (`FrameJudge`;
        ``since``: the samples' signals so far, which say when a GOP's rule can stop)."""
        if self.motion is None:
            for item in decoded:
                yield item, NO_SIGNALS
            return
        judge = None
        for item in decoded:
            if judge is None:   # the codec is known once the stream is open
                source = self.motion_source
                if source is None and self.intra_only and self.motion.source == "auto":
                    # Every frame comes as an I-frame, kept whole: the watch runs unpruned.
                    log.warning("%s: %s codes every frame alone; --motion-source auto does not prune it "
                                "(--motion-source pixels judges its pixels in groups of frames)", self.source, self.codec)
                    yield item, NO_SIGNALS
                    yield from ((rest, NO_SIGNALS) for rest in decoded)
                    return
                if source is None:
                    raise ConfigError(f"{self.source}: {self.codec} carries no motion vectors to prune by; "
                                      f"--motion-source {'pixels' if self.intra_only else 'auto or pixels'} "
                                      "estimates them from the decoded pixels")
                judge = FrameJudge(self.motion, source, self.frame_rate)
            yield from judge.push(item[0], item[3], item, since.saturated)
        if judge is not None:
            yield from judge.finish()

    def _options(self) -> dict[str, str]:
        if not self.network:
            return dict(self.ffmpeg_options)
        return {**self.ffmpeg_options, "protocol_whitelist": PROTOCOL_WHITELIST[self.source.partition(":")[0]]}

    def _decoded(self, resume_after: float):
        """``(frame, index, pts_s, type, gop)`` of every frame after ``resume_after`` s."""
        try:
            container = av.open(self.source if self.pipe is None else self.pipe, **READ_OPTIONS,
                                timeout=10.0 if self.network else None, options=self._options())
        except av.error.FFmpegError as exc:
            if self.network:
                raise
            if self.pipe is not None and isinstance(exc, av.error.InvalidDataError):
                raise self._unreadable(exc) from exc
            raise open_error(self.source, exc) from exc
        with container:
            stream = video_stream(container, self.source)
            self.codec, self.pixel_aspect = codec_name(stream), pixel_aspect(stream, self.source)
            self.intra_only = bool(stream.codec_context.codec.intra_only)
            configure_decoder(stream, self.motion_source == "codec", "AUTO")
            start, gop, began = None, -1, time.monotonic()
            position, in_groups = itertools.count(), grouped(self.intra_only, self.motion_source)
            # FFmpeg times an RTSP stream from its connection's first packet, so a live camera's
            # clock starts over at each reconnection: its frames would all lie before the last one
            # seen and be skipped for as long as the stream had run. They go on from there instead.
            # (One with a duration is a recording served from its start again: seen frames are skipped.)
            live = self._endless = self.network and container.duration is None
            clock_restarts, shift = live and self.source.startswith("rtsp://"), None
            # Another live stream (HLS, MPEG-TS over HTTP or UDP) resumes with the timestamps it
            # sends: a jump back the last connection continued (an HLS discontinuity) still stands.
            carries = live and not clock_restarts
            clock = _FrameClock(stream, self.source, self._carried_shift if carries else 0.0)
            for frame in self._frames(container, stream):
                pts_s = clock.time_of(frame)
                self.frame_rate = clock.rate
                if carries:
                    self._carried_shift = clock.shift
                if pts_s is None:
                    continue
                if clock_restarts:
                    shift = self._timed_on(resume_after, pts_s) if shift is None else shift
                    pts_s += shift
                kind = frame_kind(frame, next(position), in_groups)
                gop += kind == "I"
                if pts_s <= resume_after:
                    continue
                self.frames_decoded += 1
                self._last_frame_at = time.monotonic()
                start = pts_s if start is None else start
                if self.realtime:
                    self._paced_at = began - start
                    if self._pause(max(0.0, pts_s + self._paced_at - time.monotonic())):
                        return
                yield frame, self.frames_decoded - 1, pts_s, kind, max(gop, 0)

    def _arrival(self, pts_s: float) -> float:
        """When the frame at ``pts_s`` reached vidsight (`time.monotonic`): a real-time replay's when
        it was due, as a camera delivers it however late it is read; any other's when decoded (a
        stream read only when its reader is free has waited in the network's buffers before)."""
        return pts_s + self._paced_at if self.realtime and self._paced_at is not None else time.monotonic()

    def _timed_on(self, last_s: float, first_s: float) -> float:
        """The shift that times a reconnected live stream whose first frame is at ``first_s`` after
        the last frame seen, at ``last_s``, by as long as the reconnection took (0 where it is after)."""
        if self._last_frame_at is None or first_s > last_s:
            return 0.0
        at_s = last_s + max(1 / (self.frame_rate or 25.0), time.monotonic() - self._last_frame_at)
        log.warning("%s: the stream's clock started over when it reconnected; its frames are timed on from %.1f s",
                    self.source, at_s)
        return at_s - first_s

    def _frames(self, container: av.container.InputContainer, stream: av.video.stream.VideoStream):
        """Every frame ``stream`` decodes to. A packet the decoder rejects (damaged: bits flipped in a
        file, a datagram lost from a network stream) is skipped and counted, as `ask`'s decoders
        skip one; the frames that refer to it decode as well as they can, as in FFmpeg's players."""
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.error.FFmpegError as exc:
                self.damaged_packets += 1
                if self.damaged_packets == 1:
                    log.warning("%s: the decoder rejected a damaged packet (%s); skipping it and any others",
                                self.source, exc)
                continue
            yield from frames


def _pipe_name(pipe: BinaryIO) -> str:
    """What messages call a pipe: its file name (``<stdin>``, a FIFO's path), else ``<pipe>``."""
    name = getattr(pipe, "name", None)
    return name if isinstance(name, str) else "<pipe>"


class _FrameClock:
    """Each decoded frame's time in seconds, on one timeline: its timestamp; its place in the
    order at the stream's rate where the stream has none (a raw elementary stream, as many cameras
    send, known by its first frame, as `probe` times such a file); and continued past a timestamp
    that goes back over `BACKWARD_JUMP_S` (MPEG-TS parts joined, an encoder or a camera's clock
    restarted, an HLS discontinuity) by the probe's `Continuation`, as FFmpeg's tools continue it.
    One clock times one connection: a network stream's next one resumes after the last time seen
    (a live RTSP stream's, which start over, shifted by `StreamSource._timed_on`; another live
    stream's continued by the shift its last connection ended with).

    Attributes:
        rate: The stream's frame rate (its declared one; for one timed by order, that order's).
    """

    def __init__(self, stream: av.video.stream.VideoStream, source: str, shift: float = 0.0):
        self._stream, self._source = stream, source
        self.by_order: bool | None = None
        self.rate = declared_fps(stream)
        self._order = itertools.count()
        self._continued = Continuation(BACKWARD_JUMP_S, 1 / nominal_fps(stream), shift)

    @property
    def shift(self) -> float:
        """Seconds the frames' timestamps are moved by (jumps back continued)."""
        return self._continued.shift

    def time_of(self, frame: av.VideoFrame) -> float | None:
        """``frame``'s time in seconds; None for a frame without a timestamp in a stream that has them."""
        if self.by_order is None:
            self.by_order = frame.pts is None
            self.rate = untimed_fps(self._stream) if self.by_order else self.rate
        if self.by_order:
            return next(self._order) / self.rate
        if frame.pts is None:
            return None
        time_s = frame.pts * float(self._stream.time_base)
        jumps = self._continued.jumps
        time_s = self._continued(time_s)
        if self._continued.jumps > jumps:
            log.warning("%s: timestamps go back at %.1f s; the frames after are timed on from there",
                        self._source, time_s)
        return time_s


def as_batch(frames: list[SampledFrame]) -> FrameBatch:
    """A window as a `FrameBatch` (for the ask path)."""
    return FrameBatch(data=torch.stack([f.rgb for f in frames]),
                      pts_s=torch.tensor([f.pts_s for f in frames], dtype=torch.float64),
                      indices=torch.tensor([f.frame_index for f in frames]),
                      codec=[f.codec for f in frames])

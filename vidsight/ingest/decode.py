"""Sequential single-pass decoding of chosen frames, with the codec's own signals alongside."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import av
import numpy as np
import torch

from vidsight.errors import ConfigError, VideoError
from vidsight.ingest.container import MAX_FRAME_SIDE, codec_name, open_video
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.judge import (MOTION_VECTOR_CODECS, FrameJudge, SampleSignals, Signals, frame_kind, grouped,
                                   frame_vectors, motion_source)
from vidsight.ingest.motion import motion_map
from vidsight.ingest.nal import is_non_reference, nal_length_size
from vidsight.ingest.orientation import quarter_turns, stored_size, upright, upright_codec
from vidsight.ingest.picture import to_rgb, to_rgb_to_resize
from vidsight.ingest.probe import probe
from vidsight.ingest.seek import demux_packets, packets_from_keyframe, shown
from vidsight.ingest.types import CodecInfo, FrameBatch, VideoInfo

log = logging.getLogger(__name__)

THREAD_MODES = ("AUTO", "FRAME", "SLICE", "NONE")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How frames are decoded.

    Attributes:
        size: Output ``(height, width)``, resized in the decoding thread, by FFmpeg's swscale
            (bicubic) unless ``resize`` is given; ``None`` keeps the coded size.
        resize: The resize to use instead of swscale: called with ``(1, H, W, 3)`` uint8 RGB
            frames at the coded size and ``size``, returns ``(1, 3, h, w)`` uint8 (e.g. the
            model's own preprocessing resize, so the frames equal what resizing them later would
            give, while the buffer holds only resized frames); an HDR or wide-gamut frame over
            twice ``size`` is mapped after FFmpeg scales it to twice ``size`` (`to_rgb_to_resize`).
        with_codec_info: Return per-frame frame types, GOP indices and (H.264) motion vectors.
            Vectors need FFmpeg's export_mvs with slice threading or none: frame threading returns
            wrong, run-to-run different B-frame vectors.
        motion: Judge every decoded H.264 frame's blocks by this rule (motion-guided pruning);
            each returned frame's codec information then holds the signals of its GOP's frames
            since the previous returned frame, as a `StreamSource` sampling the same frames gives
            them (implies ``with_codec_info``). Each GOP is then decoded from its keyframe through
            its last wanted frame whatever ``trim_gops`` says, since the rule reads every frame.
        threads: FFmpeg's threading for a sequential decode: ``"AUTO"`` (frame and slice threads),
            ``"FRAME"``, ``"SLICE"`` or ``"NONE"`` (one thread). Parallel decoding runs each of its
            decoders single-threaded whatever this says.
        trim_gops: Send the decoder only the packets wanted frames depend on: a GOP holding no
            wanted frame is skipped, a GOP stops once its wanted frames' packets are sent (the
            decoder is drained and restarts clean at the next keyframe, as after a seek), and
            unwanted H.264 pictures that no other picture refers to are never sent. Exact, and
            much less decoding when samples are sparse; off decodes every frame like other video
            loaders.
    """

    size: tuple[int, int] | None = None
    resize: Callable[[torch.Tensor, tuple[int, int]], torch.Tensor] | None = None
    with_codec_info: bool = False
    threads: str = "AUTO"
    trim_gops: bool = False
    motion: MotionPruneConfig | None = None

    def __post_init__(self):
        if self.threads not in THREAD_MODES:
            raise ConfigError(f"threads must be one of {', '.join(THREAD_MODES)}, got {self.threads!r}")
        if self.size is not None:
            h, w = self.size
            if not (0 < h <= MAX_FRAME_SIDE and 0 < w <= MAX_FRAME_SIDE):
                raise ConfigError(f"decode size {self.size} must be between 1 and {MAX_FRAME_SIDE} per side")
        if self.resize is not None and self.size is None:
            raise ConfigError("a resize function needs the size to resize to")
        if self.motion is not None:
            object.__setattr__(self, "with_codec_info", True)


def configure_decoder(stream: av.video.stream.VideoStream, with_motion: bool, threads: str) -> None:
    if with_motion:
        stream.codec_context.options = {"flags2": "+export_mvs"}
        stream.thread_type = "SLICE"
    elif threads == "NONE":
        stream.codec_context.thread_count = 1
    else:
        stream.thread_type = threads


class FrameSink:
    """The preallocated output of a decode: where each wanted frame goes, and which have arrived.

    Decoders running in parallel share one sink; each writes only the slots of its own frames.
    """

    def __init__(self, path, info: VideoInfo, indices: np.ndarray | None, config: DecodeConfig,
                 on_frame: Callable[[int], None] | None = None, buffer: memoryview | None = None):
        wanted = np.arange(info.frame_count) if indices is None else np.unique(np.asarray(indices, dtype=np.int64))
        if len(wanted) == 0:
            raise ConfigError(f"{path}: no frames requested")
        if wanted[0] < 0 or wanted[-1] >= info.frame_count:
            raise VideoError(f"{path}: frame index out of range 0..{info.frame_count - 1}")
        self.path, self.info, self.config, self.wanted = path, info, config, wanted
        self.height, self.width = config.size or (info.height, info.width)
        self.slot_of = {int(i): k for k, i in enumerate(wanted)}
        shape = _frame_shape(info, len(wanted), config)
        # buffer: shared memory that decoding processes write into (see `frame_bytes`).
        frames = (np.empty(shape, dtype=np.uint8) if buffer is None
                  else np.frombuffer(buffer, dtype=np.uint8, count=math.prod(shape)).reshape(shape))
        self.data = torch.from_numpy(frames)
        self.got = np.zeros(len(wanted), dtype=bool)
        self.codec: list[CodecInfo | None] = [None] * len(wanted)
        # The motion rule and where its vectors come from, when this codec's motion can be judged.
        self.motion_source = motion_source(config.motion, info.codec, info.intra_only)
        # Export the codec's vectors: to judge by them, or to report them where no rule judges.
        self.with_motion = config.with_codec_info and info.codec in MOTION_VECTOR_CODECS and (
            config.motion is None or self.motion_source == "codec")
        self.judging = config.motion if self.motion_source is not None else None
        self.bad_packets = 0
        self._restarted = False  # a span was decoded from the start (said once)
        self.on_frame = on_frame
        self._lock = threading.Lock()

    def store(self, index: int, frame: av.VideoFrame, signals: tuple[Signals, bool] | None = None) -> None:
        """Keep ``frame`` if ``index`` is wanted; ``signals``: what the motion rule gathered since
        the previous wanted frame (`SampleSignals.take`), when the sink judges motion."""
        slot = self.slot_of.get(index)
        if slot is None or self.got[slot]:
            return
        turns = quarter_turns(frame)
        if self.config.resize is None:
            height, width = stored_size(self.height, self.width, turns)
            self.data[slot] = torch.from_numpy(upright(to_rgb(frame, (height, width)), turns))
        else:
            coded = torch.from_numpy(upright(to_rgb_to_resize(frame, stored_size(self.height, self.width, turns)),
                                             turns))[None]
            self.data[slot] = self.config.resize(coded, (self.height, self.width))[0].permute(1, 2, 0)
        if self.config.with_codec_info:
            gop = int(self.info.gop_index_of(np.array([index]))[0])
            if signals is not None:
                codec = CodecInfo(self.kind(frame, index), gop, *signals[0])
            else:
                motion = motion_map(frame_vectors(frame), frame.height, frame.width) if self.with_motion else None
                codec = CodecInfo(self.kind(frame, index), gop, motion)
            self.codec[slot] = upright_codec(codec, turns)
        with self._lock:
            self.got[slot] = True
            if self.on_frame is not None:
                self.on_frame(int(self.got.sum()))

    def kind(self, frame: av.VideoFrame, index: int) -> str:
        """The type of ``frame``, the ``index``-th, as the motion rule reads it (`frame_kind`)."""
        return frame_kind(frame, index, grouped(self.info.intra_only, self.motion_source))

    @staticmethod
    def frame_bytes(info: VideoInfo, indices: np.ndarray | None, config: DecodeConfig) -> int:
        """Bytes of the frame buffer a sink for these frames needs."""
        count = info.frame_count if indices is None else len(np.unique(np.asarray(indices)))
        return math.prod(_frame_shape(info, count, config))

    def absorb(self, slots: np.ndarray, codec: list[CodecInfo | None], bad_packets: int) -> None:
        """Record frames another process decoded into this sink's shared buffer."""
        with self._lock:
            self.got[slots] = True
            for slot, entry in zip(slots, codec):
                self.codec[slot] = entry
            self.bad_packets += bad_packets
            if self.on_frame is not None:
                self.on_frame(int(self.got.sum()))

    def note_restart(self, first: int) -> None:
        """A span that no seek reaches is decoded from the file's start: say so once per decode."""
        with self._lock:
            if self._restarted:
                return
            self._restarted = True
        log.warning("%s: no seek reaches the keyframe at frame %d (the container refuses or misplaces it); spans "
                    "like it are decoded from the start of the file: the same frames, more slowly", self.path, first)

    def count_bad_packet(self) -> None:
        with self._lock:
            self.bad_packets += 1

    def batch(self, strategy: str) -> FrameBatch:
        got, wanted = self.got, self.wanted
        lost = int((~got).sum())
        if lost == len(wanted):
            raise VideoError(f"{self.path}: none of the {len(wanted)} requested frames could be decoded (corrupt data)")
        if lost:
            log.warning("%s: %d of %d requested frames could not be decoded (%d damaged packets)",
                        self.path, lost, len(wanted), self.bad_packets)
        return FrameBatch(
            data=self.data[torch.from_numpy(got)] if lost else self.data,
            pts_s=torch.from_numpy(self.info.pts_s[wanted[got]]),
            indices=torch.from_numpy(wanted[got]),
            codec=[c for c, ok in zip(self.codec, got) if ok] if self.config.with_codec_info else [],
            frames_lost=lost,
            strategy=strategy,
            motion=self.judging,
        )


def _frame_shape(info: VideoInfo, count: int, config: DecodeConfig) -> tuple[int, int, int, int]:
    """``(count, height, width, 3)``: the layout of a sink's frames."""
    return (count, *(config.size or (info.height, info.width)), 3)


def decode_span(sink: FrameSink, first: int, last: int, threads: str) -> None:
    """Decode presentation indices ``first..last`` into ``sink``, starting at the keyframe at ``first``.

    Args:
        sink: Receives the wanted frames of the span (and says whether to trim GOPs).
        first: A keyframe index (0 decodes from the file's start without seeking).
        last: The last index to produce; decoding stops once it is out.
        threads: FFmpeg threading for this decoder (see `DecodeConfig`); motion vectors always
            use slice threading.
    """
    with open_video(sink.path) as (container, stream):
        configure_decoder(stream, sink.with_motion, threads)
        packets = demux_packets(container, stream) if first == 0 else packets_from_keyframe(
            container, stream, sink.info, first)
        if packets is not None:
            _decode_packets(sink, stream, packets, first, last)
            return
    sink.note_restart(first)
    with open_video(sink.path) as (container, stream):
        configure_decoder(stream, sink.with_motion, threads)
        _decode_packets(sink, stream, demux_packets(container, stream), first, last)


def _decode_packets(sink: FrameSink, stream: av.video.stream.VideoStream, packets: Iterator[av.Packet],
                    first: int, last: int) -> None:
    """Decode ``packets`` into ``sink`` until presentation index ``last`` is out (see `decode_span`)."""
    info = sink.info
    time_base = float(stream.time_base)
    judge = _SpanJudge(sink, first, last) if sink.judging is not None else None
    # A stream not timed by its own timestamps is decoded from its start, its frames stamped in the
    # order they come out with the times the probe gave them (`VideoInfo.timed`); its packets'
    # timestamps, if any, say nothing of which frame is which, so no GOP is trimmed by them.
    order_stamps = None if info.timed else iter(np.sort(info.decode_pts).tolist())
    gops = (_GopTrimmer(info, sink.wanted, first, last, stream, every_frame=judge is not None)
            if sink.config.trim_gops and info.timed else None)

    def index_of(pts: int) -> int | None:
        return info.shown_at(pts * time_base)

    def take(frame: av.VideoFrame) -> bool:
        """Store ``frame`` if it is in the span; True once the span is complete."""
        if order_stamps is not None:
            frame.pts = next(order_stamps, None)
        index = None if frame.pts is None else index_of(frame.pts)
        if index is None:   # untimed, or not a frame of the probe's table
            return False
        if judge is not None:
            return judge.take(frame, index)
        if first <= index <= last:
            sink.store(index, frame)
        return index >= last

    for packet in packets:
        index = index_of(packet.pts) if gops and shown(packet) else None
        if gops:
            if packet.is_keyframe and index is not None:
                gops.enter(index)
            if gops.skipping or gops.unwanted_non_reference(packet, index):
                continue
        try:
            frames = packet.decode()
        except av.error.FFmpegError:
            sink.count_bad_packet()
            frames = []
        if any([take(f) for f in frames]):
            break
        if gops and gops.sent(index):
            # Nothing later in this GOP is needed: drain what the decoder holds back for
            # reordering, then restart it clean for the next needed keyframe.
            if _drain(stream, take, sink):
                break
            stream.codec_context.flush_buffers()
    else:
        _drain(stream, take, sink)
    if judge is not None:
        judge.finish()


def _drain(stream: av.video.stream.VideoStream, take: Callable[[av.VideoFrame], bool], sink: FrameSink) -> bool:
    """Flush the frames the decoder still holds into ``take``; True once ``take`` says the span is done."""
    try:
        return any([take(frame) for frame in stream.codec_context.decode(None)])
    except av.error.FFmpegError:
        sink.count_bad_packet()
        return False


class _SpanJudge:
    """The motion rule over one span's decoded frames (`DecodeConfig.motion`).

    Every frame from the span's keyframe on is judged in presentation order, the previous span's
    open-GOP leading pictures excepted (the rule starts over at the keyframe anyway); a wanted
    frame is stored with the signals gathered since the previous one. The span is complete once
    its last frame is out and judged (a B-frame judged with residuals waits for its future reference).
    """

    def __init__(self, sink: FrameSink, first: int, last: int):
        self.sink, self.first, self.last = sink, first, last
        self.judge, self.since = FrameJudge(sink.judging, sink.motion_source, sink.info.declared_fps), SampleSignals()

    def take(self, frame: av.VideoFrame, index: int) -> bool:
        if index >= self.first:
            self._record(self.judge.push(frame, self.sink.kind(frame, index), (frame, index), self.since.saturated))
        return index >= self.last and not self.judge.waiting

    def finish(self) -> None:
        self._record(self.judge.finish())

    def _record(self, judged) -> None:
        for (frame, index), signals in judged:
            self.since.add(self.sink.kind(frame, index), signals)
            if index <= self.last and index in self.sink.slot_of:
                self.sink.store(index, frame, self.since.take())


class _GopTrimmer:
    """Which packets of a span the wanted frames need (`DecodeConfig.trim_gops`).

    Every picture a frame refers to comes before it in decoding order, so once the packets of a
    GOP's wanted frames have all been sent, nothing later in that GOP is needed: the decoder is
    drained and the packets up to the next GOP with a wanted frame are skipped. Within a needed
    GOP, an H.264 packet of an unwanted non-reference picture is not needed either, nor any
    unwanted frame of an intra-only stream. Wanted frames
    are tracked by presentation index, so an open GOP's leading pictures (presented before their
    keyframe, sent after it) keep the previous GOP going until they are sent. With
    ``every_frame`` (a motion rule reads every frame), a GOP needs all its frames up to its last
    wanted one.
    """

    def __init__(self, info: VideoInfo, wanted: np.ndarray, first: int, last: int,
                 stream: av.video.stream.VideoStream, every_frame: bool = False):
        self.keyframes = info.keyframe_indices
        needed = wanted[(wanted >= first) & (wanted <= last)]
        if every_frame and len(needed):
            gops = info.gop_index_of(needed)
            ends = needed[np.append(np.flatnonzero(np.diff(gops)), len(needed) - 1)]
            needed = np.concatenate([np.arange(self.keyframes[g], end + 1) for g, end in zip(np.unique(gops), ends)])
        self.wanted = {int(i) for i in needed}
        self.unsent = set(self.wanted)
        self._order = sorted(self.wanted)  # the smallest unsent index is the first of these still unsent
        self._smallest = 0
        self.gop_end = np.iinfo(np.int64).max  # unknown until the first keyframe's packet
        self.skipping = False
        self.h264 = codec_name(stream) == "h264"
        self.intra_only = info.intra_only   # no frame refers to another: any unwanted one can go
        self.length_size = nal_length_size(stream.codec_context.extradata) if self.h264 else None

    def unwanted_non_reference(self, packet: av.Packet, index: int | None) -> bool:
        return (index is not None and index not in self.wanted
                and (self.intra_only or (self.h264 and is_non_reference(bytes(packet), self.length_size))))

    def enter(self, keyframe: int) -> None:
        """A keyframe's packet arrives: decode its GOP only if it has a wanted frame still to send."""
        following = int(np.searchsorted(self.keyframes, keyframe, side="right"))
        self.gop_end = int(self.keyframes[following]) if following < len(self.keyframes) else np.iinfo(np.int64).max
        self.skipping = not self._needed()

    def sent(self, index: int | None) -> bool:
        """The packet at ``index`` went to the decoder; True when that completes the GOP's wanted frames."""
        if index in self.unsent:
            self.unsent.remove(index)
            self.skipping = not self._needed()
            return self.skipping
        return False

    def _needed(self) -> bool:
        while self._smallest < len(self._order) and self._order[self._smallest] not in self.unsent:
            self._smallest += 1
        return self._smallest < len(self._order) and self._order[self._smallest] < self.gop_end


def decode_frames(
    path: str | Path,
    indices: np.ndarray | None = None,
    config: DecodeConfig = DecodeConfig(),
    info: VideoInfo | None = None,
    on_frame: Callable[[int], None] | None = None,
) -> FrameBatch:
    """Decode the frames at ``indices`` (presentation order) in one sequential pass over the file.

    Decoding starts at the keyframe before the first wanted frame (a timed stream's; an untimed
    one is read from its start) and stops after the last. Damaged packets are skipped; frames the decoder
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
    sink = FrameSink(path, info, indices, config, on_frame)
    gop = int(info.gop_index_of(sink.wanted[:1])[0])
    first = int(info.keyframe_indices[gop]) if info.timed and gop >= 0 else 0
    decode_span(sink, first, int(sink.wanted[-1]), config.threads)
    return sink.batch("sequential")

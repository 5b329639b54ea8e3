"""Decoded frames judged by a motion rule, and the signals a sampled frame carries.

Shared by the live source (watch) and the file decoders (ask), so a frame sampled from the same
GOP gets the same signals whichever path decoded it: both feed every decoded frame of the GOP,
in presentation order, through one `BlockMotion`, and a sampled frame carries what its GOP's
frames since the previous sample showed (CodecSight section 3.3).
"""

from __future__ import annotations

from typing import Any

import av
import numpy as np

from vidsight.ingest.colour import sdr_luma
from vidsight.ingest.dynamic import BlockMotion, MotionPruneConfig, Verdict
from vidsight.ingest.motion import BLOCK, destination_blocks, grid_shape, intra_blocks, motion_map
from vidsight.ingest.pixel_motion import Between, PixelMotion, frame_step, vector_side
from vidsight.ingest.probe import INTRA_ONLY_GOP

# (motion, intra, dynamic): block maps, each None when absent; dynamic is the rule's `Verdict` until a sample takes it.
Signals = tuple
NO_SIGNALS: Signals = (None, None, None)
_FRAME_TYPES = {1: "I", 2: "P", 3: "B"}
# Frames whose motion is estimated from pixels at once (`estimate_vectors`, on every
# `frame_step`-th of them): numpy's per-call overhead is most of one frame's estimate; a frame's
# signals come out at most this many frames after it is decoded (so a saturated GOP's rule stops
# up to this many frames later).
PIXEL_BATCH = 8
# Codecs whose FFmpeg decoder honours export_mvs (MPEG-4 part 2 and MPEG-1/2 in 16x16 and 8x8 blocks).
MOTION_VECTOR_CODECS = frozenset({"h264", "mpeg4", "mpeg2video", "mpeg1video"})
# Those whose vectors ``auto`` judges by. MPEG-4 and MPEG-2 vectors missed 0.5-1.4 % of a crossing
# object's merge groups on `bench motion`'s static scenes where their pixels missed none, at the
# same kept share (docs/benchmarks.md), and their B-frames mostly carry zero (direct-mode) vectors,
# which break the persistent rule's run of moving frames: ``auto`` reads their pixels.
AUTO_VECTOR_CODECS = frozenset({"h264"})


def motion_source(motion: MotionPruneConfig | None, codec: str, intra_only: bool = False) -> str | None:
    """Where a ``codec`` stream's motion comes from under ``motion``: ``"codec"`` (exported
    vectors), ``"pixels"`` (estimated, `pixel_motion`), or None (not judged: no rule, the codec's
    vectors asked for where it exports none, or ``auto`` on an ``intra_only`` stream, whose frames
    only ``pixels`` judges, in groups: `frame_kind`)."""
    if motion is None:
        return None
    if motion.source == "pixels":
        return "pixels"
    if motion.source == "auto" and not intra_only and codec not in AUTO_VECTOR_CODECS:
        return "pixels"
    return "codec" if codec in MOTION_VECTOR_CODECS else None


def frame_type(frame: av.VideoFrame) -> str:
    """``"I"``, ``"P"``, ``"B"`` or ``"?"``."""
    return _FRAME_TYPES.get(int(frame.pict_type), "?")


def frame_kind(frame: av.VideoFrame, index: int, in_groups: bool) -> str:
    """The type the motion rule and its signals read for ``frame``, the ``index``-th (presentation
    order) of its stream: `frame_type`, but where an intra-only stream is read ``in_groups``
    (`grouped`: judged by its pixels, `INTRA_ONLY_GOP`) an I-frame only at the start of each
    group, a P-frame elsewhere. Otherwise every frame of such a stream is an I-frame, kept whole."""
    if in_groups:
        return "P" if index % INTRA_ONLY_GOP else "I"
    return frame_type(frame)


def grouped(intra_only: bool, source: str | None) -> bool:
    """Whether a stream's frames are read in groups (`frame_kind`): an intra-only one judged by pixels."""
    return intra_only and source == "pixels"


def frame_vectors(frame: av.VideoFrame) -> np.ndarray | None:
    """The frame's exported motion vectors (``export_mvs``), or None when it has none."""
    side = frame.side_data.get("MOTION_VECTORS")
    return side.to_ndarray() if side is not None else None


class FrameJudge:
    """Runs one decoder's frames, in presentation order, through a motion rule.

    A frame may be judged after later frames are pushed: with residuals a B-frame waits for the
    next reference frame (its future reference: out of the decoder later, though decoded
    earlier), and estimated motion is worked out for `PIXEL_BATCH` frames at once. Frames come
    back in the order they went in; `finish` judges those still held.

    Args:
        motion: The rule.
        source: Where motion comes from (`motion_source`): ``codec`` or ``pixels``.
        fps: The stream's frame rate, which sets how far apart the pictures motion is estimated
            from lie (`frame_step`; 0 when unknown: every frame).
    """

    def __init__(self, motion: MotionPruneConfig, source: str, fps: float):
        self._motion = motion
        self._rule: BlockMotion | None = None  # made for the first frame's grid
        self._residuals = motion.residuals
        self._intra = motion.reads_intra
        # Estimated vectors cover only the blocks that moved: no block of theirs is intra-coded.
        # The residual term is every frame's own: with it, motion is estimated on every frame too.
        self._pixels = PixelMotion(1 if self._residuals else frame_step(fps)) if source == "pixels" else None
        self._batch = PIXEL_BATCH if self._pixels is not None and not self._residuals else 1
        self._held: list[tuple[av.VideoFrame, str, Any, np.ndarray | None]] = []

    @property
    def waiting(self) -> bool:
        """Whether a frame waits for a later one to be decoded (a B-frame for its future reference)."""
        return self._residuals and bool(self._held)

    def push(self, frame: av.VideoFrame, kind: str, item: Any, saturated: bool = False) -> list[tuple[Any, Signals]]:
        """Judge ``frame`` (of type ``kind``); ``(item, signals)`` of every frame judged now, in order.

        ``saturated`` (`SampleSignals.saturated`): every block moved since the GOP's first sample,
        so the masks of its later samples are whole whatever the rule says; until the next I-frame
        the rule is not run (it costs several times the decoding) and frames report every block dynamic.
        """
        # A held I-frame starts a GOP the caller's ``saturated`` (of the GOP before) knows nothing of.
        if saturated and kind != "I" and not self.waiting and all(held[1] != "I" for held in self._held):
            blocks = grid_shape(frame.height, frame.width)
            return [*self._release(None), (item, (None, None, Verdict(np.ones(blocks, dtype=bool), 1, blocks, 0)))]
        luma = sdr_luma(frame) if self._residuals else None
        if self._pixels is not None:
            self._pixels.add(frame, kind)
        self._held.append((frame, kind, item, luma))
        if luma is not None:   # a reference frame releases the B-frames before it, and itself
            return [] if kind == "B" else self._release(luma)
        return self._release(None) if len(self._held) >= self._batch else []

    def finish(self) -> list[tuple[Any, Signals]]:
        """The frames still held, judged (B-frames without a future reference: the stream ended first)."""
        return self._release(None)

    def _release(self, future: np.ndarray | None) -> list[tuple[Any, Signals]]:
        held, self._held = self._held, []
        estimates = self._pixels.take() if self._pixels is not None else [None] * len(held)
        return [(item, self._signals(frame, kind, luma, future if kind == "B" else None, estimate))
                for (frame, kind, item, luma), estimate in zip(held, estimates)]

    def _grid(self, width: int) -> int:
        """The side of the squares the rule judges: estimated vectors' own (judged on the 4x4 grid
        they would repeat each value up to 64 times, the most of the judging's cost), unless
        residuals, which are 4x4 blocks', are weighed in."""
        return vector_side(width) if self._pixels is not None and not self._residuals else BLOCK

    def _signals(self, frame: av.VideoFrame, kind: str, luma, future, estimate) -> Signals:
        """The frame's signals; estimated vectors (``estimate``, `PixelMotion.take`'s) are the
        rule's own input, not the codec's, so only its verdict is reported for them
        (`CodecInfo.motion` and ``intra`` stay None)."""
        if estimate is Between:
            return NO_SIGNALS   # the next estimate carries this frame's motion
        height, width = frame.height, frame.width
        block = self._grid(width)
        cover = None
        if self._pixels is not None:
            vectors, cover = estimate or (None, None)
            if block != vector_side(width):
                cover = None   # judged on the 4x4 grid, with residuals
        else:
            vectors = frame_vectors(frame)
            if vectors is not None and not (self._residuals or self._intra):
                # Without residuals or intra blocks only moving vectors count: a still one writes the zero
                # a map holds already and steps nowhere. An encoder codes most of a camera's blocks still.
                vectors = vectors[(vectors["motion_x"] != 0) | (vectors["motion_y"] != 0)]
        if self._rule is None or self._rule.block != block:
            self._rule = BlockMotion(self._motion, block)
        rows, cols = grid_shape(height, width, block)
        if cover is None and vectors is not None and len(vectors):
            cover = destination_blocks(vectors, rows, cols, block)
        motion = motion_map(vectors, height, width, cover, block)
        intra = None
        if self._intra and kind in ("P", "B"):
            intra = (np.zeros((rows, cols), dtype=bool) if self._pixels is not None
                     else intra_blocks(vectors, height, width, cover))
        frames = self._pixels.step if self._pixels is not None else 1
        dynamic = self._rule.update(kind, vectors, motion, intra, luma, future, cover, grid_shape(height, width),
                                    frames)
        return (None, None, dynamic) if self._pixels is not None else (motion, intra, dynamic)


class SampleSignals:
    """What the frames decoded since the last sample showed: the largest motion and the union of
    block sets, starting over at each I-frame (a GOP's signals do not carry into the next)."""

    def __init__(self):
        self._signals: Signals = NO_SIGNALS
        self._keyframe = False
        self._counting = False                  # the GOP's first sample is out: its later ones count
        self._gop_dynamic: Verdict | None = None  # dynamic blocks of the GOP's samples after its first

    def add(self, kind: str, signals: Signals) -> None:
        self._signals = signals if kind == "I" else tuple(_merge(a, b) for a, b in zip(self._signals, signals))
        self._keyframe |= kind == "I"
        if kind == "I":
            self._counting, self._gop_dynamic = False, None

    def take(self) -> tuple[Signals, bool]:
        """The signals gathered, and whether an I-frame was among the frames; then start over."""
        motion, intra, dynamic = self._signals
        taken = (motion, intra, None if dynamic is None else dynamic.blocks()), self._keyframe
        if self._keyframe:
            self._counting = True  # the GOP's first sample: kept whole, its own signals do not count
        elif self._counting:
            self._gop_dynamic = _merge(self._gop_dynamic, self._signals[2])
        self._signals, self._keyframe = NO_SIGNALS, False
        return taken

    @property
    def saturated(self) -> bool:
        """Whether every block was dynamic since the GOP's first sample: its later samples' masks
        (`MotionMasker`: the union since that sample) are then whole whatever later frames show."""
        if not self._counting:
            return False
        union = _merge(self._gop_dynamic, self._signals[2])
        return union is not None and bool(union.all())


def _merge(before: np.ndarray | Verdict | None, now: np.ndarray | Verdict | None) -> np.ndarray | Verdict | None:
    if before is None or now is None:
        return now if before is None else before
    return np.maximum(before, now) if isinstance(before, np.ndarray) and before.dtype != bool else before | now

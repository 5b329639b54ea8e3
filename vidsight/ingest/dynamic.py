"""Which 4x4 blocks of each decoded frame are dynamic: CodecSight's motion rule (section 3.3) and
a variant that survives sensor noise.

CodecSight marks a block dynamic when ``M = V + alpha * R > tau`` (eqs. 1-4: V the motion-vector
magnitude in pixels, R the residual's SAD), and the dynamic set grows through the GOP. On a real
camera's noisy picture the encoder spends quarter-pixel vectors on the noise: few per frame, but
a GOP's union of a few hundred frames marks every token. Noise vectors are independent from one
frame to the next and small; real motion persists and is larger. So the default rule asks a
block to move in three consecutive frames (in the frames before, where its vector says it came
from, so an object's leading edge counts), above a threshold raised to the noise floor the GOP
itself shows (the magnitude most transient vectors stay under, once transients are common
enough to be noise rather than an object's leading edge). A moving camera is not noise: where the
median block moves past tau, every block moves with the camera (a pan keeps everything, as it must).
"""

from __future__ import annotations

import bisect
import dataclasses
import math

import numpy as np

from vidsight.errors import ConfigError
from vidsight.ingest.motion import BLOCK, Cover, clamp, destination_blocks, partition_blocks
from vidsight.ingest.residual import residual_map

RULES = ("persistent", "paper", "max")
# Where motion comes from: the codec's exported vectors, vectors estimated from decoded pixels
# (`pixel_motion`), or the codec's where the decoder exports them and pixels elsewhere.
SOURCES = ("auto", "codec", "pixels")
# alpha for software decoders: a 4x4 block whose pixels differ from their prediction by four 8-bit
# levels on average (a SAD of 64, beyond what a CRF-23 encode leaves of sensor noise of sigma 5)
# weighs as much as a quarter-pixel motion, CodecSight's tau.
SOFTWARE_ALPHA = 0.25 / 64
# The noise floor: transient moving blocks (moving now, not in the frame before) on more than this
# share of a frame are noise; the floor is the magnitude this quantile of them stays under.
NOISE_SHARE = 0.01
NOISE_QUANTILE = 0.95
# A large residual counts only inside a cluster of them: at least this many of the 3x3 blocks around
# it (a recoloured or appearing object changes a region at once; noise outliers stand alone).
RESIDUAL_CLUSTER = 7


@dataclasses.dataclass(frozen=True)
class MotionPruneConfig:
    """Motion-guided pruning settings; one object configures both the source and the pruner.

    Attributes:
        tau: Motion threshold in pixels (CodecSight's 0.25 px).
        alpha: Weight of the residual term per SAD level (CodecSight's default 0, its hardware
            decoders export no residuals; `SOFTWARE_ALPHA` weighs a one-level change like tau).
            Above 0 the source recomputes residuals from decoded pixels.
        rule: ``persistent`` (default): motion above ``max(tau, the GOP's noise floor)`` in
            ``persist_frames`` consecutive frames, or ``alpha`` times the residual above that in a cluster of blocks;
            ``paper``: eqs. 3-4 as written, ``V + alpha * R > tau`` on each block; ``max``: the
            first rule vidsight shipped, any vector above tau or any intra-coded block.
        persist_frames: For ``persistent``: consecutive frames a block's motion must last (judged
            frames: for motion estimated from pixels, estimates about 1/15 s apart). Noise
            vectors seldom last two frames, but H.264 codes each for a whole macroblock, and on a
            coarse token grid one such macroblock in a GOP keeps a token: three frames keep a
            static noisy camera's tokens static there too (a moving object's blocks move for
            many frames in a row).
        dilate_blocks: For ``persistent`` and ``max``: also mark this many blocks around each
            dynamic one (an object's edge that clips a block moves it less than its vector says).
        source: ``auto`` (default): the codec's motion vectors where FFmpeg exports them (H.264),
            vectors estimated from the decoded pixels elsewhere (HEVC, AV1, VP9 ...), but not on an
            intra-only codec (MJPEG, ProRes: `probe.INTRA_ONLY_GOP`), kept whole; ``codec``: the
            codec's only (no pruning where it exports none); ``pixels``: pixels everywhere.
    """

    tau: float = 0.25
    alpha: float = 0.0
    rule: str = "persistent"
    persist_frames: int = 3
    dilate_blocks: int = 1
    source: str = "auto"

    def __post_init__(self):
        for name in ("tau", "alpha", "dilate_blocks"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be non-negative, got {getattr(self, name)}")
        if self.persist_frames < 1:
            raise ConfigError(f"persist_frames must be at least 1, got {self.persist_frames}")
        if self.rule not in RULES:
            raise ConfigError(f"unknown motion rule {self.rule!r}; choose one of {', '.join(RULES)}")
        if self.source not in SOURCES:
            raise ConfigError(f"unknown motion source {self.source!r}; choose one of {', '.join(SOURCES)}")

    @property
    def reads_intra(self) -> bool:
        """Whether the rule reads each frame's intra-coded blocks (only the first rule does)."""
        return self.rule == "max"

    @property
    def residuals(self) -> bool:
        """Whether the rule needs each frame's residual (and so its pixels and references)."""
        return self.alpha > 0 and self.rule != "max"


class BlockMotion:
    """The dynamic blocks of each decoded frame of one stream, fed in presentation order.

    State (the previous frame's motion, the GOP's noise floor, the past reference) starts over at
    every I-frame, so an interval that starts at a keyframe is judged as in the whole stream.
    Vectors are judged on a grid of ``block``-pixel squares (4, H.264's smallest partition; the
    coarser squares of estimated vectors), and the verdict comes out on the frame's 4x4 grid.
    """

    def __init__(self, config: MotionPruneConfig, block: int = BLOCK):
        if block % BLOCK:
            raise ConfigError(f"the rule's squares must be a multiple of {BLOCK} pixels wide, not {block}")
        if block != BLOCK and config.residuals:
            raise ConfigError("residuals are 4x4 blocks': a rule that weighs them judges the 4x4 grid")
        self.config = config
        self.block = block
        self._previous: np.ndarray | None = None   # last frame's motion magnitude per block
        self._streak: np.ndarray | None = None     # frames in a row each block moved above the threshold
        self._floors: list[float] = []              # this GOP's per-frame noise floors, in order
        self._reference: np.ndarray | None = None  # luma of the last I- or P-frame

    def update(self, kind: str, vectors: np.ndarray | None, motion: np.ndarray, intra: np.ndarray | None,
               luma: np.ndarray | None = None, future: np.ndarray | None = None, cover: Cover | None = None,
               fine_shape: tuple[int, int] | None = None, frames: int = 1) -> Verdict | None:
        """This frame's dynamic blocks (`Verdict.blocks`: ``(ceil(H/4), ceil(W/4))`` bool); None for
        an I-frame (kept whole).

        Args:
            kind: The frame's type.
            vectors: Its motion vectors, as exported.
            motion: Their `motion_map`; intra: their `intra_blocks` (None for an I-frame), both on
                the rule's grid, computed once by the caller, which reports them too.
            luma: The frame's luma, needed when `MotionPruneConfig.residuals`.
            future: The next reference frame's luma (B-frames), likewise.
            cover: The vectors' `destination_blocks`, when the caller has them already.
            fine_shape: The frame's 4x4 grid (`grid_shape`), for a rule on a coarser grid.
            frames: The frames the vectors' motion spans (estimated motion's `frame_step`): the
                rule weighs motion per frame. A run of moving frames counts judged frames: noise
                is as likely to stand out between pictures two frames apart as one apart.
        """
        config = self.config
        past = self._reference
        if kind != "B" and luma is not None:
            self._reference = luma
        if kind == "I":
            self._previous, self._streak, self._floors = None, None, []
            return None
        magnitude = motion.max(axis=0)
        if frames != 1:
            magnitude /= frames
        residual = None
        if config.residuals:
            if luma is None:
                raise ConfigError("the residual term needs each frame's luma")
            # A stream joined after its I-frame has no reference yet: its first frames go without.
            residual = residual_map(luma, vectors, past, future) if past is not None else None
        factor, fine_shape = self.block // BLOCK, fine_shape or magnitude.shape
        if config.rule == "paper":
            energy = config.alpha * residual if residual is not None else 0.0
            return Verdict(magnitude + energy > config.tau, factor, fine_shape, 0)
        if config.rule == "max":
            dynamic = (magnitude > config.tau) | intra
        else:
            dynamic = self._persistent(magnitude, residual, vectors, cover, frames)
        # Widened on the 4x4 grid: the slack is for an edge that clips a block, whatever the grid.
        return Verdict(dynamic, factor, fine_shape, config.dilate_blocks)

    def _persistent(self, magnitude: np.ndarray, residual: np.ndarray | None, vectors: np.ndarray | None,
                    cover: Cover | None, frames: int) -> np.ndarray:
        tau = self.config.tau
        # A moving camera moves every block, and its vectors' unevenness (a flat block coded still,
        # an edge's larger vector) is not noise: it neither raises the floor nor breaks a streak.
        camera = _camera_motion(vectors, magnitude.size, self.block) / frames   # per frame, as magnitude is
        if camera > tau:
            magnitude = np.maximum(magnitude, camera)
        previous, self._previous = self._previous, magnitude
        before = None
        if previous is not None:
            came_from = _sources(vectors, cover, previous.shape, self.block)
            before = _at_source(previous, came_from)
            transient = (magnitude > tau) & (before <= tau)
            noisy = camera <= tau and np.count_nonzero(transient) > NOISE_SHARE * transient.size
            bisect.insort(self._floors, _quantile(magnitude[transient], NOISE_QUANTILE) if noisy else 0.0)
        threshold = max(tau, _sorted_median(self._floors)) if self._floors else tau
        # A block's streak continues the one of the block its vector comes from (an object's
        # leading edge moves into blocks that were still); the first frame after an I-frame starts them.
        moving = magnitude > threshold
        persist = self.config.persist_frames
        if before is None:
            self._streak = moving.astype(np.min_scalar_type(persist))
        else:
            # Counted up to `persist` only (all the verdict reads), in the smallest integers that
            # hold it: on H.264's 4x4 grid these are some of the frame's largest arrays.
            streak = _at_source(self._streak, came_from)   # a copy
            streak += streak < persist
            streak *= moving
            self._streak = streak
        dynamic = self._streak >= persist
        if residual is not None:
            large = self.config.alpha * (residual - float(np.median(residual))) > threshold
            dynamic |= large & (_neighbours(large) >= RESIDUAL_CLUSTER)
        return dynamic


def _camera_motion(vectors: np.ndarray | None, blocks: int, block: int) -> float:
    """How far the camera moved this frame, in pixels: per axis, the median over the frame's
    ``blocks`` squares of ``block`` pixels of their past-reference vectors' motion (a block without
    one counts as still, so a still camera, whose encoder codes most blocks still, gives 0 without
    counting anything). Worked out per vector, weighted by the blocks it covers (H.264 has a few
    thousand vectors a frame and up to 57,600 blocks)."""
    if vectors is None or len(vectors) == 0:
        return 0.0
    high, wide = partition_blocks(vectors, block)
    covered = high * wide
    if 2 * covered.sum() <= blocks:
        return 0.0
    weights = covered * (vectors["source"] < 0)
    still = max(blocks - int(weights.sum()), 0)   # the blocks at 0
    if 2 * still >= blocks:
        return 0.0
    scale = np.maximum(vectors["motion_scale"], 1).astype(np.int64)
    # Motion in 1/common pixels is a whole number; a codec exports one scale (np.lcm.reduce took 0.45 ms).
    common = int(scale[0]) if (scale == scale[0]).all() else math.lcm(*np.unique(scale).tolist())
    medians = []
    for motion in (vectors["motion_x"], vectors["motion_y"]):
        # The weighted median by counting the blocks at each motion (sorting a few thousand vectors cost more).
        units = motion * (common // scale)
        low = min(int(units.min()), 0)
        counts = np.bincount(units - low, weights=weights, minlength=1 - low)
        counts[-low] += still
        medians.append((int(np.searchsorted(np.cumsum(counts), blocks // 2, side="right")) + low) / common)
    return float(np.hypot(*medians))


def _sources(vectors: np.ndarray | None, cover: Cover | None, shape: tuple[int, int], block: int
             ) -> tuple[np.ndarray, np.ndarray] | None:
    """``(blocks, source blocks)``, flat indices into a ``shape`` map, of the blocks a past-reference
    vector brings from another block (most blocks of a frame come from where they are); None when
    no vector does. Worked out per vector, then for the blocks of those that step (not on
    whole-frame maps)."""
    if vectors is None or len(vectors) == 0:
        return None
    rows, cols = shape
    # The pixels each vector's source lies away, as `displacement` gives them, in blocks.
    scale = np.maximum(vectors["motion_scale"], 1).astype(np.float32)
    step_r = np.rint((vectors["motion_y"] / scale).astype(np.float32) / block).astype(np.int64)
    step_c = np.rint((vectors["motion_x"] / scale).astype(np.float32) / block).astype(np.int64)
    steps = (vectors["source"] < 0) & ((step_r != 0) | (step_c != 0))
    if not steps.any():
        return None
    which, r, c = cover if cover is not None else destination_blocks(vectors, rows, cols, block)
    chosen = steps[which]
    which, r, c = which[chosen], r[chosen], c[chosen]
    return r * cols + c, clamp(r + step_r[which], rows - 1) * cols + clamp(c + step_c[which], cols - 1)


def _at_source(previous: np.ndarray, came_from) -> np.ndarray:
    """Per block, the larger of ``previous`` (last frame's per-block map) at the block itself and at
    the block its past-reference vector comes from (`_sources`)."""
    if came_from is None:
        return previous
    blocks, sources = came_from
    out = previous.copy()
    flat, before = out.reshape(-1), previous.reshape(-1)   # flat indices: half the cost of (row, column) pairs
    flat[blocks] = np.maximum(before[blocks], before[sources])
    return out


def _neighbours(blocks: np.ndarray) -> np.ndarray:
    """Per block, how many of the 3x3 blocks centred on it are set."""
    padded = np.pad(blocks.astype(np.int16), 1)
    rows, cols = blocks.shape
    return sum(padded[dy : dy + rows, dx : dx + cols] for dy in range(3) for dx in range(3))


def _sorted_median(ordered: list[float]) -> float:
    """The median of an ordered list (``np.median``'s value)."""
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _quantile(values: np.ndarray, q: float) -> float:
    """``np.quantile(values, q)`` (its default, linear method), without its overhead: a frame's
    judging is a few dozen small-array steps, and np.quantile's own cost was a tenth of them."""
    position = q * (values.size - 1)
    low = int(position)
    high = min(low + 1, values.size - 1)
    ordered = np.partition(values, (low, high))
    a, b, t = ordered[low], ordered[high], position - low
    return float(b - (b - a) * (1 - t)) if t >= 0.5 else float(a + (b - a) * t)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A frame's dynamic blocks as the rule found them: squares of its grid (``factor`` 4x4 blocks
    wide), to be widened by ``dilate`` 4x4 blocks on the frame's 4x4 grid of ``fine_shape``.

    The widening and the move to the 4x4 grid cost more than the rule on estimated vectors'
    coarse squares, and a union of widened maps is the widened union: frames' verdicts are
    joined here (`|`) and put on the 4x4 grid (`blocks`) once per sample, not once per frame.
    """

    squares: np.ndarray   # (rows, cols) bool on the rule's grid
    factor: int
    fine_shape: tuple[int, int]
    dilate: int

    def __or__(self, other: Verdict) -> Verdict:
        if (self.factor, self.fine_shape, self.dilate) == (other.factor, other.fine_shape, other.dilate):
            return dataclasses.replace(self, squares=self.squares | other.squares)
        return Verdict(self.blocks() | other.blocks(), 1, self.fine_shape, 0)

    def blocks(self) -> np.ndarray:
        """``fine_shape`` bool: the dynamic 4x4 blocks."""
        return _on_fine_grid(self.squares, self.factor, self.fine_shape, self.dilate)

    def all(self) -> bool:
        """Whether every 4x4 block is dynamic (`blocks().all()`, mostly without making them)."""
        if self.squares.all():
            return True
        # A still square keeps a still 4x4 block when the widening cannot cross it: it is over
        # twice the widening across, and the squares clipped at the frame's far edges over once.
        rows, cols = self.fine_shape
        reach = self.dilate
        if self.factor > 2 * reach and min((rows - 1) % self.factor, (cols - 1) % self.factor) >= reach:
            return False
        return bool(self.blocks().all())


def _on_fine_grid(blocks: np.ndarray, factor: int, fine_shape: tuple[int, int], by: int) -> np.ndarray:
    """``blocks`` (a grid of squares ``factor`` 4x4 blocks wide) on the frame's 4x4 grid of
    ``fine_shape``, dilated by ``by`` 4x4 blocks in every direction. A square neighbourhood is a
    dilation along the columns, then along the rows; the columns are done before the rows are
    repeated, on a grid ``factor`` times smaller (strided column steps are the slow ones)."""
    rows, cols = fine_shape
    out = _dilate(np.repeat(blocks, factor, axis=1)[:, :cols] if factor > 1 else blocks, by, axis=1)
    return _dilate(np.repeat(out, factor, axis=0)[:rows] if factor > 1 else out, by, axis=0)


def _dilate(blocks: np.ndarray, by: int, axis: int) -> np.ndarray:
    if by == 0:
        return blocks
    out = blocks.copy()
    for step in range(1, by + 1):
        later, earlier = [slice(None)] * 2, [slice(None)] * 2
        later[axis], earlier[axis] = slice(step, None), slice(None, -step)
        out[tuple(later)] |= blocks[tuple(earlier)]
        out[tuple(earlier)] |= blocks[tuple(later)]
    return out

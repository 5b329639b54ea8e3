"""Motion estimated from decoded pixels, for codecs whose FFmpeg decoder exports no vectors.

HEVC, AV1 and VP9 decoders export no ``MOTION_VECTORS`` side data, so the motion rule has
nothing to judge there. This estimates what an encoder's motion search would have found, cheaply
enough to run on every decoded frame: the luma reduced ``SCALE`` times per side by FFmpeg's
scaler, then per 4x4 block of the reduced picture (a 16x16 block of the frame) the change against
the previous frame. A block whose change stands out from the frame's own (the median block's,
which on a static camera is sensor noise and coding noise) gets a vector from Lucas-Kanade's
least-squares flow over the block; every other block is still, as a codec's skipped block is.
The vectors come out as FFmpeg's ``AVMotionVector`` records, so the same rules (`BlockMotion`:
``persistent``, ``paper``, ``max``) and noise floor judge them as they judge H.264's.
"""

from __future__ import annotations

import av
import numpy as np

SCALE = 4            # the luma is reduced this many times per side before estimating
BLOCK = 4            # block side in reduced pixels: a vector covers SCALE * BLOCK frame pixels
# A reduced pixel sums these four of its SCALE x SCALE frame pixels (one per row and column):
# noise halves, at a quarter of the cost of averaging all sixteen.
SAMPLES = ((0, 0), (1, 2), (2, 1), (3, 3))
# A block moved when its SAD against the previous frame is above CHANGE_FACTOR times the median
# block's and above MIN_CHANGE_LEVELS per frame pixel (the median is near 0 where an encoder
# skips still blocks, and coding noise then stands out alone). Chosen on `bench motion`'s static
# scenes (seed 1); the tests check scenes of another seed.
CHANGE_FACTOR = 3.0
MIN_CHANGE_LEVELS = 1.5
QUARTER_PEL = 4      # vectors in quarter pixels, as H.264's
# A changed block with too little texture for a flow (a flat region an edge entered) moves one
# reduced pixel.
FLAT_DETERMINANT = 1e-3
_EIGHT_BIT_LUMA = frozenset({"yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "yuv444p", "yuvj444p", "nv12", "gray"})

# FFmpeg's AVMotionVector, as PyAV's MotionVectors.to_ndarray() gives it.
VECTOR_DTYPE = np.dtype({"names": ["source", "w", "h", "src_x", "src_y", "dst_x", "dst_y", "flags", "motion_x",
                                   "motion_y", "motion_scale"],
                         "formats": ["<i4", "u1", "u1", "<i2", "<i2", "<i2", "<i2", "<u8", "<i4", "<i4", "<u2"],
                         "offsets": [0, 4, 5, 6, 8, 10, 12, 16, 24, 28, 32], "itemsize": 40, "aligned": True})


def reduced_luma(frame: av.VideoFrame) -> np.ndarray:
    """``(H // SCALE, W // SCALE)`` int16: per reduced pixel, the sum of its `SAMPLES` of the luma."""
    if frame.format.name in _EIGHT_BIT_LUMA:
        plane = frame.planes[0]   # read in place: no conversion
        luma = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[: frame.height, : frame.width]
    else:                         # deeper or packed formats: FFmpeg's conversion
        luma = frame.to_ndarray(format="gray")
    rows, cols = luma.shape[0] // SCALE, luma.shape[1] // SCALE
    luma = luma[: rows * SCALE, : cols * SCALE]
    (first_r, first_c), *others = SAMPLES
    out = luma[first_r::SCALE, first_c::SCALE].astype(np.int16)
    for dy, dx in others:
        out += luma[dy::SCALE, dx::SCALE]
    return out


def estimate_vectors(current: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Vectors of the blocks of ``current`` (`reduced_luma`) that moved since ``previous``.

    Returns:
        An ``AVMotionVector`` array in the full frame's pixels (``source`` -1: from the past,
        ``motion`` pointing from the block to where its content was), one record per moving block.
    """
    rows, cols = current.shape[0] // BLOCK, current.shape[1] // BLOCK
    if rows == 0 or cols == 0:
        return np.zeros(0, VECTOR_DTYPE)
    now, before = current[: rows * BLOCK, : cols * BLOCK], previous[: rows * BLOCK, : cols * BLOCK]
    sad = _block_sum(np.abs(now - before), rows, cols)
    threshold = max(CHANGE_FACTOR * float(np.median(sad)), MIN_CHANGE_LEVELS * BLOCK * BLOCK * len(SAMPLES))
    moved_r, moved_c = np.nonzero(sad > threshold)
    if len(moved_r) == 0:
        return np.zeros(0, VECTOR_DTYPE)
    u, v = _flow(now, before, moved_r, moved_c)
    vectors = np.zeros(len(moved_r), VECTOR_DTYPE)
    side = SCALE * BLOCK
    vectors["source"] = -1
    vectors["w"] = vectors["h"] = side
    vectors["dst_x"], vectors["dst_y"] = moved_c * side + side // 2, moved_r * side + side // 2
    # FFmpeg's convention: src = dst + motion / scale, so motion points back along the flow.
    motion_x = np.rint(-u * SCALE * QUARTER_PEL).astype(np.int32)
    motion_y = np.rint(-v * SCALE * QUARTER_PEL).astype(np.int32)
    vectors["motion_x"], vectors["motion_y"], vectors["motion_scale"] = motion_x, motion_y, QUARTER_PEL
    vectors["src_x"] = vectors["dst_x"] + motion_x // QUARTER_PEL
    vectors["src_y"] = vectors["dst_y"] + motion_y // QUARTER_PEL
    return vectors


def _flow(now: np.ndarray, before: np.ndarray, block_r: np.ndarray, block_c: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Lucas-Kanade's flow ``(u, v)`` in reduced pixels over each chosen block: brightness
    constancy ``Ix u + Iy v + It = 0`` in the least-squares sense, gradients of the mean picture
    (central differences, the block's neighbours included)."""
    mean = np.pad((now + before).astype(np.float32) / 2, 1, mode="edge")
    # (blocks, BLOCK + 2, BLOCK + 2) windows of the padded picture: each block and a pixel around it
    span = np.arange(BLOCK + 2)
    window_r = (block_r * BLOCK)[:, None, None] + span[None, :, None]
    window_c = (block_c * BLOCK)[:, None, None] + span[None, None, :]
    window = mean[window_r, window_c]
    grad_x = (window[:, 1:-1, 2:] - window[:, 1:-1, :-2]) / 2
    grad_y = (window[:, 2:, 1:-1] - window[:, :-2, 1:-1]) / 2
    inner_r, inner_c = window_r[:, 1:-1] - 1, window_c[:, :, 1:-1] - 1
    change = (now[inner_r, inner_c] - before[inner_r, inner_c]).astype(np.float32)
    xx, xy, yy = (grad_x * grad_x).sum((1, 2)), (grad_x * grad_y).sum((1, 2)), (grad_y * grad_y).sum((1, 2))
    xt, yt = (grad_x * change).sum((1, 2)), (grad_y * change).sum((1, 2))
    determinant = xx * yy - xy * xy
    textured = determinant > FLAT_DETERMINANT * (xx + yy) ** 2 + 1e-6
    safe = np.where(textured, determinant, 1.0)
    u = np.where(textured, -(yy * xt - xy * yt) / safe, 1.0)
    v = np.where(textured, -(xx * yt - xy * xt) / safe, 0.0)
    return u, v


def _block_sum(values: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return values.reshape(rows * BLOCK, cols, BLOCK).sum(-1).reshape(rows, BLOCK, cols).sum(1)


class PixelMotion:
    """Vectors of each frame of one stream from its pixels, frames fed in presentation order."""

    def __init__(self):
        self._previous: np.ndarray | None = None

    def vectors(self, frame: av.VideoFrame, kind: str) -> np.ndarray | None:
        """The estimated vectors of ``frame`` (of type ``kind``); None for an I-frame, as a codec
        gives none (so a decoder that starts at a keyframe sees what one that ran into it sees),
        and for a stream's first frame."""
        current = reduced_luma(frame)
        previous, self._previous = self._previous, current
        if kind == "I" or previous is None or previous.shape != current.shape:
            return None
        return estimate_vectors(current, previous)

"""Codec residuals recomputed from decoded pixels (CodecSight eq. 2), which FFmpeg does not export.

A block's residual is the sum of absolute differences between its luma and its motion-compensated
prediction: the reference frame sampled where the block's motion vector points (bilinear at
sub-pixel offsets), the mean of both predictions for a bi-predicted block, and the co-located
reference block for a block no vector predicts (intra-coded). It is what the decoder added to
the prediction, up to H.264's six-tap sub-pixel filter, its deblocking, and which of several
reference frames a vector used: the nearest reference in each direction stands for all of them.
"""

from __future__ import annotations

import numpy as np

from vidsight.ingest.motion import BLOCK, displacement


def residual_map(luma: np.ndarray, vectors: np.ndarray | None, past: np.ndarray,
                 future: np.ndarray | None = None) -> np.ndarray:
    """``(ceil(H/4), ceil(W/4))`` float32: each 4x4 block's SAD against its prediction, in 8-bit levels.

    Args:
        luma: The frame's ``(H, W)`` uint8 luma.
        vectors: Its FFmpeg ``AVMotionVector`` records (``None`` or empty: every block intra).
        past: Luma of the nearest earlier reference frame.
        future: Luma of the nearest later reference frame (B-frames), if known.
    """
    height, width = luma.shape
    rows, cols = -(-height // BLOCK), -(-width // BLOCK)
    total = np.zeros((rows * BLOCK, cols * BLOCK), dtype=np.float32)
    weight = np.zeros_like(total)
    for direction, reference in ((0, past), (1, future)):
        if reference is None or vectors is None or len(vectors) == 0:
            continue
        chosen = vectors[(vectors["source"] > 0) == bool(direction)]
        if len(chosen) == 0:
            continue
        dx, dy, covered = displacement(chosen, rows, cols)
        covered = _pixels(covered.astype(np.float32))
        total += _predict(reference, _pixels(dx), _pixels(dy)) * covered
        weight += covered
    colocated = _pad(past.astype(np.float32), rows, cols)
    prediction = np.where(weight > 0, total / np.maximum(weight, 1), colocated)
    difference = np.abs(_pad(luma.astype(np.float32), rows, cols) - prediction)
    difference[height:], difference[:, width:] = 0, 0
    return difference.reshape(rows, BLOCK, cols, BLOCK).sum(axis=(1, 3))


def _pixels(blocks: np.ndarray) -> np.ndarray:
    return np.repeat(np.repeat(blocks, BLOCK, axis=0), BLOCK, axis=1)


def _pad(image: np.ndarray, rows: int, cols: int) -> np.ndarray:
    height, width = image.shape
    return np.pad(image, ((0, rows * BLOCK - height), (0, cols * BLOCK - width)), mode="edge")


def _predict(reference: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """``reference`` sampled bilinearly at each pixel displaced by ``(dx, dy)``, edges clamped;
    ``dx``/``dy`` cover the block-padded frame. Only displaced pixels are interpolated (a static
    scene's are nearly all zero)."""
    height, width = reference.shape
    rows, cols = dx.shape[0] // BLOCK, dx.shape[1] // BLOCK
    out = _pad(reference.astype(np.float32), rows, cols)
    y, x = np.nonzero((dx != 0) | (dy != 0))
    if len(y) == 0:
        return out
    sy = np.clip(y + dy[y, x], 0, height - 1)
    sx = np.clip(x + dx[y, x], 0, width - 1)
    y0, x0 = np.floor(sy).astype(np.int64), np.floor(sx).astype(np.int64)
    fy, fx = (sy - y0).astype(np.float32), (sx - x0).astype(np.float32)
    y1, x1 = np.minimum(y0 + 1, height - 1), np.minimum(x0 + 1, width - 1)
    ref = reference.astype(np.float32)
    out[y, x] = ((ref[y0, x0] * (1 - fx) + ref[y0, x1] * fx) * (1 - fy)
                 + (ref[y1, x0] * (1 - fx) + ref[y1, x1] * fx) * fy)
    return out

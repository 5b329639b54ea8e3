"""H.264 motion vectors (FFmpeg's export_mvs side data) as block-level maps."""

from __future__ import annotations

import numpy as np

BLOCK = 4  # H.264's smallest partition; every macroblock partition is a whole number of these.


def motion_map(vectors: np.ndarray | None, height: int, width: int) -> np.ndarray:
    """Largest motion magnitude (pixels) landing on each 4x4 block.

    Args:
        vectors: FFmpeg ``AVMotionVector`` records (PyAV's ``MotionVectors.to_ndarray()``), or
            ``None`` for a frame without vectors (an I-frame).
        height: Frame height in pixels.
        width: Frame width in pixels.

    Returns:
        ``float32`` array ``(2, ceil(height/4), ceil(width/4))``: channel 0 holds vectors that
        predict from a past frame, channel 1 those from a future frame, so both directions of a
        B-frame are kept. A vector is assigned to the blocks its destination rectangle covers.
    """
    rows, cols = -(-height // BLOCK), -(-width // BLOCK)
    out = np.zeros((2, rows, cols), dtype=np.float32)
    if vectors is None or len(vectors) == 0:
        return out
    magnitude = np.hypot(vectors["motion_x"], vectors["motion_y"]) / np.maximum(vectors["motion_scale"], 1)
    direction = (vectors["source"] > 0).astype(np.int64)
    which, r, c = destination_blocks(vectors, rows, cols)
    np.maximum.at(out, (direction[which], r, c), magnitude[which].astype(np.float32))
    return out


def intra_blocks(vectors: np.ndarray | None, height: int, width: int) -> np.ndarray:
    """``(ceil(height/4), ceil(width/4))`` bool: blocks of an inter frame that no vector predicts.

    Those were intra-coded: the encoder found nothing to copy, so their content is new.
    """
    rows, cols = -(-height // BLOCK), -(-width // BLOCK)
    covered = np.zeros((rows, cols), dtype=bool)
    if vectors is not None and len(vectors):
        _, r, c = destination_blocks(vectors, rows, cols)
        covered[r, c] = True
    return ~covered


def displacement(vectors: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per 4x4 block, where its prediction comes from: ``(dx, dy)`` float32 pixels to the source
    (FFmpeg: ``src = dst + motion / motion_scale``) and a bool map of the blocks a vector covers.
    Pass one direction's vectors; where several cover a block, the last one stands."""
    scale = np.maximum(vectors["motion_scale"], 1).astype(np.float32)
    which, r, c = destination_blocks(vectors, rows, cols)
    dx, dy = np.zeros((rows, cols), np.float32), np.zeros((rows, cols), np.float32)
    covered = np.zeros((rows, cols), dtype=bool)
    dx[r, c], dy[r, c], covered[r, c] = (vectors["motion_x"] / scale)[which], (vectors["motion_y"] / scale)[which], True
    return dx, dy, covered


def destination_blocks(vectors: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(vector index, block row, block column)`` of every block a vector's destination covers."""
    top = (vectors["dst_y"].astype(np.int64) - vectors["h"] // 2) // BLOCK
    left = (vectors["dst_x"].astype(np.int64) - vectors["w"] // 2) // BLOCK
    empty = np.empty(0, dtype=np.int64)
    which, r, c = [empty], [empty], [empty]  # a direction may have no vectors (a B-frame predicted forward only)
    # Partitions come in a handful of sizes; one vectorised pass per block offset inside them.
    for bh, bw in {(int(h), int(w)) for h, w in zip(vectors["h"], vectors["w"])}:
        sel = np.flatnonzero((vectors["h"] == bh) & (vectors["w"] == bw))
        for dy in range(max(1, bh // BLOCK)):
            for dx in range(max(1, bw // BLOCK)):
                which.append(sel)
                r.append(np.clip(top[sel] + dy, 0, rows - 1))
                c.append(np.clip(left[sel] + dx, 0, cols - 1))
    return np.concatenate(which), np.concatenate(r), np.concatenate(c)

"""H.264 motion vectors (FFmpeg's export_mvs side data) as a block-level magnitude map."""

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
    top = (vectors["dst_y"].astype(np.int64) - vectors["h"] // 2) // BLOCK
    left = (vectors["dst_x"].astype(np.int64) - vectors["w"] // 2) // BLOCK
    # Partitions come in a handful of sizes; one vectorised scatter per block offset inside them.
    for bh, bw in {(int(h), int(w)) for h, w in zip(vectors["h"], vectors["w"])}:
        sel = (vectors["h"] == bh) & (vectors["w"] == bw)
        for dy in range(max(1, bh // BLOCK)):
            for dx in range(max(1, bw // BLOCK)):
                r = np.clip(top[sel] + dy, 0, rows - 1)
                c = np.clip(left[sel] + dx, 0, cols - 1)
                np.maximum.at(out, (direction[sel], r, c), magnitude[sel].astype(np.float32))
    return out

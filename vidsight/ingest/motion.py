"""Motion vectors (FFmpeg's export_mvs side data, or `pixel_motion`'s estimates) as block-level maps.

Maps are on a grid of ``block``-pixel squares: the 4x4 blocks of H.264's smallest partition, or
the coarser squares estimated vectors come in (judging those on the 4x4 grid would repeat every
value 64 times at 1280x720).
"""

from __future__ import annotations

import numpy as np

BLOCK = 4  # H.264's smallest partition; every macroblock partition is a whole number of these.


Cover = tuple[np.ndarray, np.ndarray, np.ndarray]  # `destination_blocks`' result, computed once per frame


def grid_shape(height: int, width: int, block: int = BLOCK) -> tuple[int, int]:
    """``(rows, cols)`` of ``block``-pixel squares covering a ``height`` x ``width`` frame."""
    return -(-height // block), -(-width // block)


def motion_map(vectors: np.ndarray | None, height: int, width: int, cover: Cover | None = None,
               block: int = BLOCK) -> np.ndarray:
    """Largest motion magnitude (pixels) landing on each block of the ``block``-pixel grid.

    Args:
        vectors: FFmpeg ``AVMotionVector`` records (PyAV's ``MotionVectors.to_ndarray()``), or
            ``None`` for a frame without vectors (an I-frame).
        height: Frame height in pixels.
        width: Frame width in pixels.
        cover: The vectors' `destination_blocks`, when the caller has them already.
        block: The grid's square side in pixels (a multiple of 4).

    Returns:
        ``float32`` array ``(2, ceil(height/block), ceil(width/block))``: channel 0 holds vectors that
        predict from a past frame, channel 1 those from a future frame, so both directions of a
        B-frame are kept. A vector is assigned to the blocks its destination rectangle covers.
    """
    rows, cols = grid_shape(height, width, block)
    out = np.zeros((2, rows, cols), dtype=np.float32)
    if vectors is None or len(vectors) == 0:
        return out
    magnitude = (np.hypot(vectors["motion_x"], vectors["motion_y"]) / np.maximum(vectors["motion_scale"], 1)
                 ).astype(np.float32)
    which, r, c = cover if cover is not None else destination_blocks(vectors, rows, cols, block)
    flat = r * cols
    flat += c
    future = vectors["source"] > 0
    if future.any():   # a B-frame's vectors from a future frame, on the second plane (P-frames have none)
        flat += (future * (rows * cols))[which]
    values = magnitude[which]
    # Partitions of one direction do not overlap, so most blocks get one vector: assign them all
    # (ufunc.at on every block is the hot path's slowest step); a block covered twice (a partition
    # clipped at the frame's edge) holds its last vector's value, and only the values above that
    # one need the largest taken.
    flat_out = out.reshape(-1)
    flat_out[flat] = values
    larger = flat_out[flat] < values
    if larger.any():
        np.maximum.at(flat_out, flat[larger], values[larger])
    return out


def intra_blocks(vectors: np.ndarray | None, height: int, width: int, cover: Cover | None = None) -> np.ndarray:
    """``(ceil(height/4), ceil(width/4))`` bool: blocks of an inter frame that no vector predicts.

    Those were intra-coded: the encoder found nothing to copy, so their content is new.
    """
    rows, cols = grid_shape(height, width)
    covered = np.zeros((rows, cols), dtype=bool)
    if vectors is not None and len(vectors):
        _, r, c = cover if cover is not None else destination_blocks(vectors, rows, cols)
        covered[r, c] = True
    return ~covered


def displacement(vectors: np.ndarray, rows: int, cols: int, cover: Cover | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per 4x4 block, where its prediction comes from: ``(dx, dy)`` float32 pixels to the source
    (FFmpeg: ``src = dst + motion / motion_scale``) and a bool map of the blocks a vector covers.
    Pass one direction's vectors, or all of them with the part of their ``cover`` that names one
    direction's; where several cover a block, the last one stands."""
    scale = np.maximum(vectors["motion_scale"], 1).astype(np.float32)
    which, r, c = cover if cover is not None else destination_blocks(vectors, rows, cols)
    dx, dy = np.zeros((rows, cols), np.float32), np.zeros((rows, cols), np.float32)
    covered = np.zeros((rows, cols), dtype=bool)
    dx[r, c], dy[r, c], covered[r, c] = (vectors["motion_x"] / scale)[which], (vectors["motion_y"] / scale)[which], True
    return dx, dy, covered


def destination_blocks(vectors: np.ndarray, rows: int, cols: int, block: int = BLOCK
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(vector index, block row, block column)`` of every ``block``-pixel square a vector's
    destination covers."""
    top = (vectors["dst_y"].astype(np.int64) - vectors["h"] // 2) // block
    left = (vectors["dst_x"].astype(np.int64) - vectors["w"] // 2) // block
    high, wide = partition_blocks(vectors, block)
    if high.max() == 1 and wide.max() == 1:   # one block each, as estimated vectors on their own grid
        return np.arange(len(vectors)), clamp(top, rows - 1), clamp(left, cols - 1)
    # One entry per covered block (a hot path: every decoded frame of an H.264 stream, up to 57,600
    # blocks at 1280x720): vector k's blocks row by row inside its partition. Built a partition row
    # at a time and then repeated along it, with no division per block (that was most of the cost).
    vector_of_row = np.repeat(np.arange(len(vectors)), high)
    row_within = np.arange(len(vector_of_row)) - np.repeat(np.cumsum(high) - high, high)
    row_wide = wide[vector_of_row]
    row_start = np.cumsum(row_wide) - row_wide              # each partition row's first entry
    which = np.repeat(vector_of_row, row_wide)
    r = np.repeat(clamp(top[vector_of_row] + row_within, rows - 1), row_wide)
    c = np.arange(len(which)) + np.repeat(left[vector_of_row] - row_start, row_wide)
    if left.min() < 0 or (left + wide).max() > cols:    # a partition clipped at the frame's side
        c = clamp(c, cols - 1)
    return which, r, c


def partition_blocks(vectors: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, columns)`` of ``block``-pixel squares each vector's partition spans, at least one
    each: `destination_blocks` gives each vector ``rows * columns`` entries."""
    return np.maximum(1, vectors["h"].astype(np.int64) // block), np.maximum(1, vectors["w"].astype(np.int64) // block)


def clamp(values: np.ndarray, high: int) -> np.ndarray:
    """``np.clip(values, 0, high)`` at a third of its per-call overhead (called on every decoded frame)."""
    return np.minimum(np.maximum(values, 0), high)

"""Whole-pixel block matching: where in the previous picture each chosen block's content was.

Lucas-Kanade's flow (`pixel_motion`) linearises the picture: it measures motion up to about a
reduced pixel and underestimates anything farther. A small object crossing a camera's view in two
seconds moves five reduced pixels (more than a block) between pictures 1/15 s apart; its flow then
points at the wrong block, and the persistent rule's run of moving estimates, which follows each
block back to where its vector says it came from, breaks wherever the object enters new blocks.
Matching the block against every shift of up to `SEARCH_RADIUS` reduced pixels finds such motion,
at a cost per block searched (so only blocks the flow fails are).
"""

from __future__ import annotations

import numpy as np

from vidsight.ingest.motion import clamp

# Shifts searched per axis, in reduced pixels (6: 24 frame pixels at 640 wide, 48 at 1280; at 15
# pictures a second, objects up to 360 or 720 frame pixels a second).
SEARCH_RADIUS = 6


def best_shifts(now: np.ndarray, before: np.ndarray, block_p: np.ndarray, block_r: np.ndarray,
                block_c: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each chosen ``block`` x ``block`` block (picture, row, column) of ``now``, the shift of
    ``before`` (both ``(pictures, H, W)`` int16, `reduced_luma`'s sums) it matches best: the least
    sum of absolute differences over the shifts of up to `SEARCH_RADIUS` reduced pixels that keep
    the block inside the picture (the first in row-major order of ``(dy, dx)`` on a tie).

    Returns:
        ``(dy, dx, sad)``: per block, where its content lies in ``before`` relative to its own
        place, and the SAD there.
    """
    _, height, width = now.shape
    radius, shifts = SEARCH_RADIUS, 2 * SEARCH_RADIUS + 1
    top, left = block_r * block, block_c * block
    # Each block's window of `before`: its own place and every shift around it. Rows and columns
    # past the picture's edges are clamped to it; the shifts reaching them are ruled out below.
    span = np.arange(-radius, block + radius)
    rows = clamp(top[:, None] + span, height - 1)
    cols = clamp(left[:, None] + span, width - 1)
    windows = before[block_p[:, None, None], rows[:, :, None], cols[:, None, :]]        # (blocks, side, side)
    inside = np.arange(block)
    own = now[block_p[:, None, None], (top[:, None] + inside)[:, :, None], (left[:, None] + inside)[:, None, :]]
    # One pixel of the block at a time against all its shifts: a step over (blocks, shifts, shifts)
    # per pixel (a sliding-window view over all of them at once was several times slower). Sums of
    # 16 differences of sums of four 8-bit pixels (at most 1020 each) fit int16.
    sad = np.zeros((len(own), shifts, shifts), np.int16)
    term = np.empty_like(sad)
    for y in range(block):
        for x in range(block):
            np.subtract(windows[:, y : y + shifts, x : x + shifts], own[:, y, x, None, None], out=term)
            sad += np.abs(term, out=term)
    offsets = np.arange(-radius, radius + 1)
    outside_rows = (top[:, None] + offsets < 0) | (top[:, None] + offsets > height - block)
    outside_cols = (left[:, None] + offsets < 0) | (left[:, None] + offsets > width - block)
    sad[outside_rows[:, :, None] | outside_cols[:, None, :]] = np.iinfo(np.int16).max
    sad = sad.reshape(len(own), -1)
    best = sad.argmin(axis=1)
    return best // shifts - radius, best % shifts - radius, sad[np.arange(len(best)), best]

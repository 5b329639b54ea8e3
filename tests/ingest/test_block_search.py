"""Block matching against its definition: the least SAD over every shift that stays inside."""

import numpy as np

from vidsight.ingest.block_search import SEARCH_RADIUS, best_shifts

BLOCK = 4


def _best_by_definition(now, before, p, r, c):
    own = now[p, r * BLOCK : (r + 1) * BLOCK, c * BLOCK : (c + 1) * BLOCK].astype(np.int64)
    best = None
    for dy in range(-SEARCH_RADIUS, SEARCH_RADIUS + 1):
        for dx in range(-SEARCH_RADIUS, SEARCH_RADIUS + 1):
            y, x = r * BLOCK + dy, c * BLOCK + dx
            if 0 <= y <= now.shape[1] - BLOCK and 0 <= x <= now.shape[2] - BLOCK:
                sad = int(np.abs(before[p, y : y + BLOCK, x : x + BLOCK] - own).sum())
                if best is None or sad < best[2]:
                    best = (dy, dx, sad)
    return best


def test_every_block_gets_the_shift_of_least_sad_inside_the_picture():
    rng = np.random.default_rng(5)
    before = rng.integers(0, 1021, (2, 24, 40)).astype(np.int16)
    now = rng.integers(0, 1021, (2, 24, 40)).astype(np.int16)
    now[1, 8:12, 16:20] = before[1, 13:17, 11:15]          # a block whose content came from (+5, -5)
    # corners, where most shifts fall outside, and the middle
    blocks = (np.array([0, 0, 0, 1, 1, 1]), np.array([0, 5, 2, 2, 0, 5]), np.array([0, 9, 4, 4, 9, 0]))
    dy, dx, sad = best_shifts(now, before, *blocks, BLOCK)
    for k, block in enumerate(zip(*blocks)):
        assert (dy[k], dx[k], sad[k]) == _best_by_definition(now, before, *block), block
    assert (dy[3], dx[3], sad[3]) == (5, -5, 0)

"""Motion estimated from pixels: a moving camera moves every block; a still one, none."""

import numpy as np
import pytest

from vidsight.ingest.pixel_motion import CAMERA_MOTION_PX, estimate_vectors

ROWS, COLS = 88, 160   # a reduced picture: 22 x 40 blocks of 4 x 4
SCALE = 4              # as a 640x360 frame's


def picture(shift: float, seed: int, noise: float = 2.0) -> np.ndarray:
    """A smooth texture moved right by ``shift`` reduced pixels, with sensor noise, as `reduced_luma` gives it."""
    y, x = np.mgrid[0:ROWS, 0:COLS].astype(np.float64)
    x = x - shift
    levels = 128 + 30 * np.sin(x / 3.1) * np.cos(y / 4.3) + 20 * np.sin((x + y) / 5.7)
    sums = 4 * levels + np.random.default_rng(seed).normal(0, noise, levels.shape)   # four samples a pixel
    return sums.round().astype(np.int16)


@pytest.mark.parametrize("shift", [0.1, 0.3])
def test_a_camera_moving_a_fraction_of_a_pixel_moves_every_block_with_it(shift):
    # 0.4 and 1.2 frame pixels a frame: each block changes too little to stand out from the others.
    (vectors, (which, rows, cols)), = estimate_vectors(picture(shift, 1)[None], picture(0.0, 2)[None], SCALE)
    assert len(vectors) == (ROWS // 4) * (COLS // 4)
    assert sorted(zip(rows.tolist(), cols.tolist())) == [(r, c) for r in range(ROWS // 4) for c in range(COLS // 4)]
    # FFmpeg's convention: the motion points back to where the content was (left, for a move right).
    moved = np.median(vectors["motion_x"] / vectors["motion_scale"])
    assert moved == pytest.approx(-shift * SCALE, abs=0.15)
    assert np.abs(np.median(vectors["motion_y"] / vectors["motion_scale"])) <= 0.25


def test_a_still_camera_one_moving_under_the_threshold_and_a_flat_picture_give_no_vectors():
    assert 0.05 * SCALE < CAMERA_MOTION_PX
    for shift in (0.0, 0.05):
        (vectors, _), = estimate_vectors(picture(shift, 1)[None], picture(0.0, 2)[None], SCALE)
        assert len(vectors) == 0, shift
    black = np.full((1, ROWS, COLS), 64, np.int16)   # nothing to see a camera move by
    (vectors, _), = estimate_vectors(black, black.copy(), SCALE)
    assert len(vectors) == 0


def test_an_object_moving_on_a_still_camera_moves_its_blocks_only():
    before, now = picture(0.0, 2), picture(0.0, 1)
    now[40:52, 60:72] = before[38:50, 60:72]     # a patch moved down by two pixels
    (vectors, (_, rows, cols)), = estimate_vectors(now[None], before[None], SCALE)
    assert 0 < len(vectors) <= 16
    assert rows.min() >= 9 and rows.max() <= 13 and cols.min() >= 14 and cols.max() <= 18

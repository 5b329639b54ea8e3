"""Motion estimated from pixels: a moving camera moves every block; a still one, none."""

import av
import numpy as np
import pytest

from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.judge import FrameJudge
from vidsight.ingest.pixel_motion import (CAMERA_MOTION_PX, QUIET_BLOCKS, UNEXPLAINED_SHARE, Between, PixelMotion,
                                          _block_terms, _camera_flow, _flow, _gradients, _to_search, estimate_vectors,
                                          frame_step, reduced_luma, reduction)

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


def _object_moved(shift: int) -> tuple[np.ndarray, np.ndarray]:
    """``(now, before)``: a textured square with sharp edges moved ``shift`` reduced pixels right
    (from columns 60-67 of rows 40-47) on a still noisy picture."""
    before, now = picture(0.0, 2), picture(0.0, 1)
    square = 64 + 700 * (np.add.outer(np.arange(8), np.arange(8)) % 3 == 0)
    before[40:48, 60:68] = square
    now[40:48, 60 + shift : 68 + shift] = square
    return now, before


def test_an_object_moving_farther_than_the_flow_measures_gets_the_shift_it_moved():
    now, before = _object_moved(6)                # its flow says a fraction of that
    (vectors, (_, rows, cols)), = estimate_vectors(now[None], before[None], SCALE)
    inside = (rows == 10) & (cols == 17)          # the block it fills now (rows 40-43, columns 68-71)
    assert inside.sum() == 1
    assert vectors["motion_x"][inside] / vectors["motion_scale"][inside] == -6 * SCALE   # back to where it was
    assert vectors["motion_y"][inside] == 0
    # Beside a busy pair (most blocks moved: not searched), the pair's vectors are the same.
    busy = picture(0.0, 7)
    busy[:, ::2] = picture(3.0, 8)[:, ::2]
    (beside, _), _ = estimate_vectors(np.stack([now, busy]), np.stack([before, picture(0.0, 9)]), SCALE)
    assert (beside == vectors).all()


def test_blocks_whose_flow_explains_under_half_their_change_are_searched_on_quiet_pictures_only():
    moved_now, moved_before = _object_moved(6)
    now = np.stack([picture(0.3, 1, noise=0.0), moved_now])
    before = np.stack([picture(0.0, 2, noise=0.0), moved_before])
    gradients = _gradients(now + before, now - before)
    mean = np.stack(np.gradient((now + before).astype(np.float64) / 2, axis=(2, 1)))
    blocks = (np.array([0, 0, 0, 1, 1]), np.array([3, 10, 20, 10, 11]), np.array([5, 30, 2, 17, 16]))
    terms = _block_terms(gradients, *blocks)
    flow = _flow(terms)
    unexplained = []
    for k, (p, r, c) in enumerate(zip(*blocks)):
        rows, cols = slice(4 * r, 4 * r + 4), slice(4 * c, 4 * c + 4)
        spatial = mean[:, p, rows, cols].reshape(2, -1)
        temporal = (now - before)[p, rows, cols].reshape(-1).astype(np.float64)
        error = flow[:, k] @ spatial + temporal   # brightness constancy's, per pixel
        unexplained.append((error @ error) / (temporal @ temporal))
    expected = [k for k, share in enumerate(unexplained) if share > UNEXPLAINED_SHARE]
    assert expected == [3, 4]                     # the object's: its flow fails; the pan's 0.3: it holds
    assert _to_search(terms, flow, blocks[0], 2).tolist() == expected
    crowded = tuple(np.concatenate([b, np.full(QUIET_BLOCKS, v)]) for b, v in zip(blocks, (1, 0, 0)))
    terms = _block_terms(gradients, *crowded)
    assert _to_search(terms, _flow(terms), crowded[0], 2).tolist() == []   # pair 1 is busy now


def test_motion_over_two_frames_moves_the_camera_by_its_motion_per_frame():
    # 0.1 reduced pixels over two frames: 0.2 frame pixels a frame, under CodecSight's tau.
    assert 0.1 * SCALE / 2 < CAMERA_MOTION_PX < 0.1 * SCALE
    (vectors, _), = estimate_vectors(picture(0.1, 1)[None], picture(0.0, 2)[None], SCALE, frames=2)
    assert len(vectors) == 0
    (vectors, _), = estimate_vectors(picture(0.3, 1)[None], picture(0.0, 2)[None], SCALE, frames=2)
    assert len(vectors) == (ROWS // 4) * (COLS // 4)
    # The vectors give the whole move since the earlier picture: the rule divides by the frames.
    assert np.median(vectors["motion_x"] / vectors["motion_scale"]) == pytest.approx(-0.3 * SCALE, abs=0.15)


def _lucas_kanade(mean: np.ndarray, change: np.ndarray) -> np.ndarray:
    """``(u, v)`` solving the normal equations of ``Ix u + Iy v + It = 0`` over the pixels given,
    ``Ix`` and ``Iy`` being ``mean``'s gradients (a float array of them, pixels along the last axis)."""
    ix, iy = mean
    a = np.array([[ix @ ix, ix @ iy], [ix @ iy, iy @ iy]])
    return np.linalg.solve(a, -np.array([ix @ change, iy @ change]))


def test_block_and_camera_flows_are_lucas_kanade_on_the_mean_pictures_gradients():
    now, before = np.stack([picture(0.3, 1), picture(0.2, 3)]), np.stack([picture(0.0, 2), picture(0.0, 4)])
    change, twice_mean = now - before, now + before
    # np.gradient: central differences, one-sided at the edges, as the flows' own
    gradients = np.stack(np.gradient(twice_mean.astype(np.float64) / 2, axis=(2, 1)))   # (x or y, pairs, H, W)
    blocks = (np.array([0, 0, 1, 1]), np.array([0, 10, 21, 5]), np.array([0, 39, 17, 0]))   # corners and edges
    flows = _flow(_block_terms(_gradients(twice_mean, change), *blocks))
    for k, (p, r, c) in enumerate(zip(*blocks)):
        rows, cols = slice(4 * r, 4 * r + 4), slice(4 * c, 4 * c + 4)
        expected = _lucas_kanade(gradients[:, p, rows, cols].reshape(2, -1), change[p, rows, cols].reshape(-1))
        assert flows[:, k] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    moved = np.zeros((2, ROWS // 4, COLS // 4), bool)
    moved[0, 5:8, 10:20] = True                 # an object's blocks: left out of the camera's flow
    camera = _camera_flow(_gradients(twice_mean, change), moved)
    for p in range(2):
        background = ~np.repeat(np.repeat(moved[p], 4, 0), 4, 1)
        background[1::2] = False                 # every other pixel of every other row
        background[:, 1::2] = False
        expected = _lucas_kanade(gradients[:, p][:, background], change[p][background])
        assert camera[:, p] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert camera[0, 0] == pytest.approx(0.3, abs=0.05) and camera[0, 1] == pytest.approx(0.2, abs=0.05)


def test_many_frames_at_once_and_a_new_frame_size_are_estimated_as_in_small_batches():
    small = av.VideoFrame.from_ndarray(np.zeros((176, 320), np.uint8), format="gray")
    run = 12   # more than the slots held at first (they double as needed)
    frames = [_frame(0.4 * k, k) for k in range(run)] + [small, small, _frame(0.0, 1), _frame(0.4, 2)]
    kinds = ["I"] + ["P"] * (len(frames) - 1)
    whole, in_twos = PixelMotion(), PixelMotion()
    taken_in_twos = []
    for k, (frame, kind) in enumerate(zip(frames, kinds)):
        whole.add(frame, kind)
        in_twos.add(frame, kind)
        if k % 2:
            taken_in_twos += in_twos.take()
    taken, taken_in_twos = whole.take(), taken_in_twos + in_twos.take()
    sizes_change = [0, run, run + 2]   # nothing of the same size to compare with
    assert [k for k, t in enumerate(taken) if t is None] == sizes_change
    for k in range(len(frames)):
        if k not in sizes_change:
            (expected, _), = estimate_vectors(reduced_luma(frames[k])[None], reduced_luma(frames[k - 1])[None],
                                              reduction(frames[k].width))
            assert np.array_equal(taken[k][0], expected) and np.array_equal(taken_in_twos[k][0], expected), k
    assert len(taken[run + 3][0]) > 0   # the pan goes on after the size came back


def _frame(shift: float, seed: int) -> av.VideoFrame:
    """A 640x352 frame whose `reduced_luma` is ``picture(shift, seed)`` (to within rounding)."""
    levels = (picture(shift, seed) / 4).clip(0, 255).astype(np.uint8)
    return av.VideoFrame.from_ndarray(np.repeat(np.repeat(levels, SCALE, 0), SCALE, 1), format="gray")


def test_every_second_frame_of_a_gop_is_estimated_from_the_one_two_before_whenever_taken():
    kinds = ["I", "P", "P", "P", "P", "I", "P", "P"]
    frames = [_frame(0.4 * k, k) for k in range(len(kinds))]   # a pan of 1.6 frame pixels a frame
    assert reduction(frames[0].width) == SCALE
    at_once, in_threes = PixelMotion(step=2), PixelMotion(step=2)
    taken_in_threes = []
    for k, (frame, kind) in enumerate(zip(frames, kinds)):
        at_once.add(frame, kind)
        in_threes.add(frame, kind)
        if k % 3 == 2:
            taken_in_threes += in_threes.take()
    taken, taken_in_threes = at_once.take(), taken_in_threes + in_threes.take()
    assert [t is None for t in taken] == [True, False, False, False, False, True, False, False]
    assert [t is Between for t in taken] == [False, True, False, True, False, False, True, False]
    for k in (2, 4, 7):   # 7: two after the second I-frame
        (expected, _), = estimate_vectors(reduced_luma(frames[k])[None], reduced_luma(frames[k - 2])[None], SCALE,
                                          frames=2)
        assert len(expected) > 0
        assert np.array_equal(taken[k][0], expected) and np.array_equal(taken_in_threes[k][0], expected)


@pytest.mark.parametrize("width, height, strip", [(640, 360, "bottom"), (650, 352, "right")])
def test_an_object_past_the_last_whole_block_is_seen(width, height, strip):
    # 4x reduction: 360 rows reduce to 90, 22 whole blocks of 4 (352 frame rows) and half of one;
    # 650 columns to 162, 40 whole blocks (640 columns) and a half. An object moving along the
    # strip past the last whole block must be judged dynamic there, as an encoder's vectors (which
    # cover the whole picture) would have it.
    y, x = np.mgrid[0:height, 0:width]
    background = 128 + 40 * np.sin(x / 7.0) * np.cos(y / 9.0)
    judge, verdicts = FrameJudge(MotionPruneConfig(dilate_blocks=0), "pixels", 15.0), []
    for k in range(10):
        picture = background + np.random.default_rng(k).normal(0, 2, background.shape)
        if strip == "bottom":
            picture[354:360, 100 + 3 * k : 124 + 3 * k] = 250        # 6 rows, all below row 352
        else:
            picture[100 + 3 * k : 124 + 3 * k, 642:650] = 250        # 8 columns, all right of 640
        frame = av.VideoFrame.from_ndarray(picture.clip(0, 255).astype(np.uint8), format="gray")
        verdicts += [signals[2] for _, signals in judge.push(frame, "I" if k == 0 else "P", k)]
    verdicts += [signals[2] for _, signals in judge.finish()]
    blocks = [v.blocks() for v in verdicts[1:]]
    assert any((b[88:] if strip == "bottom" else b[:, 160:]).any() for b in blocks)
    assert not any((b[:80] if strip == "bottom" else b[:, :150]).any() for b in blocks)   # nothing elsewhere


def test_pictures_about_a_fifteenth_of_a_second_apart_are_compared():
    assert [frame_step(fps) for fps in (0, 4, 12, 15, 20, 24, 25, 30, 50, 60)] == [1, 1, 1, 1, 1, 2, 2, 2, 3, 4]
    assert frame_step(90_000) == 1   # a timestamp clock guessed as the rate: every frame, not one in 6000

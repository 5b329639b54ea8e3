"""Ground truth: the square moves over a static background, so motion lives on its path only."""

import numpy as np
import pytest

from vidsight.ingest import DecodeConfig, decode_frames
from vidsight.ingest.motion import BLOCK, motion_map


def square_mask(truth, index, rows, cols, margin_blocks=0) -> np.ndarray:
    """4x4 blocks covered by the square in frame ``index`` (grown by ``margin_blocks``)."""
    x, y = truth["square_xy"][index]
    n = truth["square_size"]
    mask = np.zeros((rows, cols), dtype=bool)
    top, left = max(0, y // BLOCK - margin_blocks), max(0, x // BLOCK - margin_blocks)
    mask[top : (y + n - 1) // BLOCK + 1 + margin_blocks, left : (x + n - 1) // BLOCK + 1 + margin_blocks] = True
    return mask


@pytest.mark.parametrize("bframes", [False, True])
def test_large_motion_lies_on_square_path_only(make_test_video, bframes):
    path, truth = make_test_video(width=320, height=240, fps=24, duration_s=2.0, gop=12, bframes=bframes,
                                  square_size=48, seed=7)
    batch = decode_frames(path, config=DecodeConfig(with_codec_info=True))
    moving_frames = 0
    for index, info in zip(batch.indices.tolist(), batch.codec):
        if info.frame_type == "I":
            continue
        magnitude = info.motion.max(axis=0)
        rows, cols = magnitude.shape
        # A destination block moves only if the square covers it now or in a neighbouring frame
        # (a reference frame may be two frames away with B-frames).
        near = np.zeros_like(magnitude, dtype=bool)
        for other in range(max(0, index - 3), min(len(truth["square_xy"]), index + 4)):
            near |= square_mask(truth, other, rows, cols, margin_blocks=2)
        assert not ((magnitude > 0) & ~near).any(), f"frame {index}: motion in the static background"
        if ((magnitude >= 1.0) & square_mask(truth, index, rows, cols)).any():
            moving_frames += 1
    assert moving_frames >= 0.8 * sum(c.frame_type != "I" for c in batch.codec)


def test_motion_vectors_identical_across_runs(make_test_video):
    path, _ = make_test_video(width=320, height=240, fps=24, duration_s=2.0, gop=12, bframes=True, seed=7)
    first = decode_frames(path, config=DecodeConfig(with_codec_info=True))
    second = decode_frames(path, config=DecodeConfig(with_codec_info=True))
    for a, b in zip(first.codec, second.codec):
        assert a.frame_type == b.frame_type
        np.testing.assert_array_equal(a.motion, b.motion)


def test_motion_map_assigns_vectors_by_destination():
    dtype = [("source", "<i4"), ("w", "u1"), ("h", "u1"), ("src_x", "<i2"), ("src_y", "<i2"), ("dst_x", "<i2"),
             ("dst_y", "<i2"), ("flags", "<u8"), ("motion_x", "<i4"), ("motion_y", "<i4"), ("motion_scale", "<u2")]
    vectors = np.array([(-1, 16, 16, 0, 0, 24, 8, 0, 12, 16, 4),   # 16x16 at x 16..31, y 0..15: |(3,4)| = 5 px
                        (1, 8, 8, 0, 0, 4, 36, 0, 8, 0, 4)],      # 8x8 at x 0..7, y 32..39, future ref: 2 px
                       dtype=dtype)
    out = motion_map(vectors, height=48, width=48)
    assert out.shape == (2, 12, 12)
    expected_past = np.zeros((12, 12), dtype=np.float32)
    expected_past[0:4, 4:8] = 5.0
    np.testing.assert_array_equal(out[0], expected_past)
    expected_future = np.zeros((12, 12), dtype=np.float32)
    expected_future[8:10, 0:2] = 2.0
    np.testing.assert_array_equal(out[1], expected_future)
    assert not motion_map(None, 48, 48).any()


def test_destination_blocks_and_motion_map_follow_their_definition_on_clipped_and_overlapping_partitions():
    from vidsight.ingest.motion import destination_blocks
    from vidsight.ingest.pixel_motion import VECTOR_DTYPE

    rng = np.random.default_rng(5)
    for case in range(300):
        rows, cols = (int(n) for n in rng.integers(1, 12, 2))
        count = int(rng.integers(1, 60))
        vectors = np.zeros(count, VECTOR_DTYPE)
        vectors["w"], vectors["h"] = rng.choice([4, 8, 16], (2, count))
        vectors["dst_x"] = rng.integers(-8, cols * BLOCK + 8, count)   # partitions past every side of the frame
        vectors["dst_y"] = rng.integers(-8, rows * BLOCK + 8, count)
        vectors["motion_x"], vectors["motion_y"] = rng.integers(-40, 41, (2, count))
        vectors["motion_scale"], vectors["source"] = 4, rng.choice([-1, 1], count)
        # The definition: each vector's blocks row by row inside its partition, clamped to the grid;
        # a block's value is the largest magnitude of its direction's vectors landing on it.
        expected_cover, expected_map = [], np.zeros((2, rows, cols), np.float32)
        for k, vector in enumerate(vectors):
            top = (int(vector["dst_y"]) - int(vector["h"]) // 2) // BLOCK
            left = (int(vector["dst_x"]) - int(vector["w"]) // 2) // BLOCK
            magnitude = np.float32(np.hypot(vector["motion_x"], vector["motion_y"]) / 4)
            for dy in range(int(vector["h"]) // BLOCK):
                for dx in range(int(vector["w"]) // BLOCK):
                    r, c = min(max(top + dy, 0), rows - 1), min(max(left + dx, 0), cols - 1)
                    expected_cover.append((k, r, c))
                    plane = int(vector["source"] > 0)
                    expected_map[plane, r, c] = max(expected_map[plane, r, c], magnitude)
        which, r, c = destination_blocks(vectors, rows, cols)
        assert list(zip(which.tolist(), r.tolist(), c.tolist())) == expected_cover, case
        np.testing.assert_array_equal(motion_map(vectors, rows * BLOCK, cols * BLOCK), expected_map)

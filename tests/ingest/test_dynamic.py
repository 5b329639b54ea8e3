"""The motion rules on hand-made vector records: persistence, the noise floor, widening, edge cases."""

import numpy as np

from vidsight.ingest.dynamic import BlockMotion, MotionPruneConfig
from vidsight.ingest.motion import intra_blocks, motion_map

H, W = 32, 32  # 8x8 blocks


def vectors(*moves, source=-1):
    """One 4x4 vector per ``(block row, block col, dx, dy)``."""
    dtype = np.dtype([("source", "i4"), ("w", "u1"), ("h", "u1"), ("src_x", "i2"), ("src_y", "i2"), ("dst_x", "i2"),
                      ("dst_y", "i2"), ("flags", "u8"), ("motion_x", "i4"), ("motion_y", "i4"), ("motion_scale", "u2")])
    out = np.zeros(len(moves), dtype=dtype)
    for k, (r, c, dx, dy) in enumerate(moves):
        out[k] = (source, 4, 4, 0, 0, 4 * c + 2, 4 * r + 2, 0, round(dx * 4), round(dy * 4), 4)
    return out


def judge(rule: BlockMotion, kind: str, records, luma=None, frames=1):
    """The rule's verdict on one frame of ``H`` x ``W`` with these vector records (motion over
    ``frames`` frames), on the 4x4 grid."""
    intra = intra_blocks(records, H, W) if kind != "I" else None
    verdict = rule.update(kind, records, motion_map(records, H, W), intra, luma, frames=frames)
    return None if verdict is None else verdict.blocks()


def test_motion_counts_once_it_persists_from_where_the_block_came_from():
    rule = BlockMotion(MotionPruneConfig(dilate_blocks=0, persist_frames=2))
    assert judge(rule, "I", None) is None
    assert not judge(rule, "P", vectors((2, 2, -4.0, 0.0))).any()     # nothing to persist from yet
    # The object moved one block right: block (2, 3) came from (2, 2), which moved last frame.
    now = judge(rule, "P", vectors((2, 3, -4.0, 0.0)))
    assert np.argwhere(now).tolist() == [[2, 3]]
    assert not judge(rule, "P", vectors((6, 6, 0.5, 0.0))).any()       # a lone jitter vector


def test_by_default_motion_must_last_three_frames_so_a_macroblock_of_noise_twice_in_a_row_is_static():
    rule = BlockMotion(MotionPruneConfig(dilate_blocks=0))
    judge(rule, "I", None)
    noise = [(r, c, 0.5, 0.0) for r in range(4, 8) for c in range(4, 8)]  # a 16x16 macroblock's vector
    walk = [(2, 0, -4.0, 0.0)]
    assert not judge(rule, "P", vectors(*noise, *walk)).any()
    walk = [(2, 1, -4.0, 0.0)]
    assert not judge(rule, "P", vectors(*noise, *walk)).any()            # two frames: not yet
    walk = [(2, 2, -4.0, 0.0)]
    assert np.argwhere(judge(rule, "P", vectors(*walk))).tolist() == [[2, 2]]  # the third frame of the walk


def test_a_block_moving_for_longer_than_its_count_can_hold_stays_dynamic_and_stops_when_it_stops():
    # Runs are counted up to persist_frames only, in the smallest integers holding it (uint8 here):
    # 300 frames in a row must neither wrap around nor outlast the motion.
    for persist in (3, 300):
        rule = BlockMotion(MotionPruneConfig(dilate_blocks=0, persist_frames=persist))
        judge(rule, "I", None)
        verdicts = [judge(rule, "P", vectors((1, 1, 1.0, 0.0))) for _ in range(300)]
        assert [k for k, v in enumerate(verdicts) if v[1, 1]] == list(range(persist - 1, 300))
        assert all(v.sum() == v[1, 1] for v in verdicts)
        assert not judge(rule, "P", vectors((5, 5, 1.0, 0.0)))[1, 1]


def test_motion_over_several_frames_is_weighed_per_frame_and_must_last_as_many_judgements():
    rule = BlockMotion(MotionPruneConfig(dilate_blocks=0))   # tau 0.25, three frames
    judge(rule, "I", None)
    for _ in range(3):   # 0.4 pixels over two frames: 0.2 a frame, under tau however long it lasts
        assert not judge(rule, "P", vectors((2, 2, 0.4, 0.0)), frames=2).any()
    judge(rule, "I", None)
    for _ in range(2):   # moving in two estimates two frames apart: not yet
        assert not judge(rule, "P", vectors((2, 2, 1.0, 0.0)), frames=2).any()
    assert np.argwhere(judge(rule, "P", vectors((2, 2, 1.0, 0.0)), frames=2)).tolist() == [[2, 2]]
    rule = BlockMotion(MotionPruneConfig(dilate_blocks=0))
    judge(rule, "I", None)
    for _ in range(2):   # one frame a step: two are not three
        assert not judge(rule, "P", vectors((2, 2, 0.5, 0.0))).any()
    pan = [(r, c, 0.4, 0.0) for r in range(8) for c in range(8)]   # a camera 0.2 pixels a frame: no pan
    assert not judge(rule, "P", vectors(*pan), frames=2).any()


def test_a_moving_camera_moves_every_block_even_where_its_encoder_coded_one_still():
    rng = np.random.default_rng(0)
    rule = BlockMotion(MotionPruneConfig(dilate_blocks=0))
    judge(rule, "I", None)
    for _ in range(3):   # uneven vectors, a third of the blocks coded still: no noise floor to rise
        pan = [(r, c, float(rng.uniform(0.3, 2.0)), 0.0) for r in range(8) for c in range(8) if rng.random() < 0.65]
        dynamic = judge(rule, "P", vectors(*pan))
    assert dynamic.all()


def test_a_frame_predicted_only_from_the_future_has_no_past_to_persist_from():
    rule = BlockMotion(MotionPruneConfig())
    judge(rule, "I", None)
    judge(rule, "P", vectors((2, 2, 3.0, 0.0)))
    assert judge(rule, "B", vectors((2, 2, 3.0, 0.0), source=1)).shape == (8, 8)


def test_the_first_rule_marks_vectors_and_intra_blocks_widened():
    rule = BlockMotion(MotionPruneConfig(rule="max", dilate_blocks=1))
    judge(rule, "I", None)
    dynamic = judge(rule, "P", vectors(*[(r, c, 0.0, 0.0) for r in range(8) for c in range(8) if (r, c) != (0, 0)]))
    assert np.argwhere(dynamic).tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]  # intra (0, 0), widened


def test_a_stream_joined_after_its_i_frame_goes_without_residuals_until_it_has_a_reference():
    from vidsight.ingest.dynamic import SOFTWARE_ALPHA

    rule = BlockMotion(MotionPruneConfig(alpha=SOFTWARE_ALPHA, persist_frames=2))
    luma = np.zeros((H, W), dtype=np.uint8)
    assert not judge(rule, "P", vectors((1, 1, 2.0, 0.0)), luma).any()   # no reference: motion only
    assert judge(rule, "P", vectors((1, 1, 2.0, 0.0)), luma + 90).any()  # now both


def test_a_coarse_grid_judges_each_square_and_widens_on_the_4x4_grid():
    """Estimated vectors cover 16-pixel squares: judged on that grid, the verdict comes out on the
    frame's 4x4 grid with the same one-block (4-pixel) slack around it as a 4x4 vector gets."""
    from vidsight.ingest.motion import destination_blocks, grid_shape

    side, height, width = 16, 40, 40                 # a 3x3 grid of squares, the last row/column cut short
    rule = BlockMotion(MotionPruneConfig(persist_frames=1), block=side)
    records = vectors((1, 1, -4.0, 0.0))
    records["w"] = records["h"] = side
    records["dst_x"], records["dst_y"] = side + side // 2, side + side // 2
    rows, cols = grid_shape(height, width, side)
    cover = destination_blocks(records, rows, cols, side)
    assert rule.update("I", None, motion_map(None, height, width, block=side), None) is None
    dynamic = rule.update("P", records, motion_map(records, height, width, cover, side), None, cover=cover,
                          fine_shape=grid_shape(height, width)).blocks()
    expected = np.zeros((10, 10), dtype=bool)
    expected[3:9, 3:9] = True                       # the square's 4x4 blocks 4..7, one block either side
    assert np.array_equal(dynamic, expected)


def test_the_fine_grid_dilation_is_a_square_dilation_of_the_repeated_map():
    from vidsight.ingest.dynamic import _on_fine_grid

    rng = np.random.default_rng(0)
    for factor, fine_shape in ((1, (18, 32)), (3, (23, 30)), (8, (45, 80))):
        coarse = rng.random((-(-fine_shape[0] // factor), -(-fine_shape[1] // factor))) > 0.8
        fine = np.repeat(np.repeat(coarse, factor, 0), factor, 1)[: fine_shape[0], : fine_shape[1]]
        for by in (0, 1, 2):
            padded, expected = np.pad(fine, by), np.zeros_like(fine)
            for dy in range(2 * by + 1):
                for dx in range(2 * by + 1):
                    expected |= padded[dy : dy + fine_shape[0], dx : dx + fine_shape[1]]
            assert np.array_equal(_on_fine_grid(coarse, factor, fine_shape, by), expected), (factor, by)


def test_verdicts_join_and_tell_whether_every_block_is_dynamic_as_their_4x4_maps_do():
    from vidsight.ingest.dynamic import Verdict

    rng = np.random.default_rng(2)
    for factor, fine_shape in ((1, (18, 32)), (2, (9, 15)), (3, (23, 30)), (8, (45, 80)), (8, (41, 73)), (8, (3, 5))):
        shape = (-(-fine_shape[0] // factor), -(-fine_shape[1] // factor))
        for dilate in (0, 1, 2, 4):
            for density in (0.5, 0.97, 1.0):
                for _ in range(20):
                    one, two = (Verdict(rng.random(shape) < density, factor, fine_shape, dilate) for _ in range(2))
                    assert one.all() == bool(one.blocks().all()), (factor, fine_shape, dilate)
                    assert np.array_equal((one | two).blocks(), one.blocks() | two.blocks())
                    other = Verdict(rng.random(fine_shape) < density, 1, fine_shape, 0)   # another grid
                    assert np.array_equal((one | other).blocks(), one.blocks() | other.blocks())
                    assert (one | other).all() == bool((one.blocks() | other.blocks()).all())


def test_the_noise_floors_quantile_and_median_are_numpys():
    from vidsight.ingest.dynamic import _quantile, _sorted_median
    from vidsight.ingest.pixel_motion import _medians

    rng = np.random.default_rng(1)
    for size in (1, 2, 3, 10, 101, 880):
        values = (rng.random(size) * 3).astype(np.float32)
        assert _quantile(values, 0.95) == float(np.quantile(values, 0.95))
        floors = values.tolist()   # the rule keeps each frame's floor as a Python float
        assert _sorted_median(sorted(floors)) == float(np.median(floors))
        pictures = rng.integers(0, 5000, (3, size, 2)).astype(np.int16)
        assert _medians(pictures).tolist() == [float(np.median(picture)) for picture in pictures]


def test_the_cameras_motion_is_the_median_block_motion_per_axis():
    from vidsight.ingest.dynamic import _camera_motion
    from vidsight.ingest.motion import destination_blocks

    rng = np.random.default_rng(3)
    rows, cols = 9, 12   # a frame whose last row and column clip its 8x8 and 16x16 partitions
    checked = 0
    for case in range(300):
        count = int(rng.integers(1, 40))
        records = vectors(*[(0, 0, 0.0, 0.0)] * count)
        sides = rng.choice([4, 8, 16], count)
        records["w"], records["h"] = sides, sides
        records["dst_x"] = rng.integers(0, cols, count) * 4 + sides // 2
        records["dst_y"] = rng.integers(0, rows, count) * 4 + sides // 2
        records["motion_x"], records["motion_y"] = rng.integers(-64, 65, (2, count))   # few ties
        # Quarter, half or whole pixels, one per stream as codecs export them, or mixed.
        records["motion_scale"] = rng.choice([1, 2, 4], count if case % 3 == 0 else 1)
        records["source"] = rng.choice([-1, 1], count, p=[0.8, 0.2])
        cover = destination_blocks(records, rows, cols)
        which = cover[0]
        past = which[records["source"][which] < 0]
        if 2 * len(past) <= rows * cols or len(past) > rows * cols:
            continue
        # The definition: one value per block a past vector covers, a 0 for every other block.
        medians = [float(np.sort(np.concatenate([records[axis][past] / records["motion_scale"][past],
                                                 np.zeros(rows * cols - len(past))]))
                         [rows * cols // 2]) for axis in ("motion_x", "motion_y")]
        assert _camera_motion(records, rows * cols, 4) == np.hypot(*medians), case
        checked += 1
    assert checked >= 50

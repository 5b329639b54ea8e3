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


def judge(rule: BlockMotion, kind: str, records, luma=None):
    """The rule's verdict on one frame of ``H`` x ``W`` with these vector records."""
    intra = intra_blocks(records, H, W) if kind != "I" else None
    return rule.update(kind, records, motion_map(records, H, W), intra, luma)


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

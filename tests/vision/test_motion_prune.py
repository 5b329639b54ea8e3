import numpy as np
import pytest
import torch

from vidsight.errors import ConfigError
from vidsight.ingest.types import CodecInfo
from vidsight.models.base import VisionSpec
from vidsight.vision.motion import MotionMasker, MotionPruneConfig, dynamic_patches, group_mask

SPEC = VisionSpec(patch_size=14, temporal_patch_size=2, merge_size=2, image_mean=(0, 0, 0), image_std=(1, 1, 1),
                  min_pixels=1, max_pixels=1 << 30, total_pixels=1 << 40, tokens_per_second=2)
GRID = (4, 4)  # patches of a 56x56 frame: 14x14 blocks of 4 px


def p_frame(gop=0, dynamic=()):
    blocks = np.zeros((14, 14), dtype=bool)
    for r, c in dynamic:
        blocks[r, c] = True
    return CodecInfo("P", gop, dynamic=blocks)


def test_a_patch_holding_a_dynamic_block_is_dynamic():
    assert not dynamic_patches(p_frame(), GRID).any()
    assert not dynamic_patches(CodecInfo("P", 0), GRID).any()  # no rule applied: nothing dynamic
    mask = dynamic_patches(p_frame(dynamic=[(0, 0), (13, 13), (2, 5)]), GRID)
    assert mask.nonzero().tolist() == [[0, 0], [0, 1], [3, 3]]  # block (2, 5) lies in patch (0, 1)


def test_mask_accumulates_within_a_gop_and_resets_with_the_next():
    masker = MotionMasker()
    assert masker.frame_mask(CodecInfo("I", 0), GRID).all()            # a GOP's first frame: whole
    assert masker.frame_mask(p_frame(dynamic=[(0, 0)]), GRID).sum() == 1
    assert masker.frame_mask(p_frame(dynamic=[(13, 13)]), GRID).sum() == 2   # still holds (0, 0)
    assert masker.frame_mask(p_frame(gop=1, dynamic=[(13, 13)]), GRID).all()  # first sampled frame of GOP 1
    assert masker.frame_mask(p_frame(gop=1), GRID).sum() == 0


def test_group_mask_unites_a_temporal_patch_and_widens_to_merge_groups():
    a = torch.zeros(GRID, dtype=torch.bool)
    b = torch.zeros(GRID, dtype=torch.bool)
    a[0, 1] = True
    b[3, 3] = True
    groups = group_mask([a, b, torch.zeros(GRID, dtype=torch.bool)], SPEC)  # 3 frames: padded to 2 patches
    assert groups.shape == (2, 2, 2)
    assert groups[0].tolist() == [[True, False], [False, True]]
    assert not groups[1].any()


@pytest.mark.parametrize("bad", [dict(tau=-1), dict(alpha=-0.5), dict(dilate_blocks=-1), dict(rule="median")])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ConfigError):
        MotionPruneConfig(**bad)

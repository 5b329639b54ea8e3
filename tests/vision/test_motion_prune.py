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


def p_frame(gop=0, moving=(), magnitude=1.0, intra=()):
    motion = np.zeros((2, 14, 14), dtype=np.float32)
    for r, c in moving:
        motion[0, r, c] = magnitude
    holes = np.zeros((14, 14), dtype=bool)
    for r, c in intra:
        holes[r, c] = True
    return CodecInfo("P", gop, motion, holes)


def test_vectors_above_tau_and_intra_blocks_are_dynamic():
    config = MotionPruneConfig(tau=0.25, dilate_blocks=0)
    assert not dynamic_patches(p_frame(moving=[(0, 0)], magnitude=0.2), GRID, config).any()
    mask = dynamic_patches(p_frame(moving=[(0, 0)], intra=[(13, 13)]), GRID, config)
    assert mask.nonzero().tolist() == [[0, 0], [3, 3]]


def test_dilation_reaches_the_neighbouring_patch():
    mask = dynamic_patches(p_frame(moving=[(3, 3)]), GRID, MotionPruneConfig(dilate_blocks=1))
    assert mask.nonzero().tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]  # block (3,3) borders four patches


def test_mask_accumulates_within_a_gop_and_resets_with_the_next():
    masker = MotionMasker(MotionPruneConfig(dilate_blocks=0), SPEC)
    assert masker.frame_mask(CodecInfo("I", 0), GRID).all()            # a GOP's first frame: whole
    assert masker.frame_mask(p_frame(moving=[(0, 0)]), GRID).sum() == 1
    assert masker.frame_mask(p_frame(moving=[(13, 13)]), GRID).sum() == 2   # still holds (0, 0)
    assert masker.frame_mask(p_frame(gop=1, moving=[(13, 13)]), GRID).all()  # first sampled frame of GOP 1
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


@pytest.mark.parametrize("bad", [dict(tau=-1), dict(alpha=0.5), dict(dilate_blocks=-1)])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ConfigError):
        MotionPruneConfig(**bad)

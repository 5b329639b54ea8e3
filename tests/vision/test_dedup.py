"""Redundant patches: kept merge groups whose pixels repeat their last encoded version are dropped."""

import numpy as np
import torch

from vidsight.vision.dedup import GLOBAL_LEVELS, RedundantPatches

GRID = (4, 6)   # merge groups of 28 pixels
SIZE = (112, 168)


def noisy_frames(count, sigma=1.0, seed=0):
    rng = np.random.default_rng(seed)
    background = rng.integers(40, 200, (*SIZE, 3)).astype(np.float64)
    frames = np.clip(background + rng.normal(0, sigma, (count, *SIZE, 3)), 0, 255)
    return torch.from_numpy(frames.round().astype(np.uint8))


def test_the_first_frame_is_kept_then_only_what_changed_beyond_the_noise():
    frames = noisy_frames(4)
    frames[2:, 30:50, 60:80] = 255  # an object appears in group (1, 2) and stays
    redundant = RedundantPatches(GRID)
    keep = redundant.filter(frames, torch.ones(4, *GRID, dtype=torch.bool), temporal_patch=1)
    assert keep[0].all()
    assert not keep[1].any()
    changed = torch.zeros(GRID, dtype=torch.bool)
    changed[1, 2] = True
    assert torch.equal(keep[2], changed)
    assert not keep[3].any()  # encoded at frame 2: unchanged since


def test_a_slow_change_adds_up_against_the_last_encoded_pixels():
    frames = noisy_frames(12)
    for k in range(12):
        frames[k, :28, :28] = (frames[k, :28, :28].int() + 2 * k).clamp(max=255).byte()  # 2 levels a frame
    keep = RedundantPatches(GRID).filter(frames, torch.ones(12, *GRID, dtype=torch.bool), temporal_patch=1)
    # Two levels a frame stay within the noise floor; four since the last encoding do not.
    assert keep[1:, 0, 0].tolist() == [False, True] * 5 + [False]
    assert not keep[1:, 2:, :].any()


def test_a_change_of_the_whole_picture_keeps_what_motion_kept():
    frames = noisy_frames(2)
    frames[1] = (frames[1].int() + int(GLOBAL_LEVELS) + 8).clamp(max=255).byte()  # the lights come on
    motion = torch.ones(2, *GRID, dtype=torch.bool)
    motion[1, 0, 0] = False
    keep = RedundantPatches(GRID).filter(frames, motion, temporal_patch=1)
    assert torch.equal(keep, motion)


def test_a_pan_keeps_what_motion_kept():
    frames = noisy_frames(3)
    frames[1] = torch.roll(frames[0], 6, dims=1)  # the camera moved six pixels
    frames[2] = torch.roll(frames[0], 12, dims=1)
    keep = RedundantPatches(GRID).filter(frames, torch.ones(3, *GRID, dtype=torch.bool), temporal_patch=1)
    assert keep.all()


def test_groups_motion_dropped_stay_dropped():
    frames = noisy_frames(2)
    frames[1, 30:50, 60:80] = 255
    motion = torch.zeros(2, *GRID, dtype=torch.bool)
    motion[0] = True
    keep = RedundantPatches(GRID).filter(frames, motion, temporal_patch=1)
    assert not keep[1].any()

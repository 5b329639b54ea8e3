"""vidsight's torch preprocessing against transformers' own (PIL) image processor, frame by frame."""

import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

from vidsight.errors import VideoError
from vidsight.models.base import VisionSpec
from vidsight.models.loading import CLIP_MEAN, CLIP_STD
from vidsight.vision import preprocess_video, smart_resize

SPEC = VisionSpec(patch_size=14, temporal_patch_size=2, merge_size=2, image_mean=CLIP_MEAN, image_std=CLIP_STD,
                  min_pixels=56 * 56, max_pixels=224 * 224, total_pixels=10**9, tokens_per_second=2)


@pytest.mark.parametrize("hw", [(240, 320), (360, 640), (100, 1000), (30, 40), (1080, 1920)])
def test_smart_resize_matches_transformers(hw):
    ours = smart_resize(*hw, factor=28, min_pixels=56 * 56, max_pixels=224 * 224)
    assert ours == hf_smart_resize(*hw, factor=28, min_pixels=56 * 56, max_pixels=224 * 224)


def random_frames(t, h, w, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(t, h // 8, w // 8, 3), dtype=np.uint8)
    return torch.from_numpy(np.repeat(np.repeat(base, 8, axis=1), 8, axis=2).copy())


@pytest.mark.parametrize("hw", [(240, 320), (144, 176)])
def test_patches_match_transformers_image_processor_frame_by_frame(hw):
    frames = random_frames(4, *hw)
    ours = preprocess_video(frames, SPEC)
    processor = Qwen2VLImageProcessorPil(min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels)
    gt, gh, gw = ours.grid_thw
    assert gt == 2
    # (gt, gh*gw, 3, tp, p, p): the tp axis holds the temporal patch's two frames.
    patches = ours.pixel_values.reshape(gt, gh * gw, 3, 2, 14, 14)
    for index in range(4):
        ref = processor(images=[frames[index].numpy()], return_tensors="pt")
        assert tuple(ref["image_grid_thw"][0].tolist()) == (1, gh, gw)
        # The image processor repeats one frame over both temporal slots.
        ref_patches = ref["pixel_values"].reshape(gh * gw, 3, 2, 14, 14)[:, :, 0]
        got = patches[index // 2, :, :, index % 2]
        # torch's uint8 bicubic follows PIL's fixed-point resampler to within rounding.
        one_step = 1 / 255 / min(CLIP_STD)
        assert (got - ref_patches).abs().max() <= 2 * one_step + 1e-5
        assert (got - ref_patches).abs().mean() < 0.05 * one_step


def test_no_resize_path_is_exact():
    frames = random_frames(2, 224, 224)
    ours = preprocess_video(frames, SPEC)
    ref = Qwen2VLImageProcessorPil(min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels)(
        images=[frames[0].numpy()], return_tensors="pt")
    got = ours.pixel_values.reshape(-1, 3, 2, 14, 14)[:, :, 0]
    torch.testing.assert_close(got, ref["pixel_values"].reshape(-1, 3, 2, 14, 14)[:, :, 0], rtol=0, atol=1e-5)


def test_odd_frame_count_repeats_last_frame():
    frames = random_frames(3, 224, 224)
    video = preprocess_video(frames, SPEC)
    assert video.frames == 4 and video.grid_thw == (2, 16, 16)
    patches = video.pixel_values.reshape(2, 256, 3, 2, 14, 14)
    torch.testing.assert_close(patches[1, :, :, 0], patches[1, :, :, 1])


def test_total_pixel_budget_shrinks_frames_of_long_videos():
    spec = VisionSpec(**{**SPEC.__dict__, "total_pixels": 20 * 112 * 112})
    short = preprocess_video(random_frames(2, 224, 224), spec)
    long = preprocess_video(random_frames(40, 224, 224), spec)
    assert long.resized_hw[0] * long.resized_hw[1] < short.resized_hw[0] * short.resized_hw[1]


def test_bad_frame_shapes_are_refused():
    with pytest.raises(VideoError):
        preprocess_video(torch.zeros((0, 10, 10, 3), dtype=torch.uint8), SPEC)
    with pytest.raises(VideoError):
        preprocess_video(torch.zeros((2, 1, 500, 3), dtype=torch.uint8), SPEC)

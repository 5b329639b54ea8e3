"""The vision encoder run on a subset of merge groups (motion-guided pruning)."""

import torch

from vidsight.vision import preprocess_video


def encode(adapter, frames, keep=None):
    video = preprocess_video(frames, adapter.vision)
    with torch.inference_mode():
        return adapter.encode_video(video.pixel_values, video.grid_thw, keep), video.grid_thw


def frames(n=4, height=224, width=224, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, height, width, 3), dtype=torch.uint8, generator=generator)


def test_keeping_everything_is_the_plain_encoder(tiny_adapter):
    clip = frames()
    full, grid = encode(tiny_adapter, clip)
    keep = torch.ones(grid[0], grid[1] // 2, grid[2] // 2, dtype=torch.bool)
    assert torch.equal(encode(tiny_adapter, clip, keep)[0], full)


def test_whole_frames_kept_encode_exactly_as_in_the_full_video(tiny_adapter):
    clip = frames(n=6)
    full, grid = encode(tiny_adapter, clip)
    keep = torch.zeros(grid[0], grid[1] // 2, grid[2] // 2, dtype=torch.bool)
    keep[1] = True  # attention never crosses frames: this temporal patch sees what it saw before
    per_patch = keep[0].numel()
    kept = encode(tiny_adapter, clip, keep)[0]
    assert kept.shape[0] == per_patch
    assert torch.allclose(kept, full[per_patch : 2 * per_patch], atol=1e-5)


def test_a_partial_mask_encodes_only_kept_groups_in_raster_order(tiny_adapter):
    clip = frames(n=4, height=280, width=336)  # several attention windows per frame
    full, grid = encode(tiny_adapter, clip)
    keep = torch.zeros(grid[0], grid[1] // 2, grid[2] // 2, dtype=torch.bool)
    keep[0, 1:3, 2:5] = True
    keep[1, 0, 0] = True
    out = encode(tiny_adapter, clip, keep)[0]
    assert out.shape == (int(keep.sum()), full.shape[1])
    # Pruned patches are not in the encoder at all: changing their pixels changes no kept output.
    changed = clip.clone()
    changed[0, 200:, 300:] = 255 - changed[0, 200:, 300:]  # a region outside every kept group of frame 0
    assert torch.allclose(encode(tiny_adapter, changed, keep)[0], out, atol=1e-6)

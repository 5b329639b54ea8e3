"""Several videos in one vision call equal each encoded alone."""

import torch

from vidsight.vision import preprocess_video


def test_videos_encoded_together_equal_each_alone(tiny_adapter):
    torch.manual_seed(0)
    spec = tiny_adapter.vision
    videos = []
    for frames, (height, width) in ((4, (112, 112)), (2, (112, 168)), (6, (84, 112))):
        rgb = torch.randint(0, 256, (frames, height, width, 3), dtype=torch.uint8)
        pixels = preprocess_video(rgb, spec, tiny_adapter.dtype, size=(height, width))
        videos.append((pixels.pixel_values, pixels.grid_thw))
    together = tiny_adapter.encode_videos(videos)
    for (pixels, grid), batched in zip(videos, together, strict=True):
        alone = tiny_adapter.encode_video(pixels, grid)
        assert batched.shape == alone.shape
        assert torch.allclose(batched, alone, atol=1e-5)
